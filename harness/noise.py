"""Known, harmless start-up noise of torch + Megatron Core without CUDA/TE, kept off the terminal.

Each entry is an exact message fragment; anything else still reaches the user. Only the command line
installs these filters (before torch is imported), so a library caller sees everything.
"""

from __future__ import annotations

import logging
import warnings

# logger name -> message fragment
_LOG_NOISE = {
    "torch.utils.cpp_extension": "No CUDA runtime is found",
    "megatron.core.models.gpt.gpt_model": "GPTModel IS DEPRECATED",  # logged once per model built
}
_WARNING_NOISE = (
    "Transformer Engine and Apex are not installed",
    "absl.logging is not installed",
)


class _DropFragment(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def silence_known_noise() -> None:
    for logger_name, fragment in _LOG_NOISE.items():
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _DropFragment) and f.fragment == fragment for f in logger.filters):
            logger.addFilter(_DropFragment(fragment))
    for fragment in _WARNING_NOISE:
        warnings.filterwarnings("ignore", message=f".*{fragment}")
