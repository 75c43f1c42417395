"""The recompute fields of Megatron Core's TransformerConfig, as one value, and the row syntax.

The four every revision has, plus ``skip_final_recompute`` (Megatron-LM #4921: the final
full-recompute unit of each stage runs plainly) where a revision's TransformerConfig declares it.
A row name (``[]``, ``moe_act``, ``layernorm+moe_act``, ``full-uniform-1``,
``full-block-2-skip-final``, ``none``, ``selective-default``) is ``RecomputeFields.name``; ``RecomputeFields.parse`` reads it back. Both
directions live here and nowhere else; ``require_known`` is the one check that a name's labels are
ones the installed validator accepts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.errors import UsageError
from harness.typed_json import rules

CONTROL_ROW = "[]"
_FULL_PREFIX = "full-"
SKIP_FINAL_FIELD = "skip_final_recompute"
_SKIP_FINAL_SUFFIX = "-skip-final"
# How much wider than any label list a full-layer boundary counts (it replays every module).
FULL_WIDTH = 1_000


@dataclass(frozen=True)
class RecomputeFields:
    """``recompute_granularity``, ``recompute_modules``, ``recompute_method``, ``recompute_num_layers``
    and, set only where a revision has it, ``skip_final_recompute``.

    ``modules=None`` means "not set" (MCore then defaults selective to ``["core_attn"]``);
    ``modules=()`` is the explicit ``[]`` no-recompute control.
    """

    # In JSON (records, goldens) the four keys are required, each under Megatron Core's name.
    granularity: str | None = field(
        default=None, metadata=rules(key="recompute_granularity", required=True)
    )
    modules: tuple[str, ...] | None = field(
        default=None, metadata=rules(key="recompute_modules", required=True, unique=True)
    )
    method: str | None = field(default=None, metadata=rules(key="recompute_method", required=True))
    num_layers: int | None = field(
        default=None, metadata=rules(key="recompute_num_layers", required=True, minimum=0)
    )
    # Optional in JSON and in TransformerConfig's keywords: written only when set, so records and
    # goldens from before it load unchanged and revisions without the field are never handed it.
    skip_final: bool = field(default=False, metadata=rules(key=SKIP_FINAL_FIELD))

    @classmethod
    def selective(cls, *modules: str) -> RecomputeFields:
        return cls(granularity="selective", modules=tuple(modules))

    @classmethod
    def full(
        cls, method: str = "uniform", num_layers: int = 1, *, skip_final: bool = False
    ) -> RecomputeFields:
        return cls(granularity="full", method=method, num_layers=num_layers, skip_final=skip_final)

    @classmethod
    def parse(cls, name: str) -> RecomputeFields:
        """The inverse of ``name``: ``[]``, ``a+b``, ``full-<method>-<layers>[-skip-final]``, ``none``,
        ``selective-default``."""
        if name == CONTROL_ROW:
            return cls.selective()
        if name == "none":
            return cls()
        if name == "selective-default":
            return cls(granularity="selective")
        if name.startswith(_FULL_PREFIX):
            body = name[len(_FULL_PREFIX) :]
            skip_final = body.endswith(_SKIP_FINAL_SUFFIX)
            body = body.removesuffix(_SKIP_FINAL_SUFFIX)
            method, _, count = body.rpartition("-")
            if not method or not count.isdigit():
                raise UsageError(
                    f"row {name!r}: full rows are spelled full-<method>-<layers>[-skip-final], "
                    "e.g. full-uniform-1"
                )
            return cls.full(method=method, num_layers=int(count), skip_final=skip_final)
        return cls.selective(*parse_labels(name, "+", f"row {name!r}"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecomputeFields:
        modules = data.get("recompute_modules")
        return cls(
            granularity=data.get("recompute_granularity"),
            modules=None if modules is None else tuple(modules),
            method=data.get("recompute_method"),
            num_layers=data.get("recompute_num_layers"),
            skip_final=bool(data.get(SKIP_FINAL_FIELD, False)),
        )

    def as_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``TransformerConfig`` (``recompute_modules`` omitted when unset)."""
        kwargs: dict[str, Any] = {
            "recompute_granularity": self.granularity,
            "recompute_method": self.method,
            "recompute_num_layers": self.num_layers,
        }
        if self.modules is not None:
            kwargs["recompute_modules"] = list(self.modules)
        if self.skip_final:
            kwargs[SKIP_FINAL_FIELD] = True
        return kwargs

    def as_dict(self) -> dict[str, Any]:
        """The exact fields, as stored in run records and goldens."""
        fields: dict[str, Any] = {
            "recompute_granularity": self.granularity,
            "recompute_modules": None if self.modules is None else list(self.modules),
            "recompute_method": self.method,
            "recompute_num_layers": self.num_layers,
        }
        if self.skip_final:
            fields[SKIP_FINAL_FIELD] = True
        return fields

    @property
    def is_control(self) -> bool:
        """The skill's matched no-recompute control: selective granularity with an empty module list."""
        return self.granularity == "selective" and self.modules == ()

    @property
    def width(self) -> int:
        """How broad a boundary is: [] < one label < two labels < ... < full-layer recompute."""
        return FULL_WIDTH if self.granularity == "full" else len(self.modules or ())

    @property
    def name(self) -> str:
        """Short row name: ``[]``, ``moe_act``, ``layernorm+moe_act``, ``full-uniform-1``, ``none``."""
        if self.granularity == "full":
            suffix = _SKIP_FINAL_SUFFIX if self.skip_final else ""
            return f"full-{self.method}-{self.num_layers}{suffix}"
        if self.granularity == "selective":
            if self.modules is None:
                return "selective-default"
            return "+".join(self.modules) if self.modules else "[]"
        return "none"


def parse_labels(text: str, separator: str, what: str) -> tuple[str, ...]:
    """Labels joined by ``separator``; every label non-empty, without spaces (syntax only)."""
    labels = tuple(text.split(separator))
    if not all(label and label == label.strip() and " " not in label for label in labels):
        raise UsageError(
            f"{what}: expected [] or labels joined by {separator!r} (non-empty, no spaces), "
            f"e.g. layernorm{separator}moe_act"
        )
    return labels


def require_known(labels: Iterable[str], known: frozenset[str], what: str) -> None:
    """Refuse labels the installed Megatron Core validator does not accept (one line, exit 2)."""
    unknown = sorted(set(labels) - known)
    if unknown:
        raise UsageError(
            f"{what}: unknown recompute label(s) {', '.join(unknown)} for this Megatron Core; "
            f"known: {', '.join(sorted(known))}"
        )
