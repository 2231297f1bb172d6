"""End-to-end load generator runs against the in-process fake server (fast, no model)."""

from __future__ import annotations

import asyncio
import json

import fakeserver
import pytest
from conftest import serving

from orchestrator.bench import Scenario, run_scenario, write_exports
from orchestrator.bench.counts import count_violation


def run(app, sc: Scenario, **kw):
    async def go():
        async with serving(app) as url:
            return await run_scenario(url, "fake", sc, **kw)

    return asyncio.run(go())


def test_closed_loop_success_and_timing() -> None:
    sc = Scenario(name="t", prompt_tokens=16, output_tokens=5, num_requests=6, concurrency=2, warmup_requests=2)
    res = run(fakeserver.make_app(ttft_ms=30, tpot_ms=10), sc)
    m = res.metrics
    assert m["completed"] == 6 and m["failed"] == 0 and res.failures == {}
    assert len(res.requests) == 6  # warmup requests are not in the results
    # Lower bounds are the server's delays; upper bounds are loose because CI machines are shared.
    assert 29 <= m["ttft_ms_p50"] < 90
    assert 9 <= m["tpot_ms_mean"] < 30
    assert m["total_output_tokens"] == 30 and m["osl_mismatch"] == 0
    assert all(r.usage_prompt_tokens == 16 for r in res.requests)  # word prompts: 1 word = 1 fake token


def test_warmup_goes_to_the_server_but_not_the_results() -> None:
    app = fakeserver.make_app()
    sc = Scenario(name="w", prompt_tokens=4, output_tokens=2, num_requests=3, concurrency=1, warmup_requests=4)
    res = run(app, sc)
    assert app[fakeserver.STATE].count == 7 and len(res.requests) == 3


@pytest.mark.parametrize("fault,reason", [("http500", "http_500"), ("reset", "connection_error"),
                                          ("malformed", "malformed_sse"), ("hang", "timeout")])
def test_server_failures_become_failed_requests(fault: str, reason: str) -> None:
    app = fakeserver.make_app(fault=fault, fault_every=2)
    sc = Scenario(name="f", prompt_tokens=4, output_tokens=4, num_requests=6, concurrency=2, warmup_requests=0)
    res = run(app, sc, timeout_s=1.0)
    assert res.metrics["failed"] == 3 and res.metrics["completed"] == 3
    assert res.failures == {reason: 3}
    assert all(r.error for r in res.requests if not r.success)
    assert res.metrics["ttft_ms_count"] == 3  # latency stats only from the successes


def test_server_down_is_a_result_not_an_exception() -> None:
    sc = Scenario(name="down", prompt_tokens=4, output_tokens=2, num_requests=3, warmup_requests=0)
    res = asyncio.run(run_scenario("http://127.0.0.1:9", "fake", sc, timeout_s=2))
    assert res.metrics["failed"] == 3 and set(res.failures) == {"connection_error"}


def test_chat_with_role_only_first_chunk() -> None:
    sc = Scenario(name="c", prompt_tokens=8, output_tokens=3, num_requests=2, warmup_requests=0)
    res = run(fakeserver.make_app(ttft_ms=40, empty_first_chunk=True), sc, api="chat")
    r = res.requests[0]
    assert r.success and r.client_chunks == 3
    assert r.first_chunk_ns < r.ttft_ns  # role-only chunk arrives before the first content
    assert r.ttft_ns / 1e6 >= 39


def test_ignore_eos_pins_output_length() -> None:
    # The fake server stops at 2 tokens unless ignore_eos is sent; we always send it.
    sc = Scenario(name="e", prompt_tokens=4, output_tokens=7, num_requests=2, warmup_requests=0)
    res = run(fakeserver.make_app(eos_after=2), sc)
    assert res.metrics["total_output_tokens"] == 14 and res.metrics["osl_short"] == 0


def test_tokenizer_prompts_are_exact_token_ids_with_shared_prefix(tmp_path) -> None:
    tok_dir = fakeserver.make_tokenizer(tmp_path / "tok")
    sc = Scenario(name="p", prompt_tokens=20, output_tokens=3, num_requests=4, warmup_requests=0,
                  prefix_tokens=12, seed=3)
    app = fakeserver.make_app()
    res = run(app, sc, tokenizer=str(tok_dir))
    seen = [b["prompt"] for b in app[fakeserver.STATE].bodies]
    assert len(seen) == 4
    assert res.metrics["isl_mismatch"] == 0 and res.metrics["osl_mismatch"] == 0
    assert all(isinstance(p, list) and len(p) == 20 for p in seen)
    assert all(p[:12] == seen[0][:12] for p in seen)  # shared prefix
    assert len({tuple(p[12:]) for p in seen}) == 4  # unique suffixes
    assert all(r.client_tokens == 3 for r in res.requests)  # counted from the returned token ids
    assert all(len(r.output_ids) == 3 and all(isinstance(i, int) for i in r.output_ids) for r in res.requests)
    # and kept, for the bench audit, through the result's JSON (a remote host sends it back so)
    back = type(res).from_dict(json.loads(res.to_json()))
    assert [r.output_ids for r in back.requests] == [r.output_ids for r in res.requests]


def test_open_loop_constant_rate_and_exports(tmp_path) -> None:
    sc = Scenario(name="o", prompt_tokens=4, output_tokens=2, num_requests=10, concurrency=0,
                  arrival="constant", rate=50.0, warmup_requests=0)
    res = run(fakeserver.make_app(ttft_ms=5), sc)
    assert res.metrics["completed"] == 10
    assert res.metrics["achieved_rate"] == pytest.approx(50.0, rel=0.15)
    assert res.metrics["duration_s"] >= 9 / 50
    paths = write_exports(res, tmp_path)
    vllm = json.loads(paths["vllm"].read_text())
    assert vllm["completed"] == 10 and len(vllm["ttfts"]) == 10 and "p99_ttft_ms" in vllm
    ap = json.loads(paths["aiperf"].read_text())
    assert paths["aiperf"].name == "profile_export_aiperf.json"
    assert ap["time_to_first_token"]["avg"] == pytest.approx(res.metrics["ttft_ms_mean"])
    lines = paths["jsonl"].read_text().splitlines()
    assert len(lines) == 10 and json.loads(lines[0])["ttft_ms"] > 0
    back = type(res).from_json(res.to_json())
    assert back.metrics == res.metrics and len(back.requests) == 10


def test_trace_replay(tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]},
            {"timestamp": 100, "input_length": 12, "output_length": 3, "hash_ids": [1, 2]},
            {"timestamp": 200, "input_length": 6, "output_length": 1, "hash_ids": [3]}]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    sc = Scenario(name="tr", arrival="trace", trace_path=str(trace), trace_block_tokens=8,
                  num_requests=3, concurrency=0, warmup_requests=0)
    res = run(fakeserver.make_app(), sc)
    assert [r.usage_prompt_tokens for r in res.requests] == [10, 12, 6]
    assert [r.osl for r in res.requests] == [2, 3, 1]
    assert res.metrics["duration_s"] >= 0.2


def test_prompt_factory_seeded_and_warmup_separate(tmp_path) -> None:
    from orchestrator.bench.prompts import PromptFactory

    tok = fakeserver.make_tokenizer(tmp_path / "tok")
    sc = Scenario(name="pf", prompt_tokens=10, output_tokens=2, seed=5, prefix_tokens=4)
    a, b = PromptFactory(sc, None), PromptFactory(sc, None)
    assert a.make(3).prompt == b.make(3).prompt  # same seed -> same prompts
    assert a.make(3).prompt != a.make(4).prompt
    assert len(str(a.make(0).prompt).split()) == 10
    assert a.make(0, warmup=True).prompt != a.make(0).prompt  # warmup primes no prefix cache
    from orchestrator.bench.prompts import load_tokenizer

    t = load_tokenizer(str(tok))
    chat = PromptFactory(sc, t, text=True).make(1)
    assert isinstance(chat.prompt, str)
    assert len(t.encode(chat.prompt, add_special_tokens=False)) == 10  # exact after re-encoding


def test_prefill_one_token_end_to_end() -> None:
    sc = Scenario(name="pre", prompt_tokens=64, output_tokens=1, num_requests=3, warmup_requests=1)
    res = run(fakeserver.make_app(ttft_ms=15), sc)
    m = res.metrics
    assert m["completed"] == 3 and m["tpot_ms_count"] == 0 and m["itl_ms_count"] == 0
    assert m["e2e_ms_mean"] == pytest.approx(m["ttft_ms_mean"])


@pytest.mark.parametrize("fault, metric", [("usage_lie", "osl_mismatch"), ("short", "osl_short")])
def test_token_counts_from_ids_make_a_lying_or_short_server_invalid(fault: str, metric: str) -> None:
    sc = Scenario(name="n", prompt_tokens=4, output_tokens=5, num_requests=4, warmup_requests=0)
    honest = run(fakeserver.make_app(), sc)
    assert count_violation(honest.metrics, "n") is None
    assert all(r.client_tokens == 5 for r in honest.requests)  # one id per streamed token
    res = run(fakeserver.make_app(fault=fault, fault_every=2), sc)
    assert res.metrics[metric] == 2 and res.metrics["failed"] == 0  # the requests themselves succeed
    verdict = count_violation(res.metrics, "n")
    assert verdict is not None and verdict.startswith("token counts in n:")
