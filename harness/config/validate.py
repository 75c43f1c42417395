"""Run the real Megatron Core validator and report its verdict in the harness's terms.

MCore rejects recompute configurations with ``AssertionError`` in some rules and ``ValueError`` in
others. ``check_config`` normalizes both into ``ConfigRejected`` carrying a stable rule id from the
compatibility matrix (matched on MCore's message) and MCore's original message, so callers never
depend on which exception type a rule happens to use in a given MCore revision.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from harness.config.fields import RecomputeFields
from harness.config.rules import rule_for_message, warning_rules_for

# Megatron Core rejects recompute configurations with AssertionError in some rules and ValueError in
# others (which one varies between revisions), and a combination it does not support yet with
# NotImplementedError (the head's mHC under full recompute; MLA's output gate): these, and nothing
# else, are a validator verdict.
MCORE_REJECTIONS: tuple[type[Exception], ...] = (AssertionError, ValueError, NotImplementedError)


def refused_at_run_time(exc: BaseException) -> bool:
    """An ``AssertionError`` raised by Megatron Core's own code: a configuration check it makes at
    run time rather than in its validator (e.g. MTP under full recompute wants recompute_num_layers
    1), a refusal like ``MCORE_REJECTIONS``, not a failure of the run."""
    if not isinstance(exc, AssertionError) or exc.__traceback__ is None:
        return False
    frame = exc.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    return "/megatron/core/" in frame.tb_frame.f_code.co_filename.replace("\\", "/")


# Smallest model every config is built on; any field can be overridden. Four layers so that PP=2 and
# recompute_num_layers up to 2 stay meaningful; four heads so that TP=2 divides them.
BASE_MODEL: dict[str, Any] = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4}


class ConfigRejected(Exception):
    """The real validator rejected a configuration."""

    def __init__(
        self, rule: str, message: str, mcore_exception: str, warning_rules: tuple[str, ...]
    ) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule
        self.message = message
        self.mcore_exception = mcore_exception  # "AssertionError" or "ValueError"
        self.warning_rules = warning_rules  # warn-rules MCore emitted before rejecting

    @classmethod
    def from_exception(cls, exc: Exception, warning_rules: tuple[str, ...] = ()) -> ConfigRejected:
        """The verdict carried by one of ``MCORE_REJECTIONS`` (the matrix rule is matched on its message)."""
        return cls(rule_for_message(str(exc)), str(exc), type(exc).__name__, warning_rules)


@dataclass(frozen=True)
class Verdict:
    """What the real validator said about one configuration."""

    accepted: bool
    rule: str | None  # matrix rule id of the rejection; None when accepted
    message: str | None  # MCore's original message
    mcore_exception: str | None
    warning_rules: tuple[str, ...]  # matrix warn-rules whose warnings MCore emitted
    effective: RecomputeFields | None  # recompute fields after MCore's post-init

    def as_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "rule": self.rule,
            "message": self.message,
            "effective": None if self.effective is None else self.effective.as_dict(),
        }


@lru_cache(maxsize=1)
def config_classes() -> tuple[type, type]:
    """``(TransformerConfig, MLATransformerConfig)``, imported on first use (torch is slow to load)."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    return TransformerConfig, MLATransformerConfig


def config_class_for(fields: Mapping[str, Any]) -> type:
    """MLA models validate through ``MLATransformerConfig``, everything else ``TransformerConfig``."""
    transformer, mla = config_classes()
    return mla if fields.get("multi_latent_attention") else transformer


def config_has_field(name: str) -> bool:
    """Whether the installed ``TransformerConfig`` declares ``name`` (fields newer than the oldest
    supported revision, e.g. ``skip_final_recompute``, are measured only where they exist)."""
    return name in config_defaults(config_classes()[0])


@cache
def config_defaults(config_class: type) -> dict[str, Any]:
    """Declared default of every field of ``config_class`` (before ``__post_init__`` runs)."""
    defaults: dict[str, Any] = {}
    for field in dataclasses.fields(config_class):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return defaults


def check_config(fields: Mapping[str, Any]) -> tuple[Any, tuple[str, ...]]:
    """Build the real config from ``BASE_MODEL`` + ``fields``; return it with the warn-rule ids seen.

    Raises ``ConfigRejected`` when MCore rejects it. Other exceptions (a ``TypeError`` from a field
    of the wrong type) are not verdicts and propagate.
    """
    kwargs = {**BASE_MODEL, **fields}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            config = config_class_for(kwargs)(**kwargs)
        except MCORE_REJECTIONS as exc:
            raise ConfigRejected.from_exception(
                exc, warning_rules_for(str(w.message) for w in caught)
            ) from exc
    return config, warning_rules_for(str(w.message) for w in caught)


def validate(fields: Mapping[str, Any]) -> Verdict:
    """The real validator's verdict on ``BASE_MODEL`` + ``fields``."""
    try:
        config, warning_rules = check_config(fields)
    except ConfigRejected as rejected:
        return Verdict(
            False,
            rejected.rule,
            rejected.message,
            rejected.mcore_exception,
            rejected.warning_rules,
            None,
        )
    effective = RecomputeFields(
        granularity=config.recompute_granularity,
        modules=None if config.recompute_modules is None else tuple(config.recompute_modules),
        method=config.recompute_method,
        num_layers=config.recompute_num_layers,
    )
    return Verdict(True, None, None, None, warning_rules, effective)
