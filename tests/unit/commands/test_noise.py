"""``recompute-harness noise``: a sweep in rounds' noise figures; one job per row refused in one line."""

from __future__ import annotations

import json
import random

from resampled_nights import LANDED, landed_json, resampled_night

from harness.cli import main
from harness.record.io import write_record


def test_one_job_per_row_is_refused_in_one_line(capsys):
    assert main(["noise", str(LANDED / "records")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run --rounds R" in err[0]


def test_a_sweep_in_rounds_reports_warmup_noise_and_effects(tmp_path, capsys):
    for record in resampled_night(landed_json(), random.Random(5), 0.02, rounds=3):
        write_record(tmp_path / "records" / f"{record.id.replace('/', '_')}.json", record)
    assert main(["noise", str(tmp_path / "records"), "--json", str(tmp_path / "noise.json")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5 and lines[0].startswith("[]: 3 rounds, warm-up [")
    assert all("vs [] " in line and "s.e." in line for line in lines[1:])
    figures = json.loads((tmp_path / "noise.json").read_text())
    moe = figures["rows"]["moe"]
    assert len(moe["median_ms"]) == len(moe["log_ratio_vs_control"]) == 3
    assert moe["job_spread_pct"] > 0 and moe["between_job_pct"] <= moe["job_spread_pct"]
