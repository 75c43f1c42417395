"""A Megatron Core bump, rehearsed for real: released megatron-core wheels overlaid next to the venv.

Each overlay (``tests/support/overlays.py``) is ``pip install --no-deps --target`` of a small
megatron-core wheel (torch is reused), cached outside the repository. The bump workflow (``ci/golden-refresh.sh --cpu-only``) runs
in a temporary copy of the repository with the overlay first on ``PYTHONPATH``; the pinned goldens of
the locked revision must come out byte for byte unchanged, a manifest it writes must be the committed
one, and a refresh of a pinned revision must write nothing.

The expectations name what really changed in those releases (read from their sources): 0.18.2 has no
``gdn_norm_out`` label and no check for it, yet the CPU adapter passes its self-check there (its
replaced objects are the reviewed ones), so its CPU goldens are written; 0.19.0 matches 0.19.2's
labels, rules and adapter surface.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from overlays import WHOLE_PROBE_TIMEOUT_S, overlay

from harness.config.revisions import source_fingerprint

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def copy_repo(tmp_path: Path) -> Path:
    """The tracked (and not ignored) files of the repository, as a checkout would have them."""
    listed = (
        subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    copy = tmp_path / "repo"
    for relative in filter(None, listed):
        source = REPO / relative
        if source.is_file():
            (copy / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / relative)
    return copy


def goldens(repo: Path) -> dict[str, bytes]:
    return {
        path.relative_to(repo).as_posix(): path.read_bytes()
        for path in (repo / "tests" / "golden").rglob("*")
        if path.is_file()
    }


def refresh(
    repo: Path, mcore: Path, *argv: str, jobs: int | None = None
) -> subprocess.CompletedProcess:
    """The bump workflow in ``repo`` with ``mcore`` shadowing the venv's Megatron Core (its probe's
    passes on ``jobs`` workers, default one per core), or the harness's ``argv`` there."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{repo}{os.pathsep}{mcore}",
        "RECOMPUTE_HARNESS_PYTHON": sys.executable,
    }
    env.pop("VIRTUAL_ENV", None)
    command = (
        [
            str(repo / "ci" / "golden-refresh.sh"),
            "--cpu-only",
            *([f"--jobs={jobs}"] if jobs else []),
        ]
        if not argv
        else [sys.executable, "-m", "harness.cli", *argv]
    )
    return subprocess.run(
        command,
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=WHOLE_PROBE_TIMEOUT_S,
        check=False,
    )


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

    first = refresh(repo, mcore, jobs=1)  # one process: the step's other worker probes 0.19.0
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


# A second whole bump in a subprocess (~18 s): .ci/run's revisions step, beside the bump to 0.18.2.
@pytest.mark.revisions
def test_bump_to_0_19_0_finds_no_drift(tmp_path):
    mcore = overlay("0.19.0")
    repo = copy_repo(tmp_path)
    before = goldens(repo)
    done = refresh(repo, mcore, "bump", "--no-probe")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "megatron-core 0.19.0" in out and "recompute labels match the manifest" in out
    assert (
        "0 disagreements (0 causes), 0 rules that can no longer fire, 0 labels no rule names" in out
    )
    assert "CPU adapter: its replaced objects match their review" in out
    assert goldens(repo) == before  # 0.19.0 is pinned already: nothing is written
