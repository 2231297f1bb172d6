"""Workspace config: the shipped example parses, overrides apply, bad config is a clear error."""

import shutil
from pathlib import Path

import pytest

from orchestrator.config.workspace import ConfigError, Workspace

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "infergoal.toml"


def test_example_config_loads_and_overrides(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "infergoal.toml")
    ws = Workspace(tmp_path, ["bench.scale=0.5", 'proposer="scripted:x.json"', "seed=3"])
    c = ws.config
    assert c.bench.scale == 0.5 and c.bench.baseline_repeats == 2 and c.proposer == "scripted:x.json" and c.seed == 3
    assert ws.db_url == f"sqlite:///{tmp_path / '.infergoal' / 'infergoal.db'}"
    assert ws.kb_write_dir == tmp_path / "knowledge_base"
    assert ws.target_path.name == "hfserve.toml" and ws.target_path.is_file()


def test_defaults_without_a_config_file(tmp_path):
    ws = Workspace(tmp_path)
    assert ws.config.proposer == "search" and ws.config.host == "local"
    assert ws.kb_write_dir == tmp_path / ".infergoal" / "knowledge_base", "never the shipped seed"


@pytest.mark.parametrize("text, fragment", [
    ("bench = [", "not valid TOML"),
    ("[bench]\nscale = 'big'\n", "bench.scale"),
    ("colour = 'blue'\n", "colour"),  # a typo is refused, never silently ignored
    ("[bench]\nrepeat = 3\n", "bench.repeat"),
])
def test_bad_config(tmp_path, text, fragment):
    (tmp_path / "infergoal.toml").write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        Workspace(tmp_path)
