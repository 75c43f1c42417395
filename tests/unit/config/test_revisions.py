"""Revision identity: the block every record and golden is pinned to, and the source fingerprint."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from mcore_checkout import copy_sources, git_head, mcore_checkout

from harness.cli import main
from harness.config.revisions import (
    REQUIRED_SOURCES,
    IdentityError,
    collect_revisions,
    fingerprint_sources,
    identity_problem,
    megatron_core_identity,
    megatron_core_root,
    source_fingerprint,
    vcs_commit,
)
from harness.golden.store import golden_root, labels_dir


def test_revisions_block_has_the_record_shape():
    revisions = collect_revisions()
    assert set(revisions) == {
        "torch",
        "megatron_core",
        "megatron_bridge",
        "transformer_engine",
        "cuda",
        "driver",
        "python",
    }
    assert revisions["torch"] == metadata.version("torch")
    identity = megatron_core_identity()
    assert revisions["megatron_core"]["version"] == identity["version"]
    # ``package`` appears only when the metadata disagrees with the imported code.
    assert set(revisions["megatron_core"]) - {"package"} == {"version", "commit", "fingerprint"}
    assert ("package" in revisions["megatron_core"]) == (identity["package"] is not None)
    assert revisions["megatron_core"]["fingerprint"] == source_fingerprint()
    # Bridge needs TE built against CUDA: absent on the CPU tier, and then reported as null.
    assert (revisions["megatron_bridge"] is None) == (not _installed("megatron-bridge"))


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_fingerprint_follows_every_derived_source(tmp_path):
    root = megatron_core_root()
    sources = fingerprint_sources(root)
    # Derived from the tree: the validator, the checkpoint code, and every module reading a recompute
    # field (the MoE experts among them), whatever this revision calls its files.
    assert set(REQUIRED_SOURCES) <= set(sources)
    assert any(path.startswith("transformer/moe/") for path in sources)
    copy = tmp_path / "core"
    copy_sources(root, copy)
    assert source_fingerprint(copy) == source_fingerprint()
    config = copy / "transformer" / "transformer_config.py"
    config.write_text(config.read_text().replace('"mlp",', '"mlp", "harness_new_label",', 1))
    assert source_fingerprint(copy) != source_fingerprint()


def test_a_new_module_reading_recompute_modules_joins_the_fingerprint(tmp_path):
    copy = tmp_path / "core"
    copy_sources(megatron_core_root(), copy)
    before = source_fingerprint(copy)
    module = copy / "transformer" / "harness_new_block.py"
    module.write_text(
        "def forward(config):\n    return 'harness_new_label' in config.recompute_modules\n"
    )
    assert "transformer/harness_new_block.py" in fingerprint_sources(copy)
    assert source_fingerprint(copy) != before
    module.write_text("def forward(config):\n    return None\n")  # unrelated code is not covered
    assert source_fingerprint(copy) == before


def test_a_missing_required_source_is_an_error_not_a_skip(tmp_path):
    copy = tmp_path / "core"
    copy_sources(megatron_core_root(), copy)
    (copy / "tensor_parallel" / "random.py").unlink()
    with pytest.raises(IdentityError, match="missing tensor_parallel/random.py"):
        source_fingerprint(copy)


def test_identity_describes_the_imported_code():
    identity = megatron_core_identity()
    import megatron.core

    assert Path(identity["root"]) == Path(megatron.core.__file__).resolve().parent
    assert identity_problem() is None
    # The version comes from the imported tree's package_info.py (read, never executed: executing
    # it would append the commit of whatever repository holds the file).
    assert identity["version"] == megatron.core.package_info.__shortversion__


def test_vcs_commit_comes_from_pep_610_direct_url(tmp_path):
    dist_info = tmp_path / "megatron_core-0.20.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Name: megatron-core\nVersion: 0.20.0\n")
    commit = "24bad8e677d22625d86ef2a54c9506b6e4992c93"
    direct_url = {
        "url": "https://github.com/NVIDIA/Megatron-LM",
        "vcs_info": {"vcs": "git", "commit_id": commit},
    }
    (dist_info / "direct_url.json").write_text(json.dumps(direct_url))
    assert vcs_commit(metadata.PathDistribution(dist_info)) == commit
    (dist_info / "direct_url.json").write_text(
        json.dumps({"url": "file:///wheels/x.whl", "archive_info": {}})
    )
    assert vcs_commit(metadata.PathDistribution(dist_info)) is None


def test_revisions_command_prints_the_block_as_json(capsys):
    import megatron.core.package_info
    import torch

    assert main(["revisions", "--json"]) == 0
    block = json.loads(capsys.readouterr().out)
    # Each value as the package itself states it, read here without the harness.
    assert block["torch"] == torch.__version__.split("+")[0]
    assert block["python"] == platform.python_version()
    assert block["megatron_core"]["version"] == megatron.core.package_info.__shortversion__
    for key, module in (
        ("megatron_bridge", "megatron.bridge"),
        ("transformer_engine", "transformer_engine"),
    ):
        assert (block[key] is None) == (importlib.util.find_spec(module) is None)
    fingerprint = block["megatron_core"]["fingerprint"]
    assert re.fullmatch("[0-9a-f]{16}", fingerprint), fingerprint
    assert main(["revisions"]) == 0
    assert f"fingerprint={fingerprint}" in capsys.readouterr().out


def _harness(repo: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_checkout_on_pythonpath_is_described_not_the_installed_wheel(tmp_path):
    repo = mcore_checkout(tmp_path)
    commit = git_head(repo)
    mcore = json.loads(_harness(repo, "revisions", "--json").stdout)["megatron_core"]
    assert mcore["commit"] == commit  # from the work tree that holds the imported code
    assert mcore["package"] == {
        "version": metadata.version("megatron-core"),
        "commit": None,
    }  # both are kept
    assert mcore["fingerprint"] == source_fingerprint(repo / "megatron" / "core")
    # Local changes: no commit describes the code any more (the fingerprint still does).
    config = repo / "megatron" / "core" / "transformer" / "transformer_config.py"
    config.write_text(config.read_text() + "\n# local edit\n")
    done = _harness(repo, "revisions")
    assert "commit=-" in done.stdout and "has local changes" in done.stdout


def test_an_unidentifiable_megatron_core_is_refused_before_anything_is_written(tmp_path):
    repo = mcore_checkout(tmp_path)
    (
        repo / "megatron" / "core" / "package_info.py"
    ).unlink()  # no version in the tree, none in metadata for it
    manifests = labels_dir(golden_root())
    before = sorted(p.name for p in manifests.iterdir())
    for argv in (["labels", "--write-manifest"], ["probe", "--all", "--write-golden"]):
        done = _harness(repo, *argv)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "has no version" in done.stderr, done.stderr
    assert sorted(p.name for p in manifests.iterdir()) == before


def test_revisions_imports_neither_torch_nor_megatron_core():
    # The CLI arms the CPU adapter's deferred torch.compile before MCore imports; looking MCore up (as
    # the identity does) must not set it off.
    probe = (
        "import io, sys, contextlib; from harness.cli import main; out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out): code = main(['revisions', '--json'])\n"
        "print(code, 'torch' in sys.modules, 'megatron.core' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.split() == ["0", "False", "False"], done.stderr[-2000:]


def test_a_package_commit_is_read_from_the_clean_git_work_tree_that_tracks_it(tmp_path):
    # How Megatron Bridge's commit is read when it is an editable or source install (no PEP 610 commit).
    from harness.config.revisions import _git_commit

    repo = mcore_checkout(tmp_path)
    package = repo / "megatron" / "core"
    assert _git_commit(package, tracked="__init__.py") == (git_head(repo), "")
    (package / "__init__.py").write_text("# edited\n")
    commit, note = _git_commit(package, tracked="__init__.py")
    assert commit is None and "has local changes" in note
    untracked = tmp_path / "site-packages" / "pkg"
    untracked.mkdir(parents=True)
    (untracked / "__init__.py").write_text("")
    assert _git_commit(untracked, tracked="__init__.py") == (None, "")
