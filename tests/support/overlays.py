"""Megatron Core trees overlaid next to the venv, for rehearsing a Megatron Core bump for real.

Each released overlay is ``pip install --no-deps --target`` of a small megatron-core wheel (torch is
reused); the development head is a git work tree of Megatron-LM at ``HEAD_COMMIT`` (a shared, sparse
clone holding ``megatron/`` of the Megatron-LM git repository at ``$MEGATRON_LM_GIT``, by default
``~/.cache/recompute-harness/megatron-lm.git``: a clone, a bare mirror or a link to one, holding
``HEAD_COMMIT`` and, for the pull-request tests, ``refs/pull/N/head``), so its identity is that commit.
Without one, the tests that need it skip and their reason names the variable. Both are cached outside the repository
(``$RECOMPUTE_HARNESS_OVERLAYS`` or ``~/.cache/recompute-harness/overlays``), so reruns cost nothing.
``./venv-run`` fetches them when it creates the venv (``python tests/support/overlays.py``): set-up,
not the CPU tier's time. ``python tests/support/overlays.py --path REVISION`` prints one's directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# The bump rehearsals of tests/unit/commands/test_bump.py: a release without gdn_norm_out, and a patch
# release of the pinned minor.
BUMP_REHEARSALS = ("0.18.2", "0.19.0")
CACHE = Path.home() / ".cache" / "recompute-harness"
OVERLAYS = Path(os.environ.get("RECOMPUTE_HARNESS_OVERLAYS", CACHE / "overlays"))
PIP_TIMEOUT_S = 300
# A whole probe of one revision (every style model, fp32 + bf16) in a subprocess: about 90 s on a CPU
# with a bf16 GEMM kernel, 295 s alone and over 300 s beside a second one on a 2-core CPU without it
# (measured 2026-12-02, docs/estimate.md). The bound only catches a hang.
WHOLE_PROBE_TIMEOUT_S = 1200
# The development head the goldens are pinned to (0.20.0 on main), and where its git history is read.
HEAD_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
MEGATRON_LM_GIT = Path(os.environ.get("MEGATRON_LM_GIT") or CACHE / "megatron-lm.git")
# What a skip says when the repository is missing: the one thing to do about it.
ENABLE_HEAD = (
    "set MEGATRON_LM_GIT to a Megatron-LM git repository holding "
    f"{HEAD_COMMIT[:12]} (and refs/pull/N/head for the pull-request tests), or put one at {CACHE}/"
    "megatron-lm.git"
)
# Every revision the goldens cover, oldest first; the venv's own (0.19.2) is not an overlay.
REVISIONS = ("0.18.2", "0.19.0", "0.19.2", "head")
INSTALLED = "0.19.2"


def overlay(version: str) -> Path:
    """``megatron-core==version`` installed (once) into its own target directory."""
    target = OVERLAYS / f"megatron-core-{version}"
    if (target / f"megatron_core-{version}.dist-info").is_dir():
        return target
    staging = OVERLAYS / f".megatron-core-{version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(staging),
            f"megatron-core=={version}",
        ],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"cannot install the megatron-core {version} overlay:\n{done.stderr[-2000:]}"
        )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # a complete overlay or none: an interrupted install is redone
    return target


def _git(*args: str, cwd: Path | None = None) -> None:
    subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=PIP_TIMEOUT_S
    )


def megatron_lm_tree(commit: str = HEAD_COMMIT) -> Path:
    """A clean Megatron-LM work tree at ``commit`` holding ``megatron/`` (made once); ``LookupError``
    when the repository at ``$MEGATRON_LM_GIT`` is absent or lacks the commit."""
    target = OVERLAYS / f"megatron-lm-{commit[:12]}"
    if (target / "megatron" / "core" / "package_info.py").is_file():
        return target
    if not (MEGATRON_LM_GIT / "objects").is_dir() and not (MEGATRON_LM_GIT / ".git").is_dir():
        raise LookupError(f"no Megatron-LM git repository at {MEGATRON_LM_GIT}: {ENABLE_HEAD}")
    staging = OVERLAYS / f".megatron-lm-{commit[:12]}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _git("clone", "-q", "--shared", "--no-checkout", str(MEGATRON_LM_GIT), str(staging))
        _git("sparse-checkout", "set", "--no-cone", "/megatron/", cwd=staging)
        _git("checkout", "-q", "--detach", commit, cwd=staging)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise LookupError(
            f"cannot check out {commit} from {MEGATRON_LM_GIT} ({exc.stderr.strip()}): {ENABLE_HEAD}"
        ) from None
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def pull_request_trees(number: int) -> tuple[Path, Path]:
    """Work trees of Megatron-LM pull request ``number``: its merge-base with ``HEAD_COMMIT`` and its
    head (the repository keeps pull requests as ``refs/pull/N/head``); ``LookupError`` without them."""
    try:
        head = _git_output("rev-parse", f"refs/pull/{number}/head")
        base = _git_output("merge-base", head, HEAD_COMMIT)
    except (subprocess.CalledProcessError, OSError) as exc:
        raise LookupError(
            f"no pull request {number} in {MEGATRON_LM_GIT} ({exc}): {ENABLE_HEAD}"
        ) from None
    return megatron_lm_tree(base), megatron_lm_tree(head)


def _git_output(*args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(MEGATRON_LM_GIT), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=PIP_TIMEOUT_S,
    ).stdout.strip()


def harness_on(tree: Path | None, *argv: str) -> subprocess.CompletedProcess:
    """``python -m harness.cli ARGV`` in this repository with ``tree`` (a Megatron Core tree: an
    overlay, a work tree, an edited copy) first on ``PYTHONPATH``; None: the venv's own."""
    repo = Path(__file__).resolve().parents[2]
    path = [str(tree)] if tree is not None else []
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=WHOLE_PROBE_TIMEOUT_S,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(repo)])},
    )


def installed_tree() -> Path:
    """The directory holding the installed ``megatron/`` (found without importing it)."""
    from harness.config.revisions import megatron_core_root

    core = megatron_core_root()
    assert core is not None, "megatron-core is not installed"
    return core.parent.parent


def edited_tree(tmp_path: Path, relative: str | Path, old: str, new: str) -> Path:
    """A copy of the installed Megatron Core with one edit of ``megatron/core/<relative>``: ``old``,
    which must stand there once, replaced by ``new``."""
    copy = tmp_path / "edited"
    shutil.copytree(
        installed_tree() / "megatron",
        copy / "megatron",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    source = copy / "megatron" / "core" / relative
    text = source.read_text()
    assert text.count(old) == 1, f"{relative} no longer holds {old!r} once"
    source.write_text(text.replace(old, new))
    return copy


def revision_path(revision: str) -> Path | None:
    """The directory to put first on ``PYTHONPATH`` for a revision of ``REVISIONS`` (None: the venv's)."""
    if revision == INSTALLED:
        return None
    return megatron_lm_tree() if revision == "head" else overlay(revision)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--path"]:
        path = revision_path(sys.argv[2])
        print("" if path is None else path)
        sys.exit(0)
    for version in BUMP_REHEARSALS:
        overlay(version)
    try:
        megatron_lm_tree()
    except LookupError as exc:
        print(f"overlays: no development head tree: {exc}", file=sys.stderr)
