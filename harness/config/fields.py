"""The four recompute fields of Megatron Core's TransformerConfig, as one value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RecomputeFields:
    """``recompute_granularity``, ``recompute_modules``, ``recompute_method``, ``recompute_num_layers``.

    ``modules=None`` means "not set" (MCore then defaults selective to ``["core_attn"]``);
    ``modules=()`` is the explicit ``[]`` no-recompute control.
    """

    granularity: str | None = None
    modules: tuple[str, ...] | None = None
    method: str | None = None
    num_layers: int | None = None

    @classmethod
    def selective(cls, *modules: str) -> "RecomputeFields":
        return cls(granularity="selective", modules=tuple(modules))

    @classmethod
    def full(cls, method: str = "uniform", num_layers: int = 1) -> "RecomputeFields":
        return cls(granularity="full", method=method, num_layers=num_layers)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RecomputeFields":
        modules = data.get("recompute_modules")
        return cls(
            granularity=data.get("recompute_granularity"),
            modules=None if modules is None else tuple(modules),
            method=data.get("recompute_method"),
            num_layers=data.get("recompute_num_layers"),
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
        return kwargs

    def as_dict(self) -> dict[str, Any]:
        """The exact fields, as stored in run records and goldens."""
        return {
            "recompute_granularity": self.granularity,
            "recompute_modules": None if self.modules is None else list(self.modules),
            "recompute_method": self.method,
            "recompute_num_layers": self.num_layers,
        }

    @property
    def name(self) -> str:
        """Short row name: ``[]``, ``moe_act``, ``layernorm+moe_act``, ``full-uniform-1``, ``none``."""
        if self.granularity == "full":
            return f"full-{self.method}-{self.num_layers}"
        if self.granularity == "selective":
            if self.modules is None:
                return "selective-default"
            return "+".join(self.modules) if self.modules else "[]"
        return "none"
