"""The recompute labels the installed Megatron Core validator accepts, discovered from the validator.

Nothing here lists labels. Candidates are every quoted identifier in ``transformer_config.py`` plus
whatever MCore's unknown-label message names; each candidate is then put to the real validator as
``selective + [candidate]``. A candidate is unknown exactly when MCore answers with the same message
it gives a made-up sentinel label (with the name substituted), so the verdict does not depend on the
wording of that message, on how the allowed set is stored, or on other rules a label triggers
(``moe_act`` without grouped GEMM is rejected, but not as unknown).

A label manifest per source fingerprint (``harness.golden.labels``) pins the set.
"""

from __future__ import annotations

import re
from functools import lru_cache

from harness.config.revisions import megatron_core_root
from harness.errors import UsageError

_SENTINEL = "harness_sentinel_not_a_label"
_QUOTED_IDENTIFIER = re.compile(r"""["']([A-Za-z_][A-Za-z0-9_]*)["']""")


def _rejection(modules: list[str]) -> str | None:
    """MCore's message for ``selective + modules`` on the base model, or None when accepted."""
    from harness.config.validate import ConfigRejected, check_config

    try:
        check_config({"recompute_granularity": "selective", "recompute_modules": modules})
    except ConfigRejected as rejected:
        return rejected.message
    return None


def _candidates(unknown_message: str) -> set[str]:
    root = megatron_core_root()
    source = (root / "transformer" / "transformer_config.py").read_text() if root else ""
    return set(_QUOTED_IDENTIFIER.findall(source)) | set(
        _QUOTED_IDENTIFIER.findall(unknown_message)
    )


@lru_cache(maxsize=1)
def accepted_labels() -> frozenset[str]:
    """Every recompute label the installed validator accepts under selective granularity."""
    unknown_message = _rejection([_SENTINEL])
    if unknown_message is None or _SENTINEL not in unknown_message:
        raise UsageError(
            "the installed Megatron Core accepted a made-up recompute label (or did not name it when "
            f"rejecting it), so known labels cannot be told from unknown ones; MCore said: {unknown_message!r}"
        )
    return frozenset(
        label
        for label in _candidates(unknown_message) - {_SENTINEL}
        if _rejection([label]) != unknown_message.replace(_SENTINEL, label)
    )
