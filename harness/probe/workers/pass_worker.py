"""A probe pass worker: ``python -m harness.probe.workers.pass_worker --options JSON`` (started by
``harness.probe.workers.passes``). It imports torch and Megatron Core once, then takes passes from its stdin,
one JSON line each (``{"model": ..., "precision": ..., "attention_backend": ...}``), and answers each with one line on stdout:
``RESULT {probe --json of the pass}``, or ``USAGE <message>`` when the pass is bad input. It ends at
the end of its stdin. Anything else it prints (Megatron Core's own output) is not read."""

from __future__ import annotations

import argparse
import json
import sys

from harness.cpu.deferred_compile import defer_compile_before_megatron_core
from harness.noise import silence_known_noise

RESULT, USAGE = "RESULT ", "USAGE "


def main(argv: list[str]) -> int:
    defer_compile_before_megatron_core()  # CPU adapter part 4
    silence_known_noise()
    parser = argparse.ArgumentParser(prog="harness.probe.workers.pass_worker")
    parser.add_argument("--options", required=True, help="probe_models keyword arguments, JSON")
    options = json.loads(parser.parse_args(argv).options)
    if options.get("label_sets") is not None:
        options["label_sets"] = [tuple(labels) for labels in options["label_sets"]]

    from harness.errors import UsageError
    from harness.probe.present.table import probe_json
    from harness.probe.runner import probe_models

    for line in sys.stdin:
        task = json.loads(line)
        try:
            (probe,) = probe_models(
                [task["model"]],
                precision=task["precision"],
                **{**options, "attention_backend": task["attention_backend"]},
            )
        except UsageError as exc:
            print(USAGE + str(exc).replace("\n", " "), flush=True)
            continue
        print(RESULT + json.dumps(probe_json(probe)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
