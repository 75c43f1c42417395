"""``plan``: a rank's whole-step peak memory for every recompute row, and the cheapest row that fits.

``workload`` (what is trained and how: a recipe, or Megatron-LM flags), ``parameters`` (the real
model's per-rank parameters, built on the meta device under a fake process group), ``schedule``
(micro-batches in flight per pipeline stage), ``activations`` (per-layer retained bytes from the
estimate's measurements), ``flops`` (the replayed share of a step), ``step`` (the per-rank timeline
and its peak), ``plan`` (rows, fit, choice). docs/plan.md.
"""
