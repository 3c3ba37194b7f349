"""The Hub without a network (pipeline/checkpoint/hub.py): a cached snapshot or file is used, anything else is one
line with the command that downloads it."""

from __future__ import annotations

import pytest
from conftest import free_port

from pipeline.checkpoint.hub import hub_file, source_when_offline
from pipeline.contract.errors import ModelLoadError

CLOSED = "http://127.0.0.1:9"  # nothing listens on port 9 (discard): the Hub is unreachable at once


def test_offline_uses_the_cached_snapshot(tiny_dir, tmp_path):
    """A Hub id already in the cache loads from it when the Hub cannot be reached; another revision is refused."""
    repo = tmp_path / "hub" / "models--acme--tiny-sdxl"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(tiny_dir, target_is_directory=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    closed = f"http://127.0.0.1:{free_port()}"
    cache = str(tmp_path / "hub")
    assert source_when_offline("acme/tiny-sdxl", None, endpoint=closed, cache_dir=cache) == str(snapshot)
    with pytest.raises(ModelLoadError, match=r"run `hf download acme/tiny-sdxl --revision v2 --include"):
        source_when_offline("acme/tiny-sdxl", "v2", endpoint=closed, cache_dir=cache)


def test_unet_from_the_hub_offline_uses_the_cached_file(tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--unets"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    cached = repo / "snapshots" / commit / "unet.safetensors"
    cached.write_bytes(b"x")
    assert hub_file("acme/unets", "unet.safetensors", endpoint=CLOSED, cache_dir=str(tmp_path / "hub")) == str(cached)
    with pytest.raises(ModelLoadError, match=r"run `hf download acme/unets other.safetensors`"):
        hub_file("acme/unets", "other.safetensors", endpoint=CLOSED, cache_dir=str(tmp_path / "hub"))
