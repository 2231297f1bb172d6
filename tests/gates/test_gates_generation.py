"""The generation check against real servers: honest decode paths pass, broken or cheating ones fail.

Every flawed server here scores prompts exactly (the teacher-forced metrics are those of the
float32 reference), so only the generation check can reject it. The calibration over 20 seeds is
``tests/gates/calibrate.py`` (numbers in ``tests/gates/README.md``); CI runs a few seeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_servers import Served

from gates import GateResult, accuracy, integrity

pytestmark = pytest.mark.slow


def _acc(server: Served, model_dir: Path, seed: int) -> GateResult:
    return accuracy.check(server.url, served_model=server.name, reference_model_dir=model_dir, seed=seed, chat=True)


@pytest.mark.parametrize("name", ["manual", "static", "sdpa", "bf16", "batched"])
def test_honest_decode_paths_pass(gen_fleet: dict[str, Served], model_dir: Path, name: str) -> None:
    result = _acc(gen_fleet[name], model_dir, seed=11)
    assert result.status == "pass", result.reason
    shapes = {r["shape"] for r in result.details["generation"]}
    # Both APIs, streamed and not, concurrent and one at a time.
    assert {"completions concurrent", "completions stream", "chat stream concurrent", "chat"} <= shapes


@pytest.mark.parametrize("name", ["batch_positions", "kv_quant3", "late_drop_layer", "proxy:split",
                                  "proxy:cache_len", "proxy:cache_prefix"])
def test_broken_generation_fails_though_scoring_is_exact(gen_fleet: dict[str, Served], model_dir: Path,
                                                         name: str) -> None:
    result = _acc(gen_fleet[name], model_dir, seed=21)
    metrics = result.details["metrics"]
    assert metrics["kl_mean"] < 1e-6, "prompt scoring is exact: the teacher-forced check cannot see it"
    assert result.status == "fail", (result.status, result.reason, metrics)
    assert "gen_" in result.reason and "hard limit" in result.reason


def test_usage_lying_only_when_streamed_is_caught(gen_fleet: dict[str, Served], model_dir: Path) -> None:
    proxy = gen_fleet["proxy:lie_usage_stream"]
    result = _acc(proxy, model_dir, seed=31)
    assert result.status == "fail" and "generation" in result.reason and "usage" in result.reason, result.reason
    assert "stream" in result.reason
    integ = integrity.check(proxy.url, served_model=proxy.name, tokenizer_dir=model_dir, seed=7)
    assert integ.status == "fail" and integ.reason.startswith("usage"), integ.reason


def test_length_keyed_cache_fails_the_no_cache_probe(gen_fleet: dict[str, Served], model_dir: Path) -> None:
    proxy = gen_fleet["proxy:cache_len"]
    result = integrity.check(proxy.url, served_model=proxy.name, tokenizer_dir=model_dir, seed=7)
    assert result.status == "fail" and result.reason.startswith("no_cache"), result.reason
    assert "less than the prompt" in result.reason
