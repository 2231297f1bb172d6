"""Gates and bench judging an engine with `transformers serve`'s API: text only, no `ignore_eos`,
no token ids, no id prompts, no echo logprobs (gates/api.py). Each mode both ways: honest servers
pass, broken or cheating ones still fail, and every result names how it was judged.

The servers are the gate tests' hfserve configurations behind tests/gates/textonly_proxy.py, which
answers the way transformers serve 5.24 does (tests/targets/test_transformers_serve_real.py checks
the real one). Slow: it launches servers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gate_servers import Served, free_port, spawn, start_fleet, stop, stop_fleet, wait_healthy

from gates import GateResult, accuracy, integrity
from orchestrator.bench import run_scenario_sync
from orchestrator.bench.counts import count_violation
from orchestrator.bench.scenarios import Scenario

pytestmark = pytest.mark.slow
PROXY = Path(__file__).with_name("textonly_proxy.py")
TEXT_ONLY = {"ignore_eos": False, "token_ids": False, "prompt_ids": False, "echo_logprobs": False}
# text-only name -> (upstream in the gate fleet, proxy mode)
CASES = {"fp32": ("fp32", "honest"), "bf16": ("bf16", "honest"), "late_drop_layer": ("late_drop_layer", "honest"),
         "lie_usage_stream": ("proxy:lie_usage_stream", "honest"), "stop_early": ("fp32", "stop_early")}


@pytest.fixture(scope="module")
def textonly(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    work = tmp_path_factory.mktemp("textonly")
    upstream = start_fleet(sorted({u for u, _ in CASES.values()}), model_dir, work)
    proxies: dict[str, Served] = {}
    try:
        for name, (up, mode) in CASES.items():
            port = free_port()
            argv = [sys.executable, str(PROXY), "--upstream", upstream[up].url, "--port", str(port), "--mode", mode]
            proxies[name] = Served(f"http://127.0.0.1:{port}", spawn(argv, work / f"text-{name}.log"), model_dir,
                                   upstream[up].name)
        for name, s in proxies.items():
            wait_healthy(s.url, s.proc, work / f"text-{name}.log")
        yield proxies
    finally:
        for s in proxies.values():
            stop(s.proc)
        stop_fleet(upstream)


def _integrity(s: Served) -> GateResult:
    return integrity.check(s.url, served_model=s.name, tokenizer_dir=s.model_dir, seed=5, capabilities=TEXT_ONLY)


def _accuracy(s: Served, seed: int = 13) -> GateResult:
    return accuracy.check(s.url, served_model=s.name, reference_model_dir=s.model_dir, seed=seed, chat=True,
                          capabilities=TEXT_ONLY)


def test_the_proxy_refuses_what_transformers_serve_refuses(textonly: dict[str, Served]) -> None:
    s = textonly["fp32"]
    # Asked the usual (vLLM-like) way, the gates get the engine's refusals: a failure, not a pass.
    r = integrity.check(s.url, served_model=s.name, tokenizer_dir=s.model_dir, seed=5)
    assert r.status == "fail" and "HTTP 4" in r.reason, r.reason


@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_honest_text_only_engine_passes_and_says_how_it_was_judged(textonly: dict[str, Served], name: str) -> None:
    s = textonly[name]
    r = _integrity(s)
    assert r.status == "pass", r.reason
    assert "judged as:" in r.reason and r.details["api"]["token_ids"] is False
    a = _accuracy(s)
    assert a.status == "pass", (a.reason, a.details.get("metrics"))
    assert "generation check only" in a.reason
    assert {"kl_mean", "ppl_log_ratio", "containment_fail_rate"} <= set(a.details["not_measured"])
    assert "kl_mean" not in a.details["metrics"] and a.details["metrics"]["gen_prompts"] == 12
    # Text spelled back into ids with the reference: an fp32 server's continuations are the reference's own.
    if name == "fp32":
        assert a.details["metrics"]["gen_offtop_rate"] == 0.0 and a.details["metrics"]["gen_prefix_short"] == 0.0


def test_broken_decode_fails_on_the_generation_check_alone(textonly: dict[str, Served]) -> None:
    a = _accuracy(textonly["late_drop_layer"], seed=21)
    assert a.status == "fail", (a.reason, a.details.get("metrics"))
    assert "gen_offtop" in a.reason and "generation check only" in a.reason


def test_usage_lie_fails_integrity_from_re_tokenized_counts(textonly: dict[str, Served]) -> None:
    r = _integrity(textonly["lie_usage_stream"])
    assert r.status == "fail" and r.reason.startswith("usage:"), r.reason


def test_early_stop_passes_the_length_bound_but_not_the_reference(textonly: dict[str, Served]) -> None:
    s = textonly["stop_early"]
    r = _integrity(s)  # bounded lengths: a reply that says it stopped at EOS may be shorter
    assert r.status == "pass", r.reason
    assert "stopped at EOS" in next(c["detail"] for c in r.details["checks"] if c["name"] == "max_tokens")
    a = _accuracy(s)  # the reference never puts EOS near its top choice on the forged model
    assert a.status == "fail" and "stopped at EOS" in a.reason and "below its top choice" in a.reason, a.reason


def test_bench_counts_a_text_only_engine_and_keeps_strict_where_it_must(textonly: dict[str, Served]) -> None:
    sc = Scenario(name="t", prompt_tokens=48, output_tokens=24, num_requests=6, concurrency=2, warmup_requests=1)
    tok = str(textonly["fp32"].model_dir)

    def bench(name: str) -> dict[str, float]:
        s = textonly[name]
        res = run_scenario_sync(s.url, s.name, sc, tokenizer=tok, capabilities=TEXT_ONLY)
        assert res.metrics["completed"] == sc.num_requests, res.failures
        return res.metrics

    honest = bench("fp32")
    assert count_violation(honest, "t") is None
    assert honest["osl_pinned"] == 0.0 and honest["osl_eos_short"] == 0 and honest["osl_uncounted"] == 0
    assert honest["total_output_tokens"] == sc.num_requests * sc.output_tokens
    assert "usage.completion_tokens" in (count_violation(bench("lie_usage_stream"), "t") or "")
    # Early stops that say so are allowed and counted (per-token metrics use what was delivered);
    # whether such a stop is honest is the accuracy gate's call (the test above).
    early = bench("stop_early")
    assert early["osl_eos_short"] == sc.num_requests and count_violation(early, "t") is None
