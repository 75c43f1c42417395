"""Micro-batches in flight per pipeline stage, as Megatron Core's schedules run them."""

from __future__ import annotations

from harness.plan.schedule import chunk_layers, in_flight_chunks
from harness.run.recipes import Parallelism


def test_no_pipeline_keeps_one_micro_batch():
    assert in_flight_chunks(Parallelism(), 0, 16) == [0]


def test_1f1b_keeps_pp_minus_rank_micro_batches():
    # warm-up pp - rank - 1 forwards, then one in 1F1B (forward_backward_pipelining_without_interleaving)
    assert [len(in_flight_chunks(Parallelism(pp=4), s, 16)) for s in range(4)] == [4, 3, 2, 1]
    assert len(in_flight_chunks(Parallelism(pp=4), 0, 2)) == 2  # capped at the micro-batches


def test_interleaved_first_stage_of_llama3_70b_keeps_23_chunk_micro_batches():
    # PP4 VPP5, 16 micro-batches: (4 - 0 - 1) * 2 + (5 - 1) * 4 = 22 warm-up forwards, plus one
    chunks = in_flight_chunks(Parallelism(pp=4, vpp=5), 0, 16)
    assert len(chunks) == 23
    assert chunks[:8] == [0, 0, 0, 0, 1, 1, 1, 1]  # groups of pp micro-batches per model chunk


def test_an_interleaved_stage_holds_every_pp_th_chunk_of_layers():
    # 80 layers over PP4 x VPP5: chunks of 4; stage 1 holds layers 4-7, 20-23, ...
    chunks = chunk_layers(80, Parallelism(pp=4, vpp=5), 1)
    assert chunks[0] == [4, 5, 6, 7] and chunks[1] == [20, 21, 22, 23] and len(chunks) == 5
