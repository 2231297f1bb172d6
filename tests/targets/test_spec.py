"""Target specs: loading, knob validation, launch rendering, clear errors."""

import sys
from pathlib import Path

import pytest

from orchestrator.targets import TargetError, load_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "targets"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_example_targets_load_and_render(path):
    t = load_target(path)
    # An engine's own venv may be absent here; its interpreter is checked in test_engines.py.
    argv = t.render(t.baseline_knobs(), port=8123, model="/models/m", source=t.source, python=sys.executable)
    assert "8123" in argv and "/models/m" in argv
    assert Path(t.source).is_dir()


def test_knob_validation():
    t = load_target(EXAMPLES / "hfserve.toml")
    assert t.validate_knobs({"batching": "on"})["batching"] == "on"
    assert t.validate_knobs({}) == t.baseline_knobs()
    with pytest.raises(TargetError, match="unknown knob"):
        t.validate_knobs({"warp_speed": 9})
    with pytest.raises(TargetError, match="not one of"):
        t.validate_knobs({"dtype": "int1"})
    with pytest.raises(TargetError, match="outside"):
        t.validate_knobs({"batching": "on", "max_batch_size": 4096})
    # a knob inactive under the others (`when`) is left out, whatever its value
    assert "max_batch_size" not in t.validate_knobs({"batching": "off", "max_batch_size": 16})


@pytest.mark.parametrize(("text", "match", "loads"), [
    (None, "does not exist", False),
    ('name = "x"\nlaunch = "run"\n[knobs.a]\ntype = "categorical"\nchoices = [1, 2]\ndefault = 3\n', "knobs.a", False),
    ('name = "x"\nlaunch = "run --port {{ port }} --x {{ nope }}"\n', "undefined variable", True),
])
def test_bad_target_files(tmp_path, text, match, loads):
    """Refused when loaded, or (a template's undefined variable) when rendered."""
    f = tmp_path / "t.toml"
    if text is not None:  # None: the file is missing
        f.write_text(text)
    with pytest.raises(TargetError, match=match):
        target = load_target(f)
        assert loads, "a target file that must be refused loaded"
        target.render({}, port=1, model="m", source=".")
