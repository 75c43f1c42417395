"""Which layers a pipeline rank holds and how many micro-batches' activations it keeps at once.

From Megatron Core's schedules (``pipeline_parallel/schedules.py``, ``get_pp_rank_microbatches``): no
pipeline keeps one micro-batch; 1F1B keeps ``pp - rank`` (its warm-up forwards plus the one in
1F1B); the interleaved schedule runs ``(pp - rank - 1) * 2 + (vpp - 1) * group`` warm-up forwards of
model chunks (``group`` = ``microbatch_group_size_per_vp_stage``, MCore's default ``pp``) plus one,
chunk ``(k // group) % vpp`` for the k-th, capped at the ``micro-batches * vpp`` there are.
"""

from __future__ import annotations

from harness.run.recipes import Parallelism


def chunk_layers(
    layers: int, layout: Parallelism, stage: int, stage_layers: tuple[int, ...] | None = None
) -> list[list[int]]:
    """The decoder layers of each model chunk of ``stage``: MCore's even split, or with
    ``stage_layers`` (an uneven pipeline: layers per virtual stage ``v = chunk * PP + stage``, in
    that order) each chunk's own run."""
    vpp = layout.vpp or 1
    if stage_layers is not None:
        starts = [sum(stage_layers[:v]) for v in range(len(stage_layers))]
        return [
            list(range(starts[v], starts[v] + stage_layers[v]))
            for v in (c * layout.pp + stage for c in range(vpp))
        ]
    per_chunk = layers // (layout.pp * vpp)
    return [
        list(range((c * layout.pp + stage) * per_chunk, (c * layout.pp + stage + 1) * per_chunk))
        for c in range(vpp)
    ]


def in_flight_chunks(layout: Parallelism, stage: int, micro_batches: int) -> list[int]:
    """The model chunk of each micro-batch whose activations the stage holds at its fullest."""
    if layout.pp == 1:
        return [0]
    if layout.vpp is None:
        return [0] * min(layout.pp - stage, micro_batches)
    group = layout.pp
    total = micro_batches * layout.vpp
    warmup = (layout.pp - stage - 1) * 2 + (layout.vpp - 1) * group
    return [(k // group) % layout.vpp for k in range(min(warmup + 1, total))]
