"""The host's RAM-backed model copy: made once per model version, same folder name, off where asked."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.hosts import LocalHost
from orchestrator.remote.modelcache import DEFAULT_ROOT, cached_copy, cuda_host, resolve


def _model(root: Path) -> Path:
    m = root / "tiny-seed0-v1"
    m.mkdir(parents=True)
    (m / "config.json").write_text("{}")
    (m / "model.safetensors").write_bytes(b"w" * 1000)
    return m


def test_copied_once_then_reused_and_renewed_when_the_model_changes(tmp_path: Path) -> None:
    src, cache = _model(tmp_path / "disk"), tmp_path / "shm"
    first = cached_copy(src, cache)
    assert first.name == src.name and first.parent.parent == cache  # <cache>/<key>/<same name>
    assert (first / "model.safetensors").read_bytes() == b"w" * 1000
    assert cached_copy(src, cache) == first
    (src / "model.safetensors").write_bytes(b"v" * 1000)
    os.utime(src / "model.safetensors", ns=(1, 1))  # a new version: other mtime
    second = cached_copy(src, cache)
    assert second != first and not first.exists()  # the old version's memory is given back
    assert (second / "model.safetensors").read_bytes() == b"v" * 1000
    assert cached_copy(second, cache) == second  # already in the cache: used where it is


def test_the_site_places_only_the_model_and_only_when_on(tmp_path: Path) -> None:
    src, cache = _model(tmp_path / "disk"), tmp_path / "shm"
    on = LocalHost(tmp_path / "state", model_cache=str(cache)).site()
    assert Path(on.place(src, kind="model")).is_relative_to(cache)
    assert on.place(src, kind="tree") == str(src) and on.place(src, kind="reference") == str(src)
    off = LocalHost(tmp_path / "state", model_cache="off").site()
    assert off.place(src, kind="model") == str(src)
    assert resolve("auto") == (DEFAULT_ROOT if cuda_host() else None)
    assert resolve("off") is None and resolve("") is None and resolve("/x") == Path("/x")
