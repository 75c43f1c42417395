"""Which labels and full-recompute rows a whole probe left unmeasured (harness.probe.present.coverage)."""

from __future__ import annotations

from harness.config.fields import RecomputeFields
from harness.probe.measurement.status import CONTROL_STATUS, EFFECTIVE, REJECTED, REQUIRES_TE
from harness.probe.present.coverage import unmeasured_everywhere
from harness.probe.runner import ModelProbe, ProbeRowResult


def _row(name: str, status: str, retained: int | None) -> ProbeRowResult:
    fields = RecomputeFields.parse(name)
    return ProbeRowResult(
        name, status, retained_bytes=retained, fields=fields, add_bias_linear=False
    )


def _probe(model: str, *rows: ProbeRowResult) -> ModelProbe:
    return ModelProbe(model, "", 32, 2, [_row("[]", CONTROL_STATUS, 100), *rows])


def test_a_full_row_one_model_refuses_and_another_measures_is_not_unmeasured():
    # mtp-tiny refuses uniform recompute_num_layers 2 at its first forward; dense-tiny measures it.
    mtp = _probe(
        "mtp-tiny", _row("full-uniform-2", REJECTED, None), _row("moe_act", REJECTED, None)
    )
    dense = _probe("dense-tiny", _row("full-uniform-2", EFFECTIVE, 10))
    moe = _probe("moonlight-tiny", _row("moe_act", REQUIRES_TE, 100))
    missing = unmeasured_everywhere([mtp, dense, moe])
    assert list(missing) == ["moe_act"]
    assert [model for model, _ in missing["moe_act"]] == ["mtp-tiny", "moonlight-tiny"]
    assert list(unmeasured_everywhere([mtp])) == ["moe_act", "full-uniform-2"]  # labels first
