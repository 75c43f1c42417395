"""What a compatibility rule is (``Rule``): the constraint, where it is enforced, its source, and how the
differential check recognizes it; the rule table itself is ``harness.config.rules``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from harness.config.view import ConfigView

RuleOutcome = Literal["accept", "reject", "warn", "silently-ignored", "hang"]

VALIDATOR = "TransformerConfig validator"
LAYER_BUILD = "layer build"
RUNTIME = "runtime"
BRIDGE = "Bridge comm-overlap check"

SKILL = "SKILL.md Compatibility and Validation"
MCORE_CONFIG = "MCore transformer_config.py __post_init__"
MCORE_PARALLEL = "MCore model_parallel_config.py __post_init__"
MCORE_RECOMPUTE = "MCore recompute.py checkpointed_forward"
MCORE_LAYER = "MCore transformer_layer.py / moe_layer.py / mlp.py submodule build"

UNCLASSIFIED = "mcore.unclassified"  # a rejection whose message no rule recognizes

# Minimum Transformer Engine versions MCore demands (its own thresholds).
TE_MIN_FOR_FP8_OUTPUT_DISCARD = "2.6.0dev0"
TE_MIN_FOR_MOE_FP8 = "1.7.0.dev0"


@dataclass(frozen=True)
class Rule:
    id: str
    reads: tuple[str, ...]
    condition: str
    outcome: RuleOutcome
    enforced_in: str
    source: str
    predicate: Callable[[ConfigView], bool] | None = None
    message: str | None = None  # regex found in MCore's message (validator rules only)
    raises: str | None = None  # MCore's exception type: AssertionError rules vanish under python -O
    # Fields ``__post_init__`` rewrites when the rule fires; later rules see the rewritten values.
    rewrite: Callable[[ConfigView], dict[str, Any]] | None = None

    @property
    def differential(self) -> bool:
        """Checked against the real validator by ``matrix --check`` and the Hypothesis tests."""
        return self.predicate is not None
