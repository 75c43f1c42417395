"""What a matrix predicate sees: a configuration's fields as Megatron Core resolves them.

Predicates read the fields a user passed, falling back to the config class's declared defaults, with
the two normalizations MCore applies before any recompute rule runs: unset ``recompute_modules``
becomes ``["core_attn"]`` and ``cuda_graph_modules`` becomes a set of scope names ("full" = the
empty set = whole-layer capture).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version


class ConfigView:
    """Attribute access to a configuration for the matrix's predicates."""

    def __init__(
        self,
        fields: Mapping[str, Any],
        defaults: Mapping[str, Any],
        accepted_labels: frozenset[str],
        te_version: str | None,
    ) -> None:
        self._fields = fields
        self._defaults = defaults
        self.accepted_labels = accepted_labels
        modules = self["recompute_modules"]
        self.modules: list[str] = ["core_attn"] if modules is None else list(modules)
        self.granularity = self["recompute_granularity"]
        self.te_version = Version(te_version or "0.0.0")
        self.cuda_graph_modules = _cuda_graph_scope_names(self["cuda_graph_modules"])
        self.cuda_graph_impl = self["cuda_graph_impl"]
        # An empty per-layer scope captures the whole layer, as does full-iteration capture.
        self.whole_layer_graphed = (
            self.cuda_graph_impl == "full_iteration" or not self.cuda_graph_modules
        )
        experts = self["num_moe_experts"]
        self.is_moe = experts is not None and experts > 1

    def with_fields(self, overrides: Mapping[str, Any]) -> ConfigView:
        """The view after ``__post_init__`` rewrote some fields."""
        return ConfigView(
            {**self._fields, **overrides},
            self._defaults,
            self.accepted_labels,
            str(self.te_version),
        )

    def __getitem__(self, name: str) -> Any:
        return self._fields[name] if name in self._fields else self._defaults[name]

    def optional(self, name: str) -> Any:
        """A field newer than the oldest supported revision: ``None`` where this revision lacks it."""
        return self[name] if name in self._fields or name in self._defaults else None

    def selective(self, label: str) -> bool:
        """``label`` is requested under selective granularity."""
        return self.granularity == "selective" and label in self.modules

    def te_at_least(self, version: str) -> bool:
        """Transformer Engine is installed at ``version`` or later (absent counts as 0.0.0, as MCore does)."""
        return self.te_version >= Version(version)

    def graphed(self, scope: str) -> bool:
        """The CUDA graph scope ``scope`` is captured (directly or by whole-layer capture)."""
        return self.whole_layer_graphed or scope in self.cuda_graph_modules


def _cuda_graph_scope_names(value: Any) -> frozenset[str]:
    if value is None or value == "full" or value == ["full"]:
        return frozenset()
    items = (
        value.split(",")
        if isinstance(value, str)
        else value
        if isinstance(value, list)
        else [value]
    )
    return frozenset(getattr(item, "name", item) for item in items if item)
