"""Revision identity: the block every record and golden is pinned to, and the source fingerprint."""

from __future__ import annotations

import json
import shutil
from importlib import metadata

from harness.cli import main
from harness.config.revisions import (
    FINGERPRINT_SOURCES,
    collect_revisions,
    megatron_core_root,
    source_fingerprint,
    vcs_commit,
)


def test_revisions_block_has_the_record_shape():
    revisions = collect_revisions()
    assert set(revisions) == {
        "torch", "megatron_core", "megatron_bridge", "transformer_engine", "cuda", "driver", "python"}
    assert revisions["torch"] == metadata.version("torch")
    assert revisions["megatron_core"]["version"] == metadata.version("megatron-core")
    assert set(revisions["megatron_core"]) == {"version", "commit", "fingerprint"}
    assert revisions["megatron_core"]["fingerprint"] == source_fingerprint()
    # Bridge needs TE built against CUDA: absent on the CPU tier, and then reported as null.
    assert (revisions["megatron_bridge"] is None) == (not _installed("megatron-bridge"))


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_fingerprint_follows_every_listed_source(tmp_path):
    root = megatron_core_root()
    copy = tmp_path / "core"
    for relative in FINGERPRINT_SOURCES:
        source = root / relative
        assert source.exists(), f"fingerprint source {relative} is missing from megatron-core"
        target = copy / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    assert source_fingerprint(copy) == source_fingerprint()
    config = copy / "transformer" / "transformer_config.py"
    config.write_text(config.read_text().replace('"mlp",', '"mlp", "mhc",', 1))
    assert source_fingerprint(copy) != source_fingerprint()


def test_vcs_commit_comes_from_pep_610_direct_url(tmp_path):
    dist_info = tmp_path / "megatron_core-0.20.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Name: megatron-core\nVersion: 0.20.0\n")
    commit = "24bad8e677d22625d86ef2a54c9506b6e4992c93"
    direct_url = {"url": "https://github.com/NVIDIA/Megatron-LM", "vcs_info": {"vcs": "git", "commit_id": commit}}
    (dist_info / "direct_url.json").write_text(json.dumps(direct_url))
    assert vcs_commit(metadata.PathDistribution(dist_info)) == commit
    (dist_info / "direct_url.json").write_text(json.dumps({"url": "file:///wheels/x.whl", "archive_info": {}}))
    assert vcs_commit(metadata.PathDistribution(dist_info)) is None


def test_revisions_command_prints_the_block_as_json(capsys):
    assert main(["revisions", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == collect_revisions()
    assert main(["revisions"]) == 0
    assert "fingerprint=" in capsys.readouterr().out
