"""benchmarks/gpu/sol.py without a GPU: another model's floors from an earlier run's ceilings (what the GPU tool's ttb
step writes for the forged preset), which the speed-of-light check applies to that model's trials and only to them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gates.plausible import limits, model_numbers
from orchestrator.models.forge import PRESETS

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
SCEN = {"decode": {"prompt_tokens": 512, "output_tokens": 64, "num_requests": 8}}


def _config(preset: str) -> dict:
    """The config.json fields the forge writes for a preset (vocabulary: the preset's, as the forged one)."""
    p = PRESETS[preset]
    return {"hidden_size": p.hidden_size, "intermediate_size": p.intermediate_size, "vocab_size": p.vocab_size,
            "num_hidden_layers": p.num_hidden_layers, "num_attention_heads": p.num_attention_heads,
            "num_key_value_heads": p.num_key_value_heads}


def test_the_3b_floors_from_the_h200_ceilings_judge_the_3b_and_not_the_7b(tmp_path: Path) -> None:
    import sol

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(_config("3b-peaked")))
    out = tmp_path / "floors.json"
    sol.main(["--config", str(cfg), "--ceilings", str(GPU / "results/sol.json"), "--out", str(out)])
    got, h200 = json.loads(out.read_text()), json.loads((GPU / "results/sol.json").read_text())
    assert got["ceilings"] == h200["ceilings"]  # taken, not measured
    assert got["model"] == model_numbers(_config("3b-peaked")) and got["model"]["layers"] == 28
    assert got["floors"]["decode_tpot_ms"] < h200["floors"]["decode_tpot_ms"]  # fewer bytes a token than the 7B
    assert limits(got, _config("3b-peaked"), SCEN)["decode"]["tpot_ms_p50"][0] > 0
    # both ways: the 7B's record judges no 3B trial, and the 3B's no 7B trial
    assert limits(h200, _config("3b-peaked"), SCEN) == {} and limits(got, _config("7b-peaked"), SCEN) == {}
    # --preset gives the same shape as the forged config
    sol.main(["--preset", "3b-peaked", "--ceilings", str(GPU / "results/sol.json"), "--out", str(out)])
    assert json.loads(out.read_text())["model"] == got["model"]


def test_bad_ceilings_or_preset_say_so_in_one_line(tmp_path: Path) -> None:
    import sol

    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="--ceilings .*: no ceilings there"):
        sol.main(["--ceilings", str(bad)])
    with pytest.raises(SystemExit, match="no forge preset 'nope'"):
        sol.main(["--preset", "nope", "--ceilings", str(GPU / "results/sol.json")])
