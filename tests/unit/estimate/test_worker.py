"""``estimate`` end to end on a GPU recipe: torchrun, the real MCore layers, every status, the JSON,
and ``--check-golden`` judging the committed golden of that recipe."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.golden.estimate import judge_estimate
from harness.golden.store import estimate_dir, golden_root

# Starts torchrun and builds hidden-2048 MoE layers at three lengths (bf16 GEMMs on the fp32 kernels,
# CPU adapter part 11): ~3 min of CPU time on the 2-core CI machine, so the estimates step, not the tier.
pytestmark = [pytest.mark.slow, pytest.mark.estimates]

# Written by: ./venv-run recompute-harness estimate --recipe mcore-moonlight-1gpu --rows '[]' mlp \
#   moe_act gdn_norm_out full-uniform-1 mla_up_proj core_attn moe layernorm shared_experts \
#   mla_up_proj+core_attn mla_up_proj+mlp layernorm+moe_act moe+layernorm mlp+core_attn \
#   core_attn+layernorm --write-golden   (every row plan needs for the recipe)
# The test measures six of them, one of each status (a full-width row costs ~12 s of CPU).
ROWS = ["[]", "mlp", "moe_act", "gdn_norm_out", "full-uniform-1", "mla_up_proj"]
COMMITTED = sorted(estimate_dir(golden_root()).glob("mcore-moonlight-1gpu__unfused__*.json"))


def test_estimate_reports_every_status_and_check_golden_names_the_changed_row(capsys, tmp_path):
    """One measurement serves both: the check runs against a copy of the committed golden in which
    only mla_up_proj's saving differs by one byte, so exactly that row is named (exit 1) and every
    other figure of the committed golden is matched to the byte."""
    assert COMMITTED, "the committed estimate golden of mcore-moonlight-1gpu is missing"
    committed = json.loads(COMMITTED[-1].read_text())
    altered = json.loads(COMMITTED[-1].read_text())
    row = next(row for row in altered["rows"] if row["label"] == "mla_up_proj")
    row["saving_bytes"] += 1
    (tmp_path / "golden" / "estimate").mkdir(parents=True)
    (tmp_path / "golden" / "estimate" / COMMITTED[-1].name).write_text(json.dumps(altered))
    out = tmp_path / "estimate.json"
    argv = [
        "estimate",
        "--recipe",
        "mcore-moonlight-1gpu",
        "--check-golden",
        "--rows",
        *ROWS,
        "--golden-dir",
        str(tmp_path / "golden"),
        "--json",
        "--out",
        str(out),
    ]
    assert main(argv) == 1  # the altered saving is a regression
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    verdict = captured.err.strip().splitlines()
    assert verdict[0].startswith("golden: 1 figure(s) differ from ")
    changed = f"golden {row['saving_bytes']}, now {row['saving_bytes'] - 1} (-0.00 %)"
    assert verdict[1] == f"  row 'mla_up_proj': saving_bytes {changed}"
    # The block ends it: the first difference named in its last line.
    assert verdict[-1].startswith(
        f"FAIL: 1 figure(s) differ; first: row 'mla_up_proj': saving_bytes {changed}; "
    )
    assert judge_estimate(committed, printed) == []  # the committed golden's rows, judged
    assert json.loads(out.read_text()) == printed
    assert printed["layers"] == {"dense": 1, "moe": 7} and printed["hot_rank"] == 0
    assert (
        printed["provenance"]["source"] == "cpu estimate run"
        and printed["provenance"]["command"]
        == (
            "recompute-harness estimate --recipe mcore-moonlight-1gpu --rows '[]' mlp moe_act gdn_norm_out "
            "full-uniform-1 mla_up_proj"
        )
        and printed["provenance"]["date"]
    )
    assert printed["attention_backend"] == "unfused"  # the recipe says attention_backend = "local"
    assert printed["score_bytes_per_s2"]["dense"] > 0  # unfused: the score matrix grows with s²
    rows = {row["label"]: row for row in printed["rows"]}
    assert rows["[]"]["status"] == "control" and rows["[]"]["retained_bytes"] > 0
    # mlp: MCore applies it to dense layers only; this model's MoE layers keep []'s bytes exactly
    assert (
        rows["mlp"]["status"] == "effective" and rows["mlp"]["reason"] == "no effect on moe layers"
    )
    assert (
        rows["mlp"]["per_kind"]["moe"]["saving_bytes"]
        == 0
        < rows["mlp"]["per_kind"]["dense"]["saving_bytes"]
    )
    assert rows["mlp"]["saving_bytes"] == rows["mlp"]["per_kind"]["dense"]["saving_bytes"]
    # moe_act: the mcore back end's experts are SequentialMLP (its measured GPU image has no TE:
    # Architecture.te_grouped_experts), where the validator accepts the label and it does nothing
    assert rows["moe_act"]["status"] == "requires-TE" and rows["moe_act"]["saving_bytes"] is None
    assert rows["gdn_norm_out"]["status"] == "rejected" and rows["gdn_norm_out"]["rule"]
    assert rows["full-uniform-1"]["status"] == "unmeasured"
    up = rows["mla_up_proj"]
    assert (
        up["status"] == "effective"
        and up["saving_bytes"] == rows["[]"]["retained_bytes"] - up["retained_bytes"]
    )
    assert (
        up["removed"][0]["module"].endswith("self_attention.core_attention")
        and up["removed"][0]["bytes"] > 0
    )
    # The rank's peak (MemTracker): on top of what the stage retains, at its last layer (7), where
    # every layer's saved tensors are alive
    control = rows["[]"]
    assert control["peak_bytes"] > control["retained_bytes"]
    assert control["peak_phase"] == "backward of layer 7 (moe)"
    assert up["peak_saving_bytes"] == control["peak_bytes"] - up["peak_bytes"] > 0
