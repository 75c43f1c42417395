"""The model plan counts parameters on: Megatron Core refusing to build it is one line."""

from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.plan.parameters import _refusal_as_usage_error


def test_megatron_core_refusing_the_model_is_one_line_naming_its_frame():
    from megatron.core.transformer.transformer_config import TransformerConfig

    with pytest.raises(UsageError) as refused, _refusal_as_usage_error():
        TransformerConfig(
            num_layers=1, hidden_size=128, num_attention_heads=4, recompute_granularity="bogus"
        )
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("Megatron Core cannot build this model: ValueError: ")
    assert " at megatron/core/transformer/transformer_config.py:" in line
