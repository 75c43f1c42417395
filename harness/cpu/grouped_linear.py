"""CPU stand-ins for Transformer Engine's grouped linear, the experts' GEMMs of ``TEGroupedMLP``.

Megatron Core's Transformer Engine spec builds grouped-GEMM experts as ``TEGroupedMLP`` with
``TEColumnParallelGroupedLinear`` (``linear_fc1``) and ``TERowParallelGroupedLinear`` (``linear_fc2``),
subclasses of TE's ``GroupedLinear`` (``megatron/core/extensions/transformer_engine.py``); without TE
those names are ``None`` and ``TESpecProvider.grouped_mlp_modules`` falls back to ``SequentialMLP``,
where ``moe_act`` does nothing. ``TEGroupedMLP`` itself, its ``moe_act`` checkpoint
(``CheckpointWithoutOutput`` around the activation, its output discarded once ``linear_fc2`` has
consumed it), the token dispatchers and the router are Megatron Core, and run unmodified here; only
the two linears are replaced, as the adapter replaces the Mamba kernels.

What each stand-in is, read from TE v2.17.1 (commit 4329ff84, the TE pin of Megatron Bridge's r0.6
branch: ``transformer_engine/pytorch/module/grouped_linear.py``, ``_GroupedLinear.forward``, the
non-FP8 path taken when ``NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM`` is unset, its default):

- constructed as Megatron Core 0.18.2 to the head construct ``TE*ParallelGroupedLinear``:
  ``(num_gemms, input_size, output_size, *, config, init_method, bias, skip_bias_add, is_expert,
  tp_comm_buffer_name, pg_collection, name)``; one weight per local expert, ``weight{i}`` of shape
  ``[out, in]`` (TE's names), each initialised by ``init_method``: from the default generator under
  ``use_cpu_initialization`` (as MCore's own linears draw CPU master weights), else inside the
  expert-parallel RNG tracker's fork, as TE's ``reset_parameters`` does through ``rng_tracker_name``
  (nothing without ``perform_initialization``: MCore hands TE ``condition_init_method``'s no-op). Expert TP is
  handled by the token dispatcher (``explicit_expert_comm``): the column-parallel linear holds
  ``output_size / expert_tp`` outputs, the row-parallel one ``input_size / expert_tp`` inputs, and
  neither communicates;
- called as ``linear(x, tokens_per_expert) -> (out, bias)``: ``x`` ``[tokens, in]`` is viewed
  ``[-1, in]`` and split by ``tokens_per_expert`` (``torch.split``), expert ``i``'s rows times
  ``weight{i}``ᵀ are written into one ``[tokens, out]`` output; the bias is added when
  ``skip_bias_add`` is off, else returned as the list of per-expert biases (TE's ``return_bias``),
  ``None`` without bias;
- for backward it saves what ``_GroupedLinear.forward`` saves there: ``inputmats =
  torch.split(cast_if_needed(inp.reshape(-1, in_features), activation_dtype), m_splits)``, which
  are *views of the caller's tensor* (the reshape of a contiguous tensor and ``torch.split`` share
  its storage; the cast is the identity in the parameters' dtype), then the weights (the parameters
  themselves: the cast is the identity) and the biases. Views, not copies, are what makes ``moe_act``
  free anything: ``linear_fc2``'s input is the checkpoint's output, and
  ``discard_output_and_register_recompute`` frees that storage, which the views share. A stand-in
  that saved a copy would keep the activation alive and ``moe_act`` would measure nothing
  (``tests/unit/cpu/test_grouped_linear.py`` and the adapter's self-check hold this).

The backward is explicit GEMMs with grad mode off (dgrad ``grad_i @ weight_i``, wgrad
``grad_iᵀ @ x_i``, bias grads the sums of ``grad_i``), as TE's backward kernels are: no autograd
replay, which the probe would count as recompute. FP8, delayed weight gradients, single grouped
weights, CPU offloading and fused weight-gradient accumulation are not supported, and refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch


def _expert_tensor_parallel_size(pg_collection: Any) -> int:
    if pg_collection is not None and getattr(pg_collection, "expt_tp", None) is not None:
        return pg_collection.expt_tp.size()
    from megatron.core import parallel_state

    return parallel_state.get_expert_tensor_parallel_world_size()


class _GroupedGemm(torch.autograd.Function):
    """Per-expert GEMMs; saves the input's per-expert views, the weights and the biases."""

    @staticmethod
    def forward(
        ctx: Any, inp: torch.Tensor, m_splits: list[int], use_bias: bool, *params: torch.Tensor
    ) -> torch.Tensor:
        num_gemms = len(m_splits)
        weights, biases = params[:num_gemms], params[num_gemms:]
        in_features = weights[0].size(-1)
        inp_view = inp.reshape(-1, in_features)
        if inp_view.dtype != weights[0].dtype:
            inp_view = inp_view.to(weights[0].dtype)  # TE's cast_if_needed to activation_dtype
        inputmats = torch.split(inp_view, m_splits)
        out = torch.empty(
            [sum(m_splits), weights[0].size(0)], dtype=weights[0].dtype, device=inp.device
        )
        for i, (inputmat, out_rows) in enumerate(zip(inputmats, torch.split(out, m_splits))):
            torch.matmul(inputmat, weights[i].t(), out=out_rows)
            if use_bias:
                out_rows += biases[i]
        ctx.save_for_backward(*inputmats, *weights, *biases)
        ctx.m_splits = m_splits
        ctx.num_gemms = num_gemms
        ctx.use_bias = use_bias
        ctx.inp_shape = inp.shape
        ctx.inp_dtype = inp.dtype
        return out.view(-1, *inp.shape[1:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        saved = ctx.saved_tensors
        num_gemms = ctx.num_gemms
        inputmats, weights = saved[:num_gemms], saved[num_gemms : 2 * num_gemms]
        grads = torch.split(grad_output.contiguous().view(-1, grad_output.shape[-1]), ctx.m_splits)
        grad_input = torch.empty(
            [sum(ctx.m_splits), weights[0].size(1)],
            dtype=weights[0].dtype,
            device=grad_output.device,
        )
        for i, rows in enumerate(torch.split(grad_input, ctx.m_splits)):
            torch.matmul(grads[i], weights[i], out=rows)
        grad_weights = [grads[i].t() @ inputmats[i] for i in range(num_gemms)]
        grad_biases = [grads[i].sum(dim=0) for i in range(num_gemms)] if ctx.use_bias else []
        grad_inp = grad_input.view(ctx.inp_shape).to(ctx.inp_dtype)
        return (grad_inp, None, None, *grad_weights, *grad_biases)


class CpuGroupedLinear(torch.nn.Module):
    """TE's ``GroupedLinear`` as Megatron Core's ``TEGroupedLinear`` wraps it, on CPU (module doc)."""

    parallel_mode: str = ""

    def __init__(
        self,
        num_gemms: int,
        input_size: int,
        output_size: int,
        *,
        config: Any,
        init_method: Callable[[torch.Tensor], Any],
        bias: bool,
        skip_bias_add: bool,
        is_expert: bool,
        tp_comm_buffer_name: str | None = None,
        pg_collection: Any = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        if not is_expert:
            raise ValueError("TEGroupedLinear only supports expert parallelism")
        unsupported = [
            field
            for field in (
                "fp8",
                "fp4",
                "delay_wgrad_compute",
                "moe_single_grouped_weight",
                "gradient_accumulation_fusion",
            )
            if getattr(config, field, None)
        ]
        if unsupported:
            raise NotImplementedError(
                f"the CPU grouped-linear stand-in has no {', '.join(unsupported)} (TE's only)"
            )
        tp = _expert_tensor_parallel_size(pg_collection)
        if self.parallel_mode == "column":
            output_size //= tp
        else:
            input_size //= tp
        self.num_gemms = num_gemms
        self.in_features = input_size
        self.out_features = output_size
        self.use_bias = bias
        self.return_bias = skip_bias_add and bias
        self.config = config
        from megatron.core.tensor_parallel.random import (
            get_cuda_rng_tracker,
            get_expert_parallel_rng_tracker_name,
        )

        tracker = get_cuda_rng_tracker()
        for i in range(num_gemms):
            weight = torch.nn.Parameter(
                torch.empty(output_size, input_size, dtype=config.params_dtype)
            )
            # Without perform_initialization MCore's condition_init_method hands TE a no-op. With
            # use_cpu_initialization (the CPU probe's) the default generator draws, as MCore's own
            # linears draw their CPU master weights, so a model's weights depend only on the seed
            # build_model sets, never on what the process built before (the expert RNG tracker's
            # stream, TE's on GPU, moves on with every build).
            if config.perform_initialization:
                expert_stream = (
                    tracker.fork(get_expert_parallel_rng_tracker_name())
                    if tracker.is_initialized() and not config.use_cpu_initialization
                    else contextlib.nullcontext()
                )
                with expert_stream:
                    init_method(weight)
            self.register_parameter(f"weight{i}", weight)
            if bias:
                self.register_parameter(
                    f"bias{i}",
                    torch.nn.Parameter(torch.zeros(output_size, dtype=config.params_dtype)),
                )
        for parameter in self.parameters():
            parameter.allreduce = False  # an expert's parameter, as MCore marks TE's

    def forward(
        self, x: torch.Tensor, m_splits: Sequence[int] | torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        splits = m_splits.tolist() if isinstance(m_splits, torch.Tensor) else list(m_splits)
        if len(splits) != self.num_gemms:
            raise ValueError(f"{len(splits)} splits for {self.num_gemms} GEMMs")
        weights = [getattr(self, f"weight{i}") for i in range(self.num_gemms)]
        biases = [getattr(self, f"bias{i}") for i in range(self.num_gemms)] if self.use_bias else []
        if self.return_bias:
            out = _GroupedGemm.apply(x, splits, False, *weights)
            return out, [bias.to(out.dtype) for bias in biases]
        return _GroupedGemm.apply(x, splits, self.use_bias, *weights, *biases), None

    def backward_dw(self) -> None:
        """TE's delayed weight-gradient hook: nothing is delayed here (refused at construction)."""


class CpuColumnParallelGroupedLinear(CpuGroupedLinear):
    """``TEColumnParallelGroupedLinear`` on CPU: ``linear_fc1`` of ``TEGroupedMLP``."""

    parallel_mode = "column"


class CpuRowParallelGroupedLinear(CpuGroupedLinear):
    """``TERowParallelGroupedLinear`` on CPU: ``linear_fc2`` of ``TEGroupedMLP``."""

    parallel_mode = "row"
