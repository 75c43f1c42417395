"""``recompute-harness probe``: what each recompute label does on real Megatron Core layers, on CPU."""

from __future__ import annotations

import argparse
import json

from harness.commands.options import add_golden_dir
from harness.errors import EXIT_FAILED, EXIT_OK, UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.probe.isolate import DEFAULT_HANG_TIMEOUT_S  # light: no torch

    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--model", help="style model to probe (see --list)")
    target.add_argument("--all", action="store_true", help="probe every style model")
    target.add_argument("--list", action="store_true", help="list the style models and exit")
    parser.add_argument("--modules", nargs="+", metavar="LABELS",
                        help="label sets to probe against [] (a+b for a combination); default: every label, "
                             "the skill's combinations and full recompute")
    parser.add_argument("--seq-length", type=int, help="override the model's sequence length")
    parser.add_argument("--micro-batch-size", type=int, help="override the model's micro-batch size")
    parser.add_argument("--attribution", action="store_true", help="also print retained and carried bytes per module")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--hang-timeout", type=float, default=DEFAULT_HANG_TIMEOUT_S, metavar="S",
                        help="seconds an isolated probe may measure before it is killed and reported as a hang "
                             f"(default {DEFAULT_HANG_TIMEOUT_S:g})")
    golden = parser.add_mutually_exclusive_group()
    golden.add_argument("--check-golden", action="store_true",
                        help="compare with the CPU golden of the installed revision (exit 1 on any change)")
    golden.add_argument("--write-golden", action="store_true", help="write the CPU golden from this run")
    add_golden_dir(parser)


def _sizes(args: argparse.Namespace) -> dict[str, int]:
    """Model-size overrides, after refusing nonsense values and combinations."""
    sizes = {}
    for name in ("seq_length", "micro_batch_size"):
        value = getattr(args, name)
        if value is not None:
            if not 1 <= value <= 65536:
                raise UsageError(f"--{name.replace('_', '-')} must be in [1, 65536], got {value}")
            sizes[name] = value
    if sizes and (args.check_golden or args.write_golden):
        raise UsageError("goldens are for the models' own sizes: drop --seq-length/--micro-batch-size")
    if args.modules and (args.check_golden or args.write_golden):
        raise UsageError("goldens cover the full probe matrix: drop --modules")
    return sizes


def run(args: argparse.Namespace) -> int:
    from harness.models import STYLE_MODELS, style_model

    if args.list:
        for style in STYLE_MODELS.values():
            print(f"{style.name:<16} {style.description}")
        return EXIT_OK
    names = list(STYLE_MODELS) if args.all else [style_model(args.model).name]
    if not 0 < args.hang_timeout <= 600:
        raise UsageError(f"--hang-timeout must be in (0, 600] seconds, got {args.hang_timeout:g}")
    sizes = _sizes(args)

    from harness.probe.plan import parse_label_sets
    label_sets = parse_label_sets(args.modules) if args.modules else None

    from harness.probe.runner import probe_models
    from harness.probe.table import attribution_table, carried_table, probe_json, probe_table

    probes = probe_models(names, label_sets, hang_timeout_s=args.hang_timeout, **sizes)
    if args.json:
        print(json.dumps([probe_json(probe) for probe in probes], indent=2))
    else:
        for probe in probes:
            print(probe_table(probe))
            print()
            if args.attribution:
                print(attribution_table(probe))
                print()
                print(carried_table(probe))
                print()
    exit_code = EXIT_OK
    if args.write_golden or args.check_golden:
        from harness.probe.golden import check_probe_golden, write_probe_golden

        for probe in probes:
            if args.write_golden:
                print(f"wrote {write_probe_golden(probe, args.golden_dir)}")
                continue
            path, problems = check_probe_golden(probe, args.golden_dir)
            print(f"{probe.model}: {'matches' if not problems else 'DIFFERS from'} {path.name}")
            for problem in problems:
                print(f"  {problem}")
            exit_code = exit_code if not problems else EXIT_FAILED
    return exit_code
