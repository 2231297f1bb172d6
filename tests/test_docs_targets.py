"""The target in docs/guide/targets.md ("Your engine on a remote GPU") is a valid target: it loads, its
baseline renders to the command the guide describes, and its constraint refuses what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.targets.spec import ConstraintViolated, load_target

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "targets.md"


def _guide_target(tmp_path: Path) -> Path:
    blocks = re.findall(r"```toml\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 1, "the guide holds one example target"
    f = tmp_path / "engine" / "myengine.toml"
    f.parent.mkdir()
    f.write_text(blocks[0])
    return f


def test_the_guides_target_loads_and_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MY_ENGINE_LOG", raising=False)
    t = load_target(_guide_target(tmp_path))
    assert t.source == str((tmp_path / "engine").resolve())  # relative to the file's folder
    assert t.model == "/data/models/my-7b"
    argv = t.render(t.baseline_knobs(), port=8000, model=t.model, source=t.source, python="/opt/venv/bin/python")
    assert argv[:3] == ["taskset", "-c", "0-7"]
    assert argv[3:] == ["/opt/venv/bin/python", "-m", "my_engine.serve", "--model", "/data/models/my-7b", "--port",
                        "8000", "--served-model-name", "my-7b", "--max-batch", "8"]
    assert t.launch_env(t.baseline_knobs()) == {"MY_ENGINE_LOG": "warning"}
    monkeypatch.setenv("MY_ENGINE_LOG", "debug")  # {{ env.X }} reads the environment infergoal runs in
    assert t.launch_env(t.baseline_knobs()) == {"MY_ENGINE_LOG": "debug"}


def test_the_guides_constraint_refuses_graphs_past_batch_32(tmp_path: Path) -> None:
    t = load_target(_guide_target(tmp_path))
    assert t.validate_knobs({"graphs": True, "max_batch": 32})["graphs"] is True
    with pytest.raises(ConstraintViolated, match="captured up to batch 32"):
        t.validate_knobs({"graphs": True, "max_batch": 64})
