"""A scenario measured in two passes (a short pass, then its continuation) against one measured whole:
the same requests, prompts, counts and exports (orchestrator/bench/passes.py, `Scenario.part`)."""

from __future__ import annotations

import asyncio
import json

import fakeserver
import pytest
from conftest import serving

from orchestrator.bench import Scenario, run_scenario, write_exports
from orchestrator.bench.passes import join, rest_of
from orchestrator.bench.results import ScenarioResult
from orchestrator.bench.scenarios import arrival_offsets


def _run_all(app, scenarios):
    async def go():
        async with serving(app) as url:
            return [await run_scenario(url, "fake", sc) for sc in scenarios]

    return asyncio.run(go())


def _prompts(app, skip: int = 0) -> list[str]:
    """The prompts the server received, after `skip` bodies (the warm-up)."""
    return [json.dumps(b["prompt"]) for b in app[fakeserver.STATE].bodies[skip:]]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_continued_bench_sends_and_measures_what_a_single_full_bench_does(concurrency) -> None:
    sc = Scenario(name="c", prompt_tokens=12, output_tokens=4, num_requests=10, concurrency=concurrency,
                  warmup_requests=2, seed=5)
    single_app, cont_app = fakeserver.make_app(tpot_ms=1), fakeserver.make_app(tpot_ms=1)
    (single,) = _run_all(single_app, [sc])
    short = sc.model_copy(update={"name": "c@0.25", "part": (0, 4)})
    first, rest = _run_all(cont_app, [short, rest_of(sc, 4)])
    assert first.metrics["completed"] == 4 and rest.metrics["completed"] == 6
    assert rest.scenario.warmup_requests == 0  # warmed up once, by the short pass
    joined = join(sc, [first, rest], labels=("short", "rest"))
    # The same requests: same count, same indices, the same prompt for each (the seeded sequence continued).
    assert sorted(_prompts(single_app, 2)) == sorted(_prompts(cont_app, 2))
    assert sorted(_prompts(single_app)[:2]) == sorted(_prompts(cont_app)[:2])  # the same warm-up, once
    assert len(cont_app[fakeserver.STATE].bodies) == len(single_app[fakeserver.STATE].bodies) == 12
    assert [r.index for r in joined.requests] == [r.index for r in sorted(single.requests, key=lambda r: r.index)]
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens", "osl_short", "osl_mismatch",
                "tpot_ms_count", "ttft_ms_count", "itl_ms_count"):
        assert joined.metrics[key] == single.metrics[key], key
    assert set(joined.metrics) == set(single.metrics)  # the same metrics, no more, no fewer
    # Durations are the passes' own, summed: the time between them is not measured time.
    assert joined.metrics["duration_s"] == pytest.approx(first.metrics["duration_s"] + rest.metrics["duration_s"])
    assert joined.metrics["output_throughput"] == pytest.approx(40 / joined.metrics["duration_s"])
    assert joined.metrics["duration_aiperf_s"] <= joined.metrics["duration_s"] + 1e-9
    # Which requests came from which pass.
    assert [p["pass"] for p in joined.meta["passes"]] == ["short", "rest"]
    assert [p["requests"] for p in joined.meta["passes"]] == [[0, 4], [4, 10]]
    assert joined.scenario == sc and "part" not in joined.meta and "loop_lag_ms" not in joined.meta


def test_the_joined_result_exports_like_a_single_one(tmp_path) -> None:
    sc = Scenario(name="e", prompt_tokens=6, output_tokens=3, num_requests=6, concurrency=2, warmup_requests=1)
    first, rest = _run_all(fakeserver.make_app(), [sc.model_copy(update={"part": (0, 2)}), rest_of(sc, 2)])
    joined = join(sc, [first, rest])
    paths = write_exports(joined, tmp_path)
    vllm = json.loads(paths["vllm"].read_text())
    assert vllm["completed"] == 6 and vllm["num_prompts"] == 6 and len(vllm["ttfts"]) == 6
    lines = [json.loads(x) for x in paths["jsonl"].read_text().splitlines()]
    assert [x["index"] for x in lines] == list(range(6)) and all(x["t_sent_ns"] >= 0 for x in lines)
    # Read back (from a bench file, or over SSH), the times are the measured ones again.
    back = ScenarioResult.from_json(joined.to_json())
    assert [r.t_sent_ns for r in back.requests] == [r.t_sent_ns for r in joined.requests]
    assert back.metrics == joined.metrics


def test_an_open_loop_part_keeps_the_whole_schedule() -> None:
    sc = Scenario(name="p", prompt_tokens=4, output_tokens=2, num_requests=8, concurrency=0, arrival="poisson",
                  rate=200.0, warmup_requests=0, seed=3)
    whole = arrival_offsets(sc)
    first, rest = _run_all(fakeserver.make_app(), [sc.model_copy(update={"part": (0, 3)}), rest_of(sc, 3)])
    sent = [(r.t_scheduled_ns - rest.meta["origin_ns"]) / 1e9 for r in rest.requests]
    # The continuation's first request waits its own gap after request 3 of the whole schedule.
    assert sent[0] == pytest.approx(whole[3] - whole[2], abs=5e-3)
    assert joined_count(sc, first, rest) == 8


def joined_count(sc, *parts) -> int:
    return int(join(sc, list(parts)).metrics["completed"])


def test_passes_that_miss_or_repeat_a_request_are_refused() -> None:
    sc = Scenario(name="x", prompt_tokens=4, output_tokens=2, num_requests=5, concurrency=1, warmup_requests=0)
    first, rest = _run_all(fakeserver.make_app(), [sc.model_copy(update={"part": (0, 2)}), rest_of(sc, 3)])
    with pytest.raises(ValueError, match="not each of"):
        join(sc, [first, rest])
