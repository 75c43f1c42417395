"""``estimate`` end to end on a GPU recipe: torchrun, the real MCore layers, every status, the JSON."""

from __future__ import annotations

import json

import pytest

from harness.cli import main

pytestmark = pytest.mark.slow  # starts torchrun and builds hidden-2048 MoE layers (~20 s)


def test_estimate_reports_every_status_on_the_hot_rank(capsys, tmp_path):
    out = tmp_path / "estimate.json"
    argv = [
        "estimate",
        "--recipe",
        "mcore-moonlight-1gpu",
        "--rows",
        "[]",
        "mlp",
        "moe_act",
        "gdn_norm_out",
        "full-uniform-1",
        "mla_up_proj",
        "--json",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
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
