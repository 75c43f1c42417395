"""ci/gpu-check-h200.sh rehearsed on CPU: the same steps as on the H200 (requirements, revisions, sweep,
golden, overhead) on a CPU recipe, and what comes back fits the device's limits (<= 8 files, <= 2
folders deep under $OUT). A step that fails still lets every other step report."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.rehearsal

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "ci" / "gpu-check-h200.sh"
MARKER_ENV = "RECOMPUTE_HARNESS_TEST_MARKER"


def _rehearse(out: Path, *flags: str, **env: str) -> tuple[int, list[str]]:
    child = subprocess.run(
        ["bash", str(SCRIPT), *flags, "--rehearse-on-cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OUT": str(out), **env},
        timeout=900,
        check=False,
    )
    files = [path for path in out.rglob("*") if path.is_file()]
    assert len(files) <= 8 and all(len(path.relative_to(out).parts) <= 3 for path in files), files
    return child.returncode, (out / "summary.txt").read_text().splitlines()


def test_the_rehearsal_runs_every_step_and_packs_what_it_measured(tmp_path):
    rc, summary = _rehearse(tmp_path)
    assert rc == 0, "\n".join(summary)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gpu-check.tar.gz", "summary.txt"]
    for step in ("revisions", "share-storage-ext", "sweep", "overhead"):
        assert f"{step}: ok" in summary
    # CPU records never become timing goldens: the golden step checks that the harness refuses them.
    assert (
        "golden: ok (refused on CPU records, as it must be; a GPU run writes the golden)" in summary
    )
    assert "requirements: ok" in summary and summary[-1] == "exit status 0"
    assert any(line.startswith("row mla_up_proj: completed on cpu") for line in summary)
    with tarfile.open(tmp_path / "gpu-check.tar.gz") as archive:
        names = archive.getnames()
    from harness.run.recipes import load_recipe

    rows = load_recipe("cpu-moonlight-ep2").rows  # one record per row of the rehearsed recipe
    assert sum(n.endswith(".json") and "/records/" in n for n in names) == len(rows)
    assert {"./gpu-check.log", "./revisions.txt", "./instrumentation-overhead.json"} <= set(names)
    assert not any(n.startswith("./golden/") and n.endswith(".json") for n in names)


def test_the_noise_calibration_rehearsal_runs_rounds_and_reports_their_noise(tmp_path):
    # Issue 42 item 5: rows [] and moe_act of the CPU recipe (10 iterations) in 2 rotated rounds, the
    # noise step's figures in the summary and the archive, no overhead step.
    rc, summary = _rehearse(tmp_path, "--calibrate")
    assert rc == 0, "\n".join(summary)
    assert "noise calibration: 2 rounds of the row set, rotated" in summary
    for step in ("revisions", "sweep", "noise"):
        assert f"{step}: ok" in summary
    assert not any(line.startswith("overhead") for line in summary)
    assert (
        "golden: ok (refused on CPU records, as it must be; a GPU run writes the golden)" in summary
    )
    noise = [line for line in summary if line.startswith("noise: ")]
    assert any(line.startswith("noise: []: 2 rounds, warm-up") for line in noise), noise
    assert any("moe_act: 2 rounds" in line and "vs [] " in line for line in noise), noise
    with tarfile.open(tmp_path / "gpu-check.tar.gz") as archive:
        names = archive.getnames()
        figures = json.load(archive.extractfile("./noise-calibration.json"))
    records = sorted(n.rsplit("/", 1)[1] for n in names if "/records/" in n and n.endswith(".json"))
    assert records == ["r1-control.json", "r1-moe_act.json", "r2-control.json", "r2-moe_act.json"]
    assert figures["rows"]["moe_act"]["rounds"] == 2 and len(figures["rows"]["[]"]["warmup"]) == 2


def test_a_failing_step_does_not_stop_the_others_from_reporting(tmp_path):
    # The sweep runs out of its wall-clock limit before any row finishes: no records, no golden.
    rc, summary = _rehearse(tmp_path, GPU_CHECK_SWEEP_LIMIT_S="1")
    assert rc == 1
    assert "revisions: ok" in summary
    assert any(line.startswith("sweep: failed (exit 124)") for line in summary), summary
    assert "golden: skipped (the sweep wrote no records)" in summary
    assert "overhead: ok" in summary
    assert (tmp_path / "gpu-check.tar.gz").exists() and summary[-1] == "exit status 1"


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="a CUDA GPU is visible: nothing is missing"
)
def test_missing_requirements_are_named_on_one_line(tmp_path):
    child = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "gpu_check_requirements.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = child.stdout.splitlines()
    assert child.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("requirements: missing: ") and "a CUDA GPU" in lines[0]


def _archived_records(archive: Path) -> list[str]:
    try:
        with tarfile.open(archive) as tar:
            return [n for n in tar.getnames() if "/records/" in n and n.endswith(".json")]
    except (OSError, tarfile.TarError):
        return []


def test_a_check_killed_mid_sweep_leaves_a_readable_archive_of_the_finished_rows(tmp_path):
    """Issue 24 item 5: the archive was packed only at the end, so a check killed by the device's limit
    returned nothing. Now SIGKILL (no trap runs) the script's whole process group once the sweep's
    first row has finished: the archive it leaves holds that row's record, loadable."""
    from harness.processes import processes_with_env
    from harness.record.io import load_records

    marker = uuid.uuid4().hex
    out = tmp_path / "out"
    script = subprocess.Popen(
        ["bash", str(SCRIPT), "--rehearse-on-cpu"],
        cwd=ROOT,
        env={**os.environ, "OUT": str(out), "TMPDIR": str(tmp_path), MARKER_ENV: marker},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not _archived_records(out / "gpu-check.tar.gz") and time.monotonic() < deadline:
            assert script.poll() is None, (out / "summary.txt").read_text()
            time.sleep(0.5)
        os.killpg(script.pid, signal.SIGKILL)
        script.wait(timeout=30)
    finally:  # `timeout` leads a process group of its own: its sweep outlives the script's group
        for pid in processes_with_env(MARKER_ENV, marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    names = _archived_records(out / "gpu-check.tar.gz")
    assert any(name.endswith("/records/control.json") for name in names), names
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (records_dir,) = (tmp_path / "unpacked").glob("runs/*/records")
    assert "[]" in [record.label for record in load_records([records_dir])]
    assert "sweep" not in {
        line.split(":")[0] for line in (out / "summary.txt").read_text().splitlines()
    }


def _requirements() -> ModuleType:
    """ci/gpu_check_requirements.py as a module (a script of ci/, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "gpu_check_requirements", ROOT / "ci" / "gpu_check_requirements.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_carried_pins_are_the_locks_exact_versions():
    """Issue 24 item 5: any installed megatron-core / rich / matplotlib satisfied a `>=` pin."""
    requirements = _requirements()
    lock = (ROOT / "ci" / "constraints-cpu.txt").read_text().splitlines()
    assert {f"{name}=={requirements.locked(name)}" for name in requirements.CARRIED} <= set(lock)
    assert requirements.locked("megatron-core") == "0.19.2"


def test_a_wheel_for_another_platform_is_named(tmp_path):
    import platform

    requirements = _requirements()
    wheel = tmp_path / "megatron_core-0.19.2-cp312-cp312-manylinux_2_28_aarch64.whl"
    wheel.touch()
    if platform.machine() != "aarch64":
        assert "manylinux_2_28_aarch64" in requirements.unusable_platform(wheel)
    newer = tmp_path / "rich-15.0.0-py3-none-manylinux_9_99_x86_64.whl"
    assert "glibc" in requirements.unusable_platform(newer)
    assert requirements.unusable_platform(tmp_path / "rich-15.0.0-py3-none-any.whl") is None


def test_without_a_compiler_or_ninja_only_mla_up_proj_is_given_up(tmp_path):
    """Issue 24 item 5: a missing ninja was fatal, though only mla_up_proj's extension needs it."""
    child = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "gpu_check_requirements.py"), str(tmp_path), "--cpu"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(tmp_path)},  # no g++, no ninja on it
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stdout
    assert child.stdout.strip() == (
        "requirements: ok; no extension toolchain (g++, ninja): mla_up_proj is requires-extension"
    )
