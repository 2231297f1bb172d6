"""The speed-of-light check as a pure function: floors per model shape and scenario size, the margin."""

import json
from pathlib import Path

import pytest
import tomllib

from gates import plausible
from orchestrator.bench.scenarios import Scenario
from orchestrator.models.forge import PRESETS

ROOT = Path(__file__).resolve().parents[2]
SOL = json.loads((ROOT / "benchmarks/gpu/results/sol.json").read_text())  # measured on the H200, 7B shape
SHAPE = ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads")
CFG_7B = {k: getattr(PRESETS["7b-peaked"], k) for k in SHAPE}
CFG_TINY = {k: getattr(PRESETS["tiny"], k) for k in SHAPE}


def test_the_formulas_reproduce_the_recorded_h200_floors():
    scen = tomllib.loads((ROOT / "benchmarks/gpu/scenarios.toml").read_text())
    assert plausible.model_numbers(CFG_7B) == SOL["model"]
    assert plausible.floors(scen, SOL["model"], SOL["ceilings"]) == pytest.approx(SOL["floors"])


def test_floors_follow_the_trials_model_and_scenario_size():
    gpu = {"prefill": Scenario(name="prefill", prompt_tokens=4096, output_tokens=4, num_requests=8),
           "small": Scenario(name="small", prompt_tokens=512, output_tokens=4, num_requests=8)}
    lims = plausible.limits(SOL, CFG_7B, gpu)
    assert lims["prefill"]["ttft_ms_p50"] == (pytest.approx(SOL["floors"]["prefill_ttft_ms"]), False)
    # A scaled-down prompt gets its own, lower floor: the 4096-token floor would call it a cheat.
    assert lims["small"]["ttft_ms_p50"][0] < lims["prefill"]["ttft_ms_p50"][0] / 5
    assert lims["prefill"]["output_throughput"][1] is True
    # A 7B's floors never judge a tiny model; a record without ceilings or shape judges nothing.
    assert plausible.limits(SOL, CFG_TINY, gpu) == {}
    assert plausible.limits({"floors": SOL["floors"]}, CFG_7B, gpu) == {}
    assert plausible.limits(SOL, None, gpu) == {}
    trace = {"t": Scenario(name="t", arrival="trace", trace_path="x.jsonl")}
    assert plausible.limits(SOL, CFG_7B, trace) == {}


LIMS = {"decode": {"tpot_ms_p50": (3.41, False), "ttft_ms_p50": (80.0, False)},
        "throughput": {"output_throughput": (3391.0, True)}}


def test_a_measurement_past_the_floor_beyond_the_margin_is_named():
    r = plausible.check({"decode": {"tpot_ms_p50": 0.02, "ttft_ms_p50": 90.0}}, LIMS, noise=0.04)
    assert r.status == "fail" and r.gate == "speed_of_light"
    assert r.reason.startswith("faster than the hardware allows: measurement or cheat: decode tpot_ms_p50 0.02 ms")
    assert "floor 3.41 ms" in r.reason and "margin 19.0%" in r.reason  # noise 4% + slack 15%
    assert r.details["noise"] == 0.04 and r.details["slack"] == 0.15 and len(r.details["checked"]) == 2
    assert len(r.reason) < 160  # `infergoal why` shows the first 160 characters of an error
    r = plausible.check({"throughput": {"output_throughput": 5000.0}}, LIMS)
    assert r.status == "fail" and "output_throughput 5000 tok/s, floor 3391 tok/s" in r.reason


def test_inside_the_margin_or_slower_passes_and_nothing_measured_says_nothing():
    # 3.0 ms is 1.14x the TPOT floor's speed: inside 15% slack, outside 10%.
    assert plausible.check({"decode": {"tpot_ms_p50": 3.0}}, LIMS).status == "pass"
    tight = {"speed_of_light": {"slack": 0.10}}
    assert plausible.check({"decode": {"tpot_ms_p50": 3.0}}, LIMS, thresholds=tight).status == "fail"
    # The measured noise widens the margin.
    assert plausible.check({"decode": {"tpot_ms_p50": 3.0}}, LIMS, noise=0.05, thresholds=tight).status == "pass"
    assert plausible.check({"decode": {"tpot_ms_p50": 30.0}}, LIMS).status == "pass"
    assert plausible.check({"other": {"tpot_ms_p50": 0.01}}, LIMS) is None
    assert plausible.check({"decode": {"tpot_ms_p50": 0.01}}, {}) is None


def test_record_of_keeps_what_the_check_needs():
    rec = plausible.record_of(SOL, "sol.json")
    assert rec["floors"] == SOL["floors"] and rec["model"] == SOL["model"] and rec["source"] == "sol.json"
    assert rec["ceilings"]["copy_bytes_per_s"] == SOL["ceilings"]["copy_bytes_per_s"]
    with pytest.raises(ValueError, match="no `floors` object"):
        plausible.record_of({"ceilings": {}}, "x.json")
