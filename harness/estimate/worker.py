"""One rank of the estimate's measurement job (``torchrun --nproc-per-node TP -m harness.estimate.worker``).

The recipe's tensor-parallel group is real: TP ranks on gloo, sequence parallel on when TP > 1, so
MCore's own column/row-parallel layers, MLA's sequence-parallel scatter/gather and the shared
experts' sharding decide every per-rank width. Expert parallelism is emulated inside the rank: it
hosts all the recipe's experts with EP 1, and routes its own ``s/tp · b`` tokens to them. A rank of
the real EP group hosts ``E/EP`` experts and receives, under balanced routing, the same ``topk ·
s/tp · b`` token copies from the group, so the experts' retained bytes (sums over tokens) are the same;
only the per-expert split differs, which byte counts do not see.

Per row and layer kind (``measure_kinds``, also called in process by the tests) it measures one layer
forward at each probe sequence length (and, under MemTracker, one forward + backward for the layer's
transients, harness.estimate.layers; not for a hybrid model) and writes
``rank<r>.json`` into ``--out``: per kind, per row, the measurements; rejected rows with the
validator's message and rule; rows whose labels need Transformer Engine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cpu.bf16_gemm import bf16_gemms_on_fp32_kernels
from harness.cpu.deferred_compile import (
    defer_compile_before_megatron_core,
    run_compiled_helpers_eagerly,
)
from harness.errors import exception_summary
from harness.processes import die_with_parent

if TYPE_CHECKING:  # imports Megatron Core, which must come after the deferral in main()
    from harness.estimate.model import Architecture


@bf16_gemms_on_fp32_kernels()  # CPU adapter part 11, entered before MemTracker (its module doc)
def measure_kinds(
    arch: Architecture,
    rows: list[str],
    *,
    precision: str,
    attention_backend: str,
    micro_batch_size: int,
    seq_lengths: list[int],
    etp: int | None = None,
) -> dict[str, Any]:
    """Every layer kind of ``arch`` under every row, on this rank (model-parallel state set up):
    ``kinds`` and ``peaks`` (per kind, per row, one measurement per sequence length), ``rejected``
    rows (the validator's message and rule) and rows whose labels need Transformer Engine.

    A hybrid model gets no ``peaks``, so its rows get no peak moment: a Mamba layer's transients
    would be the CPU kernel stand-ins' (torch ops: 0.6 GB in backward at seq 64 for Nemotron 3
    Nano's mixer), not the Triton kernels' that run on a GPU (the stand-ins match those in what they
    save for backward only), and without them no moment of the stage can be placed; the other
    kinds' transients would cost ~40 s per length under MemTracker (128 experts) for nothing."""
    import warnings

    from harness.config.fields import RecomputeFields
    from harness.config.validate import MCORE_REJECTIONS, ConfigRejected
    from harness.cpu.adapter import transformer_engine_available
    from harness.estimate.layers import build_layer, measure_layer, measure_layer_peaks
    from harness.probe.measurement.status import requires_te_reason, te_only_labels_missing

    result: dict[str, Any] = {"kinds": {}, "rejected": {}, "requires_te": {}, "peaks": {}}
    for kind in arch.kinds:
        base = None
        per_row: dict[str, list[dict[str, Any]]] = {}
        peaks: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            fields = RecomputeFields.parse(row)
            if fields.granularity == "full":
                continue  # applied by TransformerBlock, not by a layer: reported as unmeasured
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    layer = build_layer(
                        arch,
                        fields,
                        kind,
                        precision=precision,
                        attention_backend=attention_backend,
                        etp=etp,
                        weights_from=base,
                    )
            except MCORE_REJECTIONS as exc:
                rejected = ConfigRejected.from_exception(exc)
                message = (
                    rejected.message.strip().splitlines()[0]
                    if rejected.message.strip()
                    else rejected.mcore_exception
                )
                result["rejected"][row] = {"message": message, "rule": rejected.rule}
                continue
            base = layer if base is None else base
            if "mlp" in (fields.modules or ()) and mlp_checkpoint_returns_bias(layer):
                result["rejected"][row] = MLP_BIAS_RECURSION
                continue
            missing = te_only_labels_missing(
                fields.modules or (), layer, transformer_engine_available()
            )
            if missing:
                result["requires_te"][row] = {
                    "labels": missing,
                    "reason": requires_te_reason(missing, layer),
                }
                if set(missing) == set(fields.modules or ()):
                    continue  # nothing of the row runs without TE: no measurement to make
            per_row[row] = [vars(measure_layer(layer, s, micro_batch_size)) for s in seq_lengths]
            if not arch.style.hybrid_pattern:
                peaks[row] = [
                    vars(measure_layer_peaks(layer, s, micro_batch_size)) for s in seq_lengths
                ]
        result["kinds"][kind] = per_row
        result["peaks"][kind] = peaks
    return result


# What MCore does with ``mlp`` recompute and linear biases (0.19.2, and Megatron-LM d98e8a64's):
# TransformerLayer checkpoints the MLP with tensor_parallel.checkpoint (no FP8), the MLP returns
# linear_fc2's bias parameter itself (added later by bias-dropout-add), and CheckpointFunction
# gives that returned parameter its own node: backward replays the MLP, hands the bias's gradient
# to torch.autograd.backward, which reaches the same node again: a recursion without end (seen
# here; the FP8 path, te_checkpoint, is another function; the probe's style models turn biases off
# for it, harness/models/style.py). Reported as a rejection, not measured.
MLP_BIAS_RECURSION = {
    "message": "with linear biases, MCore's checkpoint of the MLP returns linear_fc2's bias "
    "parameter and its backward re-enters itself (tensor_parallel/random.py CheckpointFunction)",
    "rule": "mlp-recompute-with-linear-bias",
}


def mlp_checkpoint_returns_bias(layer: Any) -> bool:
    """Whether ``mlp`` recompute of this layer takes the path above: a dense MLP whose output
    layer returns its bias, checkpointed without FP8."""
    from megatron.core.transformer.mlp import MLP

    mlp = getattr(layer, "mlp", None)
    config = layer.config
    return (
        isinstance(mlp, MLP)
        and getattr(mlp.linear_fc2, "bias", None) is not None
        and not (config.fp8 or config.fp4)
    )


def _run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from harness.cpu.adapter import init_cpu_parallel_state
    from harness.estimate.megatron_lm import parse_megatron_lm
    from harness.estimate.model import architecture
    from harness.run.recipes import load_recipe

    torch.set_num_threads(1)  # one rank per core
    if args.recipe is not None:
        recipe = load_recipe(args.recipe)
        arch, layout = architecture(recipe), recipe.parallelism
        precision, micro_batch_size = recipe.precision, recipe.micro_batch_size
    else:
        given = json.loads(args.megatron_lm)
        run = parse_megatron_lm(given["flags"], given["world_size"])
        arch, layout = run.arch, run.parallelism
        precision, micro_batch_size = run.precision, run.micro_batch_size
    init_cpu_parallel_state(tp=layout.tp, etp=layout.etp, timeout_s=args.timeout)
    return {
        "rank": dist.get_rank(),
        **measure_kinds(
            arch,
            json.loads(args.rows),
            precision=precision,
            attention_backend=args.attention_backend,
            micro_batch_size=micro_batch_size,
            seq_lengths=[int(s) for s in args.seqs.split(",")],
            etp=layout.etp,
        ),
        "layer_kinds": list(arch.layer_kinds),
        "model": arch.style.name,
        "source": arch.source,
    }


def main(argv: list[str]) -> int:
    # A rank whose torchrun agent is gone goes too: left running, it kept the agent's output pipes
    # open, so the harness waited on them past its timeout (seen on a loaded machine, 2026-12-02).
    die_with_parent()
    defer_compile_before_megatron_core()  # CPU adapter part 4
    run_compiled_helpers_eagerly()  # byte counts are the same
    parser = argparse.ArgumentParser(prog="harness.estimate.worker")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--recipe")
    source.add_argument(
        "--megatron-lm", help='JSON {"world_size": N, "flags": [...]}: a Megatron-LM argument list'
    )
    parser.add_argument("--rows", required=True, help="JSON list of row names")
    parser.add_argument("--seqs", required=True, help="comma-separated probe sequence lengths")
    parser.add_argument("--attention-backend", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    from harness.files import write_json_atomic

    try:
        result = _run(args)
    except Exception as failed:  # noqa: BLE001 (reported: torchrun would show only its banner)
        rank = int(os.environ.get("RANK", "0"))
        write_json_atomic(
            args.out / f"rank{rank}.json", {"rank": rank, "error": exception_summary(failed)}
        )
        return 1
    write_json_atomic(args.out / f"rank{result['rank']}.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
