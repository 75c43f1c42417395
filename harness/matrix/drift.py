"""The drift report of ``matrix --check``: what a reviewer must change after a Megatron Core bump.

Four findings, each named once:
- rules that can no longer fire on this revision: a validator rule whose message pattern matches no
  string literal in the MCore sources the fingerprint covers (the check was removed or reworded, or
  the label it guards is gone, as ``gdn_norm_out`` is on 0.18.2);
- labels the validator accepts that no rule names (a new label whose prerequisites the matrix does
  not know yet, as ``mhc`` on the development head);
- disagreements grouped by cause: one entry per (predicted rule, MCore's rule or unclassified
  message), with how many sampled configs hit it and one config minimised to a fixed point. An
  unclassified message is shown with the TransformerConfig fields it names and the files to edit;
- fields a recompute check of the validator reads that the configuration space cannot set
  (``harness.matrix.space.unreachable_fields``).
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.config import rules as rules_module
from harness.config.revisions import collect_revisions, fingerprint_sources, megatron_core_root
from harness.config.rule import UNCLASSIFIED
from harness.config.rules import RULES
from harness.config.validate import config_classes, config_defaults
from harness.matrix import space as space_module
from harness.matrix.check import Disagreement, compare, minimize
from harness.matrix.oracle import Oracle
from harness.matrix.space import Scenario, dimensions, sample_scenarios, unreachable_fields

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _project_path(module: object) -> str:
    """A module's file relative to the project (where a reviewer edits it)."""
    path = Path(module.__file__).resolve()  # type: ignore[attr-defined]
    return (
        path.relative_to(_PROJECT_ROOT).as_posix()
        if path.is_relative_to(_PROJECT_ROOT)
        else str(path)
    )


RULES_FILE = _project_path(rules_module)
SPACE_FILE = _project_path(space_module)


# Configurations ``matrix --check`` (and ``bump``) sample by default.
DEFAULT_CHECK_COUNT = 20_000
_PLACEHOLDER = "\0"  # stands for an f-string's ``{expression}`` in a source template


def _literal_text(node: ast.AST) -> str | None:
    """A string literal as a template: each f-string ``{expression}`` is a placeholder."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value
            if isinstance(part, ast.Constant) and isinstance(part.value, str)
            else _PLACEHOLDER
            for part in node.values
        )
    return None


def source_strings(root: Path) -> list[str]:
    """Every string literal (as a template) in the MCore files the fingerprint covers."""
    strings = []
    for relative in fingerprint_sources(root):
        tree = ast.parse((root / relative).read_text(encoding="utf-8", errors="replace"))
        strings += [text for node in ast.walk(tree) if (text := _literal_text(node)) is not None]
    return strings


def _can_say(pattern: re.Pattern[str], template: str) -> bool:
    """Whether MCore's message from ``template`` can match ``pattern``.

    A placeholder becomes each word the pattern itself spells (``selective`` for "When using
    recompute_granularity: {self.recompute_granularity} ...") or a neutral token (for ``\\S+``, ``.*``).
    """
    if _PLACEHOLDER not in template:
        return pattern.search(template) is not None
    words = set(_IDENTIFIER.findall(pattern.pattern)) | {"x"}
    return any(pattern.search(template.replace(_PLACEHOLDER, word)) for word in words)


@dataclass(frozen=True)
class DeadRule:
    rule: str
    message: str

    def report(self) -> str:
        return (
            f"{self.rule}: no string in this Megatron Core's sources matches its message /{self.message}/; "
            f"update or remove it in {RULES_FILE}"
        )


def dead_rules(root: Path | None = None) -> list[DeadRule]:
    """Validator rules whose message MCore can no longer produce (checked against its source literals)."""
    root = megatron_core_root() if root is None else root
    if root is None:
        return []
    strings = source_strings(root)
    dead = []
    for rule in RULES:
        if not (rule.message and rule.differential):
            continue
        pattern = re.compile(rule.message, re.DOTALL)
        # Only templates sharing a literal piece with the pattern can say it: the rest are skipped.
        pieces = [
            piece for piece in re.split(r"\\.|[.*+?()\[\]{}|^$]", rule.message) if len(piece) >= 6
        ]
        candidates = [
            text
            for text in strings
            if any(piece in text for piece in pieces)
            or any(
                len(part) >= 6 and part.strip() in rule.message for part in text.split(_PLACEHOLDER)
            )
        ]
        if not any(_can_say(pattern, text) for text in candidates):
            dead.append(DeadRule(rule.id, rule.message))
    return dead


def labels_without_rules(labels: Iterable[str]) -> list[str]:
    """Accepted labels that no rule names (in its condition or its message)."""
    texts = [f"{rule.condition} {rule.message or ''}" for rule in RULES]
    return sorted(
        label
        for label in labels
        if not any(
            re.search(rf"(?<![A-Za-z0-9_]){re.escape(label)}(?![A-Za-z0-9_])", text)
            for text in texts
        )
    )


def cause_of(disagreement: Disagreement) -> tuple[str, ...]:
    """What a disagreement is about: the rules on each side, or MCore's message when no rule knows it."""
    predicted, actual = disagreement.predicted, disagreement.actual
    if actual.rule == UNCLASSIFIED:
        return (
            "unclassified",
            (actual.message or "").strip().splitlines()[0] if actual.message else "",
        )
    if predicted.accepted and actual.accepted:
        if predicted.warning_rules != actual.warning_rules:
            return ("warnings", ",".join(predicted.warning_rules), ",".join(actual.warning_rules))
        return ("effective fields",)
    return ("verdict", predicted.rule or "accept", actual.rule or "accept")


@dataclass
class Cause:
    key: tuple[str, ...]
    example: Disagreement  # minimised to a fixed point
    count: int = 0

    def report(self) -> str:
        kind = self.key[0]
        if kind == "unclassified":
            headline = f"MCore rejects with a message no rule recognises [{UNCLASSIFIED}]"
        elif kind == "verdict":
            headline = f"matrix says {self.key[1]}, MCore says {self.key[2]}"
        elif kind == "warnings":
            headline = f"warnings differ: matrix [{self.key[1]}], MCore [{self.key[2]}]"
        else:
            headline = "both accept, with different effective recompute fields"
        lines = [
            f"{headline}: {self.count} sampled config(s); minimal one:",
            "  " + self.example.report(),
        ]
        if kind == "unclassified":
            named = fields_named(self.key[1])
            unknown = [name for name in named if not _in_space(name)]
            lines.append(
                f"  fields the message names: {', '.join(named) or '(none)'}"
                + (
                    f"; not in the matrix's configuration space: {', '.join(unknown)}"
                    if unknown
                    else ""
                )
            )
            lines.append(
                f"  edit: {RULES_FILE} (a rule whose message matches it, in __post_init__ order)"
                + (
                    f" and {SPACE_FILE} (an option that sets {', '.join(unknown)})"
                    if unknown
                    else ""
                )
            )
        return "\n".join(lines)


def fields_named(message: str) -> list[str]:
    """The TransformerConfig / MLATransformerConfig fields a validator message names, in order."""
    known: set[str] = set()
    for config_class in config_classes():
        known |= set(config_defaults(config_class))
    seen: list[str] = []
    for word in _IDENTIFIER.findall(message):
        if word in known and word not in seen:
            seen.append(word)
    return seen


def _in_space(field_name: str) -> bool:
    if field_name == "recompute_modules":  # every scenario sets it (``Scenario.modules``)
        return True
    return any(
        field_name in fields for options in dimensions().values() for fields in options.values()
    )


def minimize_fully(oracle: Oracle, found: Disagreement) -> Disagreement:
    """``minimize`` repeated until nothing more can go back to baseline (one pass can unlock another)."""
    current = minimize(oracle, found)
    while True:
        smaller = minimize(oracle, current)
        if smaller.scenario == current.scenario:
            return current
        current = smaller


def grouped_disagreements(scenarios: list[Scenario], oracle: Oracle) -> list[Cause]:
    """Disagreements grouped by cause, in first-seen order, each with one fully minimised config.

    The cause is read from the minimised disagreement (a sampled config can trip other rules on the
    way); a sampled disagreement is minimised only the first time its own verdicts are seen.
    """
    causes: dict[tuple[str, ...], Cause] = {}
    minimised_cause: dict[tuple[str, ...], tuple[str, ...]] = {}
    for scenario in scenarios:
        disagreement = compare(oracle, scenario)
        if disagreement is None:
            continue
        raw = cause_of(disagreement)
        if raw not in minimised_cause:
            minimal = minimize_fully(oracle, disagreement)
            minimised_cause[raw] = cause_of(minimal)
            causes.setdefault(minimised_cause[raw], Cause(minimised_cause[raw], minimal))
        causes[minimised_cause[raw]].count += 1
    return list(causes.values())


def drift_report(
    count: int = DEFAULT_CHECK_COUNT, seed: int = 0
) -> tuple[list[str], bool, dict[str, object]]:
    """The ``matrix --check`` report as lines, whether it found drift, and the same as JSON-ready data
    (``matrix --check`` and ``bump`` print it)."""
    oracle = Oracle()
    scenarios = sample_scenarios(count, oracle.labels, seed=seed)
    started = time.perf_counter()
    causes = grouped_disagreements(scenarios, oracle)
    dead = dead_rules()
    unruled = labels_without_rules(oracle.labels)
    unreachable = unreachable_fields()
    elapsed = time.perf_counter() - started
    mcore = collect_revisions()["megatron_core"]
    total = sum(cause.count for cause in causes)
    summary = {
        "checked": len(scenarios),
        "seed": seed,
        "megatron_core": mcore,
        "elapsed_s": round(elapsed, 3),
        "disagreements": total,
        "causes": [cause.report() for cause in causes],
        "dead_rules": [rule.report() for rule in dead],
        "labels_without_rules": list(unruled),
        "fields_out_of_space": [
            {"field": name, "read_by": list(where)} for name, where in unreachable.items()
        ],
    }
    lines = [
        (
            f"checked {len(scenarios)} configurations against megatron-core {mcore['version']} "
            f"(fingerprint {mcore['fingerprint']}) in {elapsed:.1f}s: {total} disagreements "
            f"({len(causes)} causes), {len(dead)} rules that can no longer fire, {len(unruled)} labels no rule names, "
            f"{len(unreachable)} fields out of the space"
        )
    ]
    if dead:
        lines.append("rules that can no longer fire on this revision:")
        lines += [f"  {rule.report()}" for rule in dead]
    if unruled:
        lines.append(
            f"labels the validator accepts that no rule names: {', '.join(unruled)} (add the rules MCore "
            f"enforces for them to {RULES_FILE}; the probe lists labels no style model exercises)"
        )
    if unreachable:
        lines.append(
            "fields a recompute check of the validator reads that the configuration space cannot set "
            f"(no listed option, no value its conditions compare it with; add an option to {SPACE_FILE}):"
        )
        lines += [f"  {name}: read by {', '.join(where)}" for name, where in unreachable.items()]
    lines += [f"cause {number}: {cause.report()}" for number, cause in enumerate(causes, 1)]
    return lines, bool(causes or dead or unruled or unreachable), summary
