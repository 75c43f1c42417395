"""A bump to a revision that is pinned already, rehearsed for real: the released 0.19.0 overlaid next
to the venv (``tests/support/overlays.py``), the bump workflow in a temporary copy of the repository
(``tests/support/bump_workflow.py``). 0.19.0 matches 0.19.2's labels, rules and adapter surface, and
its CPU goldens are committed: the whole refresh finds no drift and writes nothing, byte for byte."""

from __future__ import annotations

import re

import pytest
from bump_workflow import copy_repo, goldens, refresh
from overlays import overlay

pytestmark = pytest.mark.slow


# The step's other whole probe, beside the bump to 0.18.2: 0.19.0, pinned already, judged by the same
# workflow (its goldens come out rewritten by nothing, byte for byte: each value the same as pinned).
@pytest.mark.revisions
def test_bump_to_0_19_0_finds_no_drift_and_rewrites_nothing(tmp_path):
    mcore = overlay("0.19.0")
    repo = copy_repo(tmp_path)
    before = goldens(repo)
    done = refresh(repo, mcore, jobs=1)  # one process: the step's other worker bumps to 0.18.2
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    assert "megatron-core 0.19.0" in out and "recompute labels match the manifest" in out
    assert (
        "0 disagreements (0 causes), 0 rules that can no longer fire, 0 labels no rule names" in out
    )
    assert "refused" not in out and "CPU adapter: a replaced upstream object" not in out
    # Every model 0.19.0 builds, fp32 and bf16; the head's hyper-connections and GatedDeltaProduct
    # are said to be left out.
    unchanged = re.findall(r"^[\w-]+: unchanged \S+/cpu-probe-", out, flags=re.MULTILINE)
    assert len(unchanged) == 2 * 7, out[-3000:]
    assert "\nnot probed here: mhc-tiny: this Megatron Core has no HyperConnection" in out
    assert "\nnot probed here: gdp-tiny: this Megatron Core has no GatedDeltaProduct" in out
    assert "refreshed: 0\nleft: 0\n" in out
    assert goldens(repo) == before  # 0.19.0 is pinned already: nothing is written
