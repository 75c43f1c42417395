"""``recompute-harness diff A B``: what recompute does differently in two Megatron Core trees.

Each side is probed in its own child process (``harness.probe.workers.tree_side``) with its tree first on
``PYTHONPATH``; both run at once. The report names labels added / removed, validator rules that
appeared / vanished (a rule "can fire" on a tree when one of its source strings can say the rule's
message: ``harness.matrix.drift.dead_rules``), ``TransformerConfig`` fields added / removed that the
recompute sources read (the recompute surface itself: Megatron-LM #4921's opt-in
``skip_final_recompute``), and per model and label every probe value that changed.
Two trees whose values are all equal are "same behaviour", whatever their fingerprints.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import harness
from harness.config.revisions import fingerprint_sources
from harness.config.rules import RULES
from harness.errors import UsageError
from harness.matrix.drift import dead_rules
from harness.processes import die_with_parent, exit_if_stopped, kill_group, libc_prctl
from harness.record.changes import ValueChange
from harness.record.metrics import MetricName

SIDE_TIMEOUT_S = 600.0
_POLL_S = 0.2
# Byte code of the trees being judged is cached here, never inside them.
PYCACHE = Path(
    os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "recompute-harness", "pycache"
)
# A probe row's values that a behaviour change moves (status and rule, the counts, bitwise verdicts).
ROW_VALUES = (
    "status",
    "rule",
    MetricName.RETAINED_BYTES,
    MetricName.BACKWARD_FLOPS,
    MetricName.REPLAY_BYTES,
    MetricName.REPLAY_OPS,
    MetricName.CARRIED_BYTES,
)


def core_of(tree: Path) -> Path:
    """``tree/megatron/core`` after checking it is a Megatron Core tree (else one line, exit 2)."""
    core = Path(tree) / "megatron" / "core"
    if not core.is_dir():
        raise UsageError(
            f"{tree}: holds no megatron/core (give a checkout, an exported tree or a site-packages)"
        )
    fingerprint_sources(core)  # IdentityError (exit 2) when the validator or random.py is missing
    return core


def _side_env(tree: Path) -> dict[str, str]:
    """This environment with ``tree`` first on PYTHONPATH and the harness importable after it; byte
    code goes to a cache of its own, so nothing is written into the tree being judged."""
    harness_parent = str(Path(harness.__file__).resolve().parent.parent)
    rest = [part for part in os.environ.get("PYTHONPATH", "").split(os.pathsep) if part]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), *rest, harness_parent]),
        "PYTHONPYCACHEPREFIX": str(PYCACHE),
    }


@dataclass
class _Side:
    tree: Path
    process: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]

    def output(self) -> tuple[str, str]:
        for stream in (self.stdout, self.stderr):
            stream.seek(0)
        return (
            self.stdout.read().decode(errors="replace"),
            self.stderr.read().decode(errors="replace"),
        )


def _start(tree: Path, attention_backend: str, models: list[str]) -> _Side:
    exit_if_stopped()
    libc_prctl()  # loaded before the fork that runs die_with_parent
    # Files, not pipes: a side's JSON outgrows a pipe while the other side is being waited for.
    stdout = tempfile.TemporaryFile()  # noqa: SIM115 - closed by describe_trees, with the child
    stderr = tempfile.TemporaryFile()  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.probe.workers.tree_side",
            "--attention-backend",
            attention_backend,
            *(word for model in models for word in ("--model", model)),
        ],
        stdout=stdout,
        stderr=stderr,
        env=_side_env(tree),
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509
    )
    return _Side(tree, process, stdout, stderr)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def describe_trees(
    trees: tuple[Path, Path],
    attention_backend: str = "unfused",
    models: list[str] | None = None,
    timeout_s: float = SIDE_TIMEOUT_S,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both sides' descriptions, probed at once; ``UsageError`` naming the first side that cannot be
    probed (the other is stopped then, not waited for)."""
    sides = [_start(tree, attention_backend, models or []) for tree in trees]
    deadline = time.monotonic() + timeout_s
    try:
        while any(side.process.poll() is None for side in sides):
            exit_if_stopped()
            for side in sides:
                if side.process.poll() not in (None, 0):
                    _, stderr = side.output()
                    raise UsageError(
                        f"{side.tree}: this Megatron Core cannot be probed "
                        f"(exit {side.process.returncode}): {_last_line(stderr)}"
                    )
            if time.monotonic() > deadline:
                raise UsageError(f"{trees[0]} / {trees[1]}: a probe ran past {timeout_s:.0f} s")
            time.sleep(_POLL_S)
        described = []
        for side in sides:
            stdout, stderr = side.output()
            if side.process.returncode != 0:
                raise UsageError(
                    f"{side.tree}: this Megatron Core cannot be probed "
                    f"(exit {side.process.returncode}): {_last_line(stderr)}"
                )
            try:
                described.append(json.loads(stdout.strip().splitlines()[-1]))
            except (json.JSONDecodeError, IndexError):
                raise UsageError(
                    f"{side.tree}: its probe printed no description: {_last_line(stderr)}"
                ) from None
        return described[0], described[1]
    finally:
        for side in sides:
            if side.process.poll() is None:
                kill_group(side.process.pid)
                side.process.wait()
            side.stdout.close()
            side.stderr.close()


def firing_rules(core: Path) -> set[str]:
    """The compatibility rules whose message this tree's sources can still say."""
    return {rule.id for rule in RULES if rule.message and rule.differential} - {
        dead.rule for dead in dead_rules(core)
    }


CONFIG_SOURCE = "transformer/transformer_config.py"


def config_fields(core: Path) -> set[str]:
    """The fields ``TransformerConfig`` declares in this tree (its class body's annotated names)."""
    module = ast.parse((core / CONFIG_SOURCE).read_text(encoding="utf-8", errors="replace"))
    return {
        statement.target.id
        for node in module.body
        if isinstance(node, ast.ClassDef) and node.name == "TransformerConfig"
        for statement in node.body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    }


def recompute_readers(core: Path, name: str) -> list[str]:
    """The recompute sources (those the fingerprint covers) other than the config itself that name
    the field (``config.<name>``, ``getattr(config, "<name>", ...)``)."""
    reads = re.compile(rf"\bconfig\.{re.escape(name)}\b|\bconfig\s*,\s*[\"']{re.escape(name)}[\"']")
    return [
        relative
        for relative in fingerprint_sources(core)
        if relative != CONFIG_SOURCE
        and reads.search((core / relative).read_text(encoding="utf-8", errors="replace"))
    ]


def recompute_field_changes(a: Path, b: Path) -> tuple[list[str], list[str]]:
    """(added, removed) ``TransformerConfig`` fields that the recompute sources of the tree holding
    them read, each as ``name (read by file, ...)``."""
    fields = config_fields(a), config_fields(b)

    def read(core: Path, names: set[str]) -> list[str]:
        return [
            f"{name} (read by {', '.join(readers)})"
            for name in sorted(names)
            if (readers := recompute_readers(core, name))
        ]

    return read(b, fields[1] - fields[0]), read(a, fields[0] - fields[1])


def _not_bitwise(equivalence: dict[str, Any] | None) -> int | None:
    if equivalence is None:
        return None
    return equivalence["differing_grads"] + (0 if equivalence["loss_equal"] else 1)


def _row_values(row: dict[str, Any]) -> dict[str, Any]:
    values = {key: row.get(key) for key in ROW_VALUES}
    values[MetricName.NOT_BITWISE_VALUES] = _not_bitwise(row.get("equivalence"))
    values[MetricName.DROPOUT_NOT_BITWISE_VALUES] = _not_bitwise(row.get("dropout_equivalence"))
    return values


def _rows(probe: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        row["label"] + (" (+bias)" if row.get("add_bias_linear") else ""): _row_values(row)
        for row in probe["rows"]
    }


def value_changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[ValueChange]:
    """Every probe value that differs between the sides (a whole row or model present on one side
    only is a ``row`` change of label ``*`` or of the row's label)."""
    old = {probe["model"]: _rows(probe) for probe in before}
    new = {probe["model"]: _rows(probe) for probe in after}
    changes = []
    for model in sorted(set(old) | set(new)):
        if model not in new or model not in old:
            sides = ("present", "absent") if model not in new else ("absent", "present")
            changes.append(ValueChange(model, model, "*", "model", *sides))
            continue
        for label in [*old[model], *(label for label in new[model] if label not in old[model])]:
            a, b = old[model].get(label), new[model].get(label)
            if a is None or b is None:
                sides = ("present", "missing") if b is None else ("absent", "present")
                changes.append(ValueChange(model, model, label, "row", *sides))
                continue
            changes += [
                ValueChange(model, model, label, key, a[key], b[key])
                for key in a
                if a[key] != b[key]
            ]
    return changes


@dataclass
class TreeDiff:
    sides: tuple[dict[str, Any], dict[str, Any]]
    labels_added: list[str] = field(default_factory=list)
    labels_removed: list[str] = field(default_factory=list)
    rules_appeared: list[str] = field(default_factory=list)
    rules_vanished: list[str] = field(default_factory=list)
    changes: list[ValueChange] = field(default_factory=list)
    fields_added: list[str] = field(default_factory=list)
    fields_removed: list[str] = field(default_factory=list)

    @property
    def probed(self) -> list[str]:
        """What both sides were probed on: ``model (precision, back end core attention)``."""
        return [
            f"{probe['model']} ({probe['precision']}, {probe['attention_backend']} core attention)"
            for probe in self.sides[0]["probes"]
        ]

    @property
    def changed(self) -> bool:
        return bool(
            self.labels_added
            or self.labels_removed
            or self.rules_appeared
            or self.rules_vanished
            or self.changes
            or self.fields_added
            or self.fields_removed
        )

    def lines(self) -> list[str]:
        def who(side: dict[str, Any]) -> str:
            identity = side["identity"]
            commit = f", commit {identity['commit'][:12]}" if identity.get("commit") else ""
            return (
                f"megatron-core {identity['version']}{commit}, fingerprint {identity['fingerprint']} "
                f"({identity['root']})"
            )

        out = [f"A: {who(self.sides[0])}", f"B: {who(self.sides[1])}"]
        out += [
            f"B's CPU adapter: a replaced upstream object changed since review: {line}"
            for line in self.sides[1]["adapter_drift"]
        ]
        out.append(f"probed: {', '.join(self.probed) if self.probed else 'nothing'}")
        for what, items in (
            ("labels added", self.labels_added),
            ("labels removed", self.labels_removed),
            ("rules appeared", self.rules_appeared),
            ("rules vanished", self.rules_vanished),
            ("recompute config fields added", self.fields_added),
            ("recompute config fields removed", self.fields_removed),
        ):
            out.append(f"{what}: {', '.join(items) if items else 'none'}")
        out.append(f"probe values changed: {len(self.changes)}")
        out += [f"  {change.line()}" for change in self.changes]
        same = self.sides[0]["identity"]["fingerprint"] == self.sides[1]["identity"]["fingerprint"]
        if self.changed:
            out.append("verdict: behaviour changed")
        else:
            out.append(
                "verdict: same behaviour"
                + (
                    " (identical recompute sources)"
                    if same
                    else " (new fingerprint, no value changed)"
                )
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.sides[0]["identity"],
            "b": self.sides[1]["identity"],
            "probed": self.probed,
            "labels_added": self.labels_added,
            "labels_removed": self.labels_removed,
            "rules_appeared": self.rules_appeared,
            "rules_vanished": self.rules_vanished,
            "changes": [change.line() for change in self.changes],
            "recompute_config_fields_added": self.fields_added,
            "recompute_config_fields_removed": self.fields_removed,
            "same_behaviour": not self.changed,
        }


def diff_trees(
    a: Path, b: Path, attention_backend: str = "unfused", models: list[str] | None = None
) -> TreeDiff:
    """Probe both trees (every style model, or ``models``) and compare them (``UsageError`` when
    either is not a probeable tree)."""
    cores = core_of(a), core_of(b)
    rules = firing_rules(cores[0]), firing_rules(cores[1])
    sides = describe_trees((Path(a), Path(b)), attention_backend, models)
    labels = set(sides[0]["labels"]), set(sides[1]["labels"])
    return TreeDiff(
        sides,
        sorted(labels[1] - labels[0]),
        sorted(labels[0] - labels[1]),
        sorted(rules[1] - rules[0]),
        sorted(rules[0] - rules[1]),
        value_changes(sides[0]["probes"], sides[1]["probes"]),
        *recompute_field_changes(*cores),
    )
