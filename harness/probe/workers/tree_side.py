"""One side of ``recompute-harness diff``: run in a child process whose ``PYTHONPATH`` puts a Megatron
Core tree first, it prints (JSON on stdout) what that tree does: its identity, the labels its
validator accepts, and a probe of every style model. A tree on which the CPU adapter fails its
self-check is refused (one line on stderr, exit 2): its numbers would not be Megatron Core's.

``python -m harness.probe.workers.tree_side [--attention-backend unfused|fused] [--model NAME ...]``
"""

from __future__ import annotations

import json
import sys

from harness.cpu.deferred_compile import defer_compile_before_megatron_core
from harness.errors import EXIT_USAGE
from harness.noise import silence_known_noise


def describe_tree(attention_backend: str, models: list[str] | None = None) -> dict:
    """Identity, accepted labels and every style model's probe rows of the imported Megatron Core."""
    from harness.config.labels import accepted_labels
    from harness.config.revisions import megatron_core_identity
    from harness.cpu.adapter import init_cpu_parallel_state, replaced_drift
    from harness.cpu.self_check import self_check_problems
    from harness.models import buildable_models
    from harness.probe.present.table import probe_json
    from harness.probe.runner import probe_models

    init_cpu_parallel_state()
    problems = self_check_problems()
    identity = megatron_core_identity()
    return {
        "identity": {key: identity[key] for key in ("root", "version", "commit", "fingerprint")},
        "self_check": problems,
        "adapter_drift": replaced_drift(),
        "labels": sorted(accepted_labels()),
        "probes": []
        if problems
        else [
            probe_json(probe)
            for probe in probe_models(
                models or buildable_models(), attention_backend=attention_backend
            )
        ],
    }


def main(argv: list[str]) -> int:
    defer_compile_before_megatron_core()
    silence_known_noise()
    # Written by harness.compare.tree_diff, not by a user: pairs of option and value.
    options = list(zip(argv[::2], argv[1::2], strict=True))
    backend = next((value for name, value in options if name == "--attention-backend"), "unfused")
    models = [value for name, value in options if name == "--model"]
    described = describe_tree(backend, models or None)
    print(json.dumps(described))
    if described["self_check"]:
        print(
            "the CPU adapter fails its self-check here: " + "; ".join(described["self_check"]),
            file=sys.stderr,
        )
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
