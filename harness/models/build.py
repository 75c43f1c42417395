"""Building a style model: its real ``TransformerConfig`` and Megatron Core model, and the batch it trains on."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from harness.config.fields import RecomputeFields
from harness.errors import UsageError
from harness.models.attention import set_core_attention
from harness.models.catalog import buildable_model
from harness.models.gdn import decoder_block_spec, run_linear_attention_helpers_eagerly
from harness.models.hybrid import build_hybrid_model
from harness.models.mhc import use_hyper_connections
from harness.models.moe import fit_moe_metrics_tracker, grouped_gemm_experts
from harness.models.style import StyleModel


@dataclass
class TinyModel:
    """A built style model plus the batch it trains on."""

    style: StyleModel
    module: torch.nn.Module
    config: Any  # megatron.core TransformerConfig
    seq_length: int
    micro_batch_size: int
    device: torch.device

    def __post_init__(self) -> None:
        # The causal mask (True = masked) and positions are the same for every batch: built once, on the
        # model's device. Rebuilt per micro-batch they cost a seq² triu on the host and a host-to-device
        # copy inside every timed step (70-90 ms at seq 4096 on one CPU thread).
        self._causal = torch.triu(
            torch.ones(self.seq_length, self.seq_length, dtype=torch.bool, device=self.device),
            diagonal=1,
        )[None, None]
        self._positions = (
            torch.arange(self.seq_length, device=self.device)
            .expand(self.micro_batch_size, -1)
            .contiguous()
        )

    def batch(self, seed: int = 0) -> dict[str, torch.Tensor]:
        """Deterministic tokens and labels (drawn on the host: the same on every device), positions and
        the causal mask (True = masked)."""
        generator = torch.Generator().manual_seed(seed)
        shape = (self.micro_batch_size, self.seq_length + 1)
        tokens = torch.randint(0, self.style.vocab_size, shape, generator=generator).to(self.device)
        batch = {
            "input_ids": tokens[:, :-1].contiguous(),
            "position_ids": self._positions,
            "attention_mask": self._causal,
            "labels": tokens[:, 1:].contiguous(),
        }
        if self.style.padding_tokens:
            loss_mask = torch.ones(self.micro_batch_size, self.seq_length, device=self.device)
            loss_mask[:, self.seq_length - self.style.padding_tokens :] = 0
            batch["loss_mask"] = loss_mask
        return batch

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean token loss (over the tokens the loss mask keeps, when the batch has one): the scalar
        the probe differentiates. The MTP block adds its own loss to the graph through the mask."""
        loss_mask = batch.get("loss_mask")
        per_token = self.module(
            batch["input_ids"],
            batch["position_ids"],
            batch["attention_mask"],
            labels=batch["labels"],
            **({} if loss_mask is None else {"loss_mask": loss_mask}),
        )
        if loss_mask is None:
            return per_token.float().mean()
        return (per_token.float() * loss_mask).sum() / loss_mask.sum()


def _parallel_sizes(has_experts: bool) -> dict[str, int]:
    """The model-parallel sizes of the running MCore parallel state (the config must agree with it)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return {}
    sizes = {
        "tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
        "context_parallel_size": ps.get_context_parallel_world_size(),
    }
    if has_experts:
        sizes["expert_model_parallel_size"] = ps.get_expert_model_parallel_world_size()
    return sizes


def _pipeline_stage_ends() -> dict[str, bool]:
    """Under pipeline parallelism, whether this rank's stage holds the embedding (``pre_process``) and
    the output layer and loss (``post_process``), as a training script's model provider asks MCore's
    parallel state; nothing (GPTModel's defaults: the whole model) on one stage."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized() or ps.get_pipeline_model_parallel_world_size() == 1:
        return {}
    return {
        "pre_process": ps.is_pipeline_first_stage(),
        "post_process": ps.is_pipeline_last_stage(),
    }


def transformer_config(
    style: StyleModel,
    fields: RecomputeFields,
    *,
    dropout: bool = False,
    add_bias_linear: bool | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    **overrides: Any,
) -> Any:
    """The real ``TransformerConfig`` (``MLATransformerConfig`` for MLA); its validator runs here."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    kwargs = dict(style.config_kwargs)
    if add_bias_linear is not None:
        kwargs["add_bias_linear"] = add_bias_linear
    kwargs.update(_parallel_sizes(has_experts="num_moe_experts" in kwargs))
    kwargs.update(
        hidden_dropout=0.1 if dropout else 0.0,
        attention_dropout=0.1 if dropout else 0.0,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=torch.device(device).type == "cpu",
        **fields.as_config_kwargs(),
    )
    kwargs.update(overrides)
    return (MLATransformerConfig if style.mla else TransformerConfig)(**kwargs)


def sequence_parallel_norm(
    config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any
) -> torch.nn.Module:
    """MCore's ``WrappedTorchNorm`` on a sequence-parallel model: built with SP off, its weights
    marked ``sequence_parallel``. ``WrappedTorchNorm`` refuses SP only because its weight gradient
    then needs the TP all-reduce (MCore's ``finalize_model_grads`` does it for parameters marked so,
    after the step); a norm is per token, so on the ``[s/tp, b, h]`` shard it saves exactly what it
    saves without SP."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    local = copy.copy(config)
    local.sequence_parallel = False
    norm = WrappedTorchNorm(config=local, hidden_size=hidden_size, eps=eps, **kwargs)
    for parameter in norm.parameters():
        parameter.sequence_parallel = True
    return norm


def _sequence_parallel_norms(block_spec: Any) -> None:
    """Every ``WrappedTorchNorm`` of a local decoder block spec (the layers' input and pre-MLP
    norms, the block's final norm) built as ``sequence_parallel_norm``."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    for spec in (*block_spec.layer_specs, block_spec):
        submodules = getattr(spec, "submodules", spec)
        for name in ("input_layernorm", "pre_mlp_layernorm", "layer_norm"):
            if getattr(submodules, name, None) is WrappedTorchNorm:
                setattr(submodules, name, sequence_parallel_norm)


def build_model(
    name: str,
    fields: RecomputeFields,
    *,
    dropout: bool = False,
    seq_length: int | None = None,
    micro_batch_size: int | None = None,
    add_bias_linear: bool | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 1234,
    attention_backend: str = "unfused",
    **config_overrides: Any,
) -> TinyModel:
    """Build style model ``name`` with the given recompute fields (model-parallel state must exist).

    ``attention_backend`` (harness.cpu.attention): ``unfused`` is MCore's local core attention,
    ``fused`` a CPU core attention that keeps what fused/flash attention keeps (attention dropout
    is then off: the CPU flash kernel has none).

    Raises ``UsageError`` for an unknown name or nonsense sizes; the validator's own exception
    (AssertionError / ValueError) for recompute fields it rejects.
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    style = buildable_model(name)
    seq_length = style.seq_length if seq_length is None else seq_length
    micro_batch_size = style.micro_batch_size if micro_batch_size is None else micro_batch_size
    for label, value in (("seq_length", seq_length), ("micro_batch_size", micro_batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1 << 20:
            raise UsageError(f"{label} must be an integer in [1, 1048576], got {value!r}")
    if attention_backend == "fused":
        config_overrides.setdefault("attention_dropout", 0.0)
    config = transformer_config(
        style,
        fields,
        dropout=dropout,
        add_bias_linear=add_bias_linear,
        dtype=dtype,
        device=device,
        **config_overrides,
    )
    fit_moe_metrics_tracker(config.num_layers)
    if style.hybrid_pattern:
        torch.manual_seed(seed)
        module = build_hybrid_model(style, config, attention_backend, seq_length)
        module.to(device)
        return TinyModel(style, module, config, seq_length, micro_batch_size, torch.device(device))
    block_spec = decoder_block_spec(config)
    for layer_spec in block_spec.layer_specs:
        layer_spec.submodules.mlp = grouped_gemm_experts(layer_spec.submodules.mlp, config)
    set_core_attention(block_spec, attention_backend, style.mla)
    if config.sequence_parallel:
        _sequence_parallel_norms(block_spec)
    if style.hyper_connections:
        use_hyper_connections(block_spec)
    mtp: dict[str, Any] = {}
    if config.mtp_num_layers:
        mtp["mtp_block_spec"] = get_gpt_mtp_block_spec(
            config, block_spec, use_transformer_engine=False
        )
    torch.manual_seed(seed)
    module = GPTModel(
        config,
        block_spec,
        vocab_size=style.vocab_size,
        max_sequence_length=seq_length,
        position_embedding_type="rope",
        **mtp,
        **_pipeline_stage_ends(),
    )
    run_linear_attention_helpers_eagerly(module)
    module.to(device)
    return TinyModel(style, module, config, seq_length, micro_batch_size, torch.device(device))
