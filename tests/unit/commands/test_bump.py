"""A Megatron Core bump, rehearsed for real: a released megatron-core wheel overlaid next to the venv.

Each overlay (``tests/support/overlays.py``) is ``pip install --no-deps --target`` of a small
megatron-core wheel (torch is reused), cached outside the repository. The bump workflow
(``ci/golden-refresh.sh --cpu-only``) runs in a temporary copy of the repository with the overlay
first on ``PYTHONPATH`` (``tests/support/bump_workflow.py``); the pinned goldens of the locked revision
must come out byte for byte unchanged and the manifest it writes must be the committed one. A bump to
a pinned revision without drift: test_bump_pinned.py (its own module, so the ``revisions`` step's two
workers run the two whole probes side by side: ``--dist loadscope``).

The expectations name what really changed in 0.18.2 (read from its sources): it has no
``gdn_norm_out`` label and no check for it, yet the CPU adapter passes its self-check there (its
replaced objects are the reviewed ones), so its CPU goldens are written.
"""

from __future__ import annotations

import json

import pytest
from bump_workflow import REPO, copy_repo, goldens, refresh
from overlays import overlay

from harness.config.revisions import source_fingerprint

pytestmark = pytest.mark.slow


# A whole probe of every style model on 0.18.2 (~85 s): the revision step's, not the tier's. It also
# judges 0.18.2 against its committed goldens (they must come out rewritten by nothing).
@pytest.mark.revisions
def test_bump_to_0_18_2_names_every_drift_and_pins_only_its_own_goldens(tmp_path):
    mcore = overlay("0.18.2")
    repo = copy_repo(tmp_path)
    fingerprint = source_fingerprint(mcore / "megatron" / "core")
    # As before 0.18.2 was pinned: without its manifest, the labels are diffed against another's.
    (repo / "tests" / "golden" / "labels" / f"{fingerprint}.json").unlink()
    before = goldens(repo)

    first = refresh(repo, mcore, jobs=1)  # one process: the step's other worker bumps to 0.19.0
    out = first.stdout
    assert first.returncode == 1, out + first.stderr  # drift is left to fix
    assert "megatron-core 0.18.2" in out
    assert "removed: gdn_norm_out" in out  # the label diff names what changed
    assert (
        out.count("labels.gdn_norm_out-needs-gdn: no string in this Megatron Core's sources") == 1
    )
    assert "refused" not in out and "CPU adapter: a replaced upstream object" not in out
    assert "next step:" in out and "harness/config/rules.py" in out
    # 0.18.2's MTP layer under full recompute passes a padding mask its checkpointed forward does not
    # take (fixed by 0.19.0, Megatron-LM #4966): every full row of mtp-tiny raises, and nothing of
    # mtp-tiny is written.
    assert "got an unexpected keyword argument 'padding_mask'" in out
    assert "mtp-tiny: not written: 6 row(s) raised (full-uniform-1, full-uniform-2, " in out

    after = goldens(repo)
    # 0.18.2's committed CPU goldens are rewritten by nothing; its manifest is the one file written,
    # the committed one but for its creation time (later bumps and `labels --check` read that one).
    manifest = f"tests/golden/labels/{fingerprint}.json"
    assert {name: data for name, data in after.items() if name in before} == before
    assert set(after) - set(before) == {manifest}
    written, committed = json.loads(after[manifest]), json.loads((REPO / manifest).read_bytes())
    assert written.pop("created") != committed.pop("created")  # so the manifest is a new write
    assert written == committed
    assert len([name for name in after if f"mcore-0.18.2-{fingerprint}" in name]) >= 6
