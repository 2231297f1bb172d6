"""Fresh prompts: a measurement's own draw (`Scenario.prompt_seed`) asks nothing an earlier one asked,
keeps the lengths and the sharing its scenario asks for, and the same draw gives the same prompts (the
two halves of a paired round, a short pass and its continuation). `python -m orchestrator.bench --json`
prints one JSON document on stdout and nothing else."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import fakeserver
import pytest
from conftest import serving

from orchestrator.bench import Scenario, run_scenario
from orchestrator.bench.passes import join, rest_of
from orchestrator.bench.prompts import PromptFactory, derived_seed, fresh_seed, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def _bodies(sc: Scenario, **kw) -> list[dict]:
    app = fakeserver.make_app()

    async def go():
        async with serving(app) as url:
            return await run_scenario(url, "fake", sc, **kw)

    asyncio.run(go())
    return app[fakeserver.STATE].bodies


def test_two_draws_share_no_request_and_keep_lengths_and_the_prefix_within_one(tmp_path) -> None:
    tok = str(fakeserver.make_tokenizer(tmp_path / "tok"))
    sc = Scenario(name="p", prompt_tokens=24, output_tokens=2, num_requests=6, warmup_requests=2, prefix_tokens=16, seed=3)
    a = _bodies(sc.model_copy(update={"prompt_seed": 11}), tokenizer=tok)
    b = _bodies(sc.model_copy(update={"prompt_seed": 12}), tokenizer=tok)
    again = _bodies(sc.model_copy(update={"prompt_seed": 11}), tokenizer=tok)
    fixed = _bodies(sc, tokenizer=tok)
    prompts = [[tuple(x["prompt"]) for x in run] for run in (a, b, fixed)]
    assert all(len(p) == 24 for run in prompts for p in run)  # the scenario's lengths, warm-up included
    for run in prompts:  # one measurement's measured requests share the prefix, only it
        measured = run[2:]
        assert len({p[:16] for p in measured}) == 1 and len(set(measured)) == len(measured)
    # No request (warm-up or measured) of one draw is asked by another, nor by the fixed set; not even the prefix.
    assert not set(prompts[0]) & set(prompts[1]) and not set(prompts[0]) & set(prompts[2])
    assert prompts[0][2][:16] != prompts[1][2][:16]
    assert [x["prompt"] for x in again] == [x["prompt"] for x in a]  # the same draw: the same prompts, in order


def test_the_fixed_set_is_the_scenarios_own_and_a_text_draw_is_fresh_too() -> None:
    sc = Scenario(name="t", prompt_tokens=10, output_tokens=2, seed=5, prefix_tokens=4)
    assert PromptFactory(sc).make(3).prompt == PromptFactory(sc).make(3).prompt
    drawn = [PromptFactory(sc.model_copy(update={"prompt_seed": s})) for s in (1, 2)]
    assert drawn[0].make(3).prompt != drawn[1].make(3).prompt != PromptFactory(sc).make(3).prompt
    assert all(len(str(f.make(i).prompt).split()) == 10 for f in drawn for i in range(4))


def test_a_traces_blocks_are_shared_within_a_draw_never_across(tmp_path) -> None:
    tok = load_tokenizer(str(fakeserver.make_tokenizer(tmp_path / "tok")))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in (
        {"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 1, "input_length": 16, "output_length": 1, "hash_ids": [1, 2]})))
    sc = Scenario(name="tr", arrival="trace", trace_path=str(trace), trace_block_tokens=8, num_requests=2)
    from orchestrator.bench.scenarios import load_trace

    runs = []
    for s in (21, 22):
        f = PromptFactory(sc.model_copy(update={"prompt_seed": s}), tok)
        runs.append([f.from_trace(e).prompt for e in load_trace(trace)])
    for first, second in runs:
        assert second[:8] == first  # block 1, shared by the two requests of one measurement
    assert runs[0][0] != runs[1][0]


def test_derived_seeds_agree_for_the_same_keys() -> None:
    s = fresh_seed()
    assert 0 <= s < 2**32 and derived_seed(s, 1, 2) == derived_seed(s, 1, 2)
    assert len({derived_seed(s, 0, 1), derived_seed(s, 1, 0), derived_seed(s, 0, 2), s}) == 4


def test_a_join_keeps_its_passes_draw_and_refuses_two() -> None:
    sc = Scenario(name="c", prompt_tokens=6, output_tokens=2, num_requests=4, warmup_requests=0, prompt_seed=7)
    async def go(*scs):
        async with serving(fakeserver.make_app()) as url:
            return [await run_scenario(url, "fake", s) for s in scs]

    short = sc.model_copy(update={"part": (0, 2)})
    first, rest = asyncio.run(go(short, rest_of(sc, 2)))
    joined = join(sc.model_copy(update={"prompt_seed": None}), [first, rest])
    assert joined.scenario.prompt_seed == 7  # whose prompts the audit rebuilds
    (other,) = asyncio.run(go(rest_of(sc.model_copy(update={"prompt_seed": 8}), 2)))
    with pytest.raises(ValueError, match="seeds"):
        join(sc, [first, other])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fake_url():
    with fakeserver.launched(_free_port(), "--tpot-ms", "1") as url:
        yield url


@pytest.mark.parametrize("extra", [
    ["--scenario", "decode", "--num-requests", "4", "--output-tokens", "3", "--warmup-requests", "0", "--prompt-seed", "9"],
    ["--slo", "maximize throughput with p90 TTFT under 5 ms", "--rate", "50", "--output-tokens", "2", "--min-seconds", "0.2",
     "--min-requests", "4", "--confirmations", "0", "--precision", "0.5", "--num-requests", "8", "--warmup-requests", "0"],
], ids=["scenario", "slo"])
def test_json_prints_one_document_and_nothing_else(fake_url, tmp_path, extra) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "orchestrator.bench", "--url", fake_url, "--model", "fake", "--json",
           "--out", str(tmp_path), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # the whole of stdout: one document, nothing around it
    assert doc["completed"] >= 1 and ("steps" in doc) == ("--slo" in extra)
    said = ("SLO search", "req/s", "rate ") if "--slo" in extra else ("wrote",)
    assert all(s in out.stderr for s in said)  # what a person reads went to stderr
    plain = subprocess.run([c for c in cmd if c != "--json"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert plain.returncode == 0 and all(s in plain.stdout for s in said)  # without --json, on stdout
