"""Trusting measurements: the decisions, given host state measured for real (burners the test owns).

Fast: no servers. The end-to-end versions (a real target under real load) are in
tests/test_noisy_host.py.
"""

import contextlib
import time

import pytest
from burners import burning
from fake_target import write_fake_target

from gates.performance import bootstrap_interval, pair_speedups, paired_check
from orchestrator.bench import builtin_scenarios
from orchestrator.bench.saturation import saturation_reasons
from orchestrator.bench.timeline import RequestRecord
from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.hosts import LocalHost
from orchestrator.hosts.measure import TrustPolicy, busier_reason, idle_state, scale_refusal, state_change
from orchestrator.hosts.state import RunQueueSampler, window
from orchestrator.runs import start_run
from orchestrator.store import Store

POLICY = TrustPolicy()


# --- paired ratio and its bound -------------------------------------------------------------
def test_paired_ratio_passes_only_when_the_lower_bound_clears_the_goal():
    # Baseline throughput drifts 2x across rounds (the machine got quieter); each pair shares it.
    base, cand = [100.0, 150.0, 200.0], [440.0, 660.0, 880.0]
    sp = pair_speedups(base, cand, higher_better=True)
    assert sp == pytest.approx([4.4, 4.4, 4.4])
    assert paired_check(sp, required=4.0).verdict == "pass"
    assert paired_check(sp, required=5.0).verdict == "fail"
    # Unpaired, the same numbers would say anything from 2.2x to 8.8x.
    assert max(cand) / min(base) == pytest.approx(8.8) and min(cand) / max(base) == pytest.approx(2.2)


def test_paired_ratio_straddling_the_goal_asks_for_more_rounds_then_fails():
    sp = [3.6, 4.5, 4.1]
    assert paired_check(sp, required=4.0, can_add_rounds=True).verdict == "remeasure"
    r = paired_check(sp, required=4.0, can_add_rounds=False)
    assert r.verdict == "fail" and r.lo < 4.0 < r.hi and r.wins == 2


def test_a_round_far_from_the_others_is_an_outlier_either_way():
    from math import log

    from orchestrator.trial.paired import _outlier
    # The mirror test's run: one candidate half stalled (1.37x among rounds of 2.2-2.4x).
    assert _outlier([log(x) for x in (1.37, 2.34, 2.43)]) == 0
    assert _outlier([log(x) for x in (2.34, 3.40, 2.43, 2.20)]) == 1  # a stalled baseline half: too good
    # Honest rounds on a shared host spread +-10%: none is an outlier; two rounds cannot say which is odd.
    assert _outlier([log(x) for x in (2.1, 2.34, 2.43, 2.2, 2.5)]) is None
    assert _outlier([log(1.0), log(3.0)]) is None


def test_bootstrap_interval_is_deterministic_and_brackets_the_geomean():
    sp = [1.9, 2.1, 2.0, 2.3, 1.8]
    lo, hi = bootstrap_interval(sp, confidence=0.9)
    assert (lo, hi) == bootstrap_interval(sp, confidence=0.9)
    assert lo < 2.0 < hi and lo > 1.8 and hi < 2.3
    assert pair_speedups([10.0], [5.0], higher_better=False) == [2.0]  # latency: lower is better


# --- host state, measured: burners the test starts and stops --------------------------------
def test_burners_show_up_as_other_tenants_and_a_busier_host(tmp_path):
    host = LocalHost(tmp_path)
    quiet = idle_state(host, 1.0)
    with burning():
        busy = idle_state(host, 1.0)
    # The burners are 2*ncpu+2 runnable processes: at least ~2 more runnable tasks per CPU.
    assert busy["foreign_load"] - quiet["foreign_load"] > 1.0, (quiet, busy)
    assert busy["busy"] > 0.9
    assert busier_reason(busy | {"own_load": 0.5}, quiet | {"own_load": 0.5}, POLICY)
    assert busier_reason(quiet | {"own_load": 0.5}, quiet | {"own_load": 0.5}, POLICY) is None
    # A baseline measured under the burners no longer describes the host once they stop: re-measure.
    assert state_change(quiet, busy | {"own_load": 0.5}, POLICY)
    assert state_change(busy, quiet | {"own_load": 0.5}, POLICY)


def test_an_idle_probe_pauses_the_hosts_own_work(tmp_path):
    """A standby importing is the host's own work, not another tenant: the probe runs inside
    `host.quiet()` (which pauses it), so its imports never read as a busier host."""
    seen = []

    class Host(LocalHost):
        @contextlib.contextmanager
        def quiet(self):
            seen.append("paused")
            yield
            seen.append("resumed")

        def host_state(self, proc=None, *, gpus=True):
            seen.append("sample")
            return super().host_state(proc, gpus=gpus)

    idle_state(Host(tmp_path), 0.3)
    assert seen[0] == "paused" and seen[-1] == "resumed" and "sample" in seen[1:-1], seen
    assert seen.count("paused") == 1 and "sample" not in (seen[0], seen[-1])


def test_host_state_records_load_steal_and_the_client_cpu(tmp_path):
    host = LocalHost(tmp_path)
    before = host.host_state()
    with RunQueueSampler(lambda: host.host_state(gpus=False), period_s=0.05) as rq:
        t0 = time.process_time()
        while time.process_time() - t0 < 0.5:  # the "client" busy in this process
            pass
    win = window(before, host.host_state()) | rq.loads(before["cpu_count"])
    assert {"load1", "load5", "steal", "busy", "foreign_cpu", "client_cpu", "foreign_load", "gpus"} <= set(win)
    # The client's CPU is this process's: the 0.5 s just burnt (on a loaded host it takes longer wall time).
    assert win["client_cpu"] * win["wall_s"] == pytest.approx(0.5, abs=0.15)
    assert 0.0 <= win["steal"] <= 1.0 and rq.samples


# --- the client's own saturation ------------------------------------------------------------
def _rec(i, chunks):
    r = RequestRecord(index=i, prompt_tokens=8, output_tokens=8, t_first_token_ns=chunks[0], t_last_token_ns=chunks[-1],
                      chunk_ns=list(chunks), usage_completion_tokens=8, success=True, done_seen=True)
    return r


def test_saturated_client_signs():
    streamed = [_rec(i, [1000 * i + k for k in range(8)]) for i in range(10)]
    burst = [_rec(i, [1000 * i] * 8) for i in range(10)]
    assert saturation_reasons({"loop_lag_ms_p50": 0.4}, streamed, 0.3) == []
    assert "lagged" in saturation_reasons({"loop_lag_ms_p50": 17.0}, streamed, 0.3)[0]
    assert "core" in saturation_reasons({"loop_lag_ms_p50": 0.4}, streamed, 0.97)[0]
    assert "one burst" in saturation_reasons({"loop_lag_ms_p50": 0.4}, burst, 0.3)[0]


# --- a bench too small to resolve the goal is refused up front -------------------------------
def test_bench_scale_that_cannot_resolve_the_goal_is_refused_with_the_reason():
    tiny = builtin_scenarios(0.2)
    why = scale_refusal(tiny, ["decode"], POLICY)
    assert why and "decode" in why and "raise bench.scale" in why
    assert scale_refusal(builtin_scenarios(1.0), ["decode", "throughput"], POLICY) is None
    # With the baseline measured: a 5% step at 30% per-request spread needs (2*0.3/0.05)^2 = 144 requests.
    m = {"decode": {"duration_s": 3.0, "tpot_ms_mean": 10.0, "tpot_ms_std": 3.0}}
    why = scale_refusal(builtin_scenarios(1.0), ["decode"], POLICY, m, margin=0.05, per_request={"decode": "tpot_ms"})
    assert why and ">= 144" in why and "tpot_ms spread (30%)" in why
    assert scale_refusal(builtin_scenarios(1.0), ["decode"], POLICY, m, margin=0.5, per_request={"decode": "tpot_ms"}) is None
    # Throughput has no per-request spread to judge: its noise is what the paired rounds measure.
    assert scale_refusal(builtin_scenarios(1.0), ["decode"], POLICY, m, margin=0.05) is None
    short = {"decode": {"duration_s": 0.2}}
    assert "shorter" in scale_refusal(builtin_scenarios(1.0), ["decode"], POLICY, short, margin=0.5)


def test_a_run_at_a_scale_too_small_is_refused_before_any_server_starts(tmp_path, tiny_model):
    target = write_fake_target(tmp_path / "fake.toml")
    ws = Workspace(tmp_path, [f'target="{target}"', "bench.scale=0.2", "gates.accuracy=false", "gates.integrity=false"])
    out = start_run(ws, parse_goal("beat the baseline by 20% on TPOT"))
    assert out.stop_reason.startswith("Refused: scenario 'decode' has 3 measured requests")
    assert "raise bench.scale" in out.stop_reason
    assert Store(ws.db_url).list_trials(out.run_id) == []


# --- paired rounds on the product path: an outlier that comes back is the servers' spread -----
def _paired_with_ratios(tmp_path, monkeypatch, ratios):
    """`run_paired` with `run_trial` replaced: round i's candidate measures ratios[i] x the baseline's 100."""
    from orchestrator.core.candidate import Candidate
    from orchestrator.trial import paired
    from orchestrator.trial.context import TrialContext, TrialResult

    goal = parse_goal("improve throughput by 2x")
    label = f"{goal.objectives[0].scenario}:{goal.objectives[0].key}"
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    run = store.create_run("r", goal.text, goal.model_dump(), goal.digest, {}, {}, "local", "search")
    cand_row = store.create_trial(run.id, 1, commit="", knobs={"n": 2}, rationale="", proposer="search")
    it = iter(ratios)
    drawn: list[tuple[str, int]] = []

    def fake_run_trial(ctx, row, c, **kw):
        drawn.append((c.rationale, kw["prompts"]))
        value = 100.0 if c.rationale.endswith("baseline") else 100.0 * next(it)
        return TrialResult(samples={label: [value]})

    monkeypatch.setattr(paired, "run_trial", fake_run_trial)
    numbers = iter(range(2, 100))
    ctx = TrialContext(run_id=run.id, goal=goal, target=None, host=None, store=store, model_dir=tmp_path,
                       reference_dir=tmp_path, scenarios={}, run_dir=tmp_path)

    def create(c):
        return store.create_trial(run.id, next(numbers), commit="", knobs=c.knobs, rationale=c.rationale, proposer="paired")

    out = paired.run_paired(ctx, cand_row, Candidate({"n": 2}), {"n": 1}, create)
    # Both halves of a round ask one draw of prompts, and every round (a redone one too) another.
    halves = list(zip(drawn[::2], drawn[1::2], strict=True))
    assert all(a[0].endswith("baseline") and b[0].endswith("candidate") and a[1] == b[1] for a, b in halves)
    assert len({a[1] for a, _ in halves}) == len(halves) >= 3
    return out, store, run.id


def test_a_one_off_outlier_round_is_redone(tmp_path, monkeypatch):
    out, store, rid = _paired_with_ratios(tmp_path, monkeypatch, [20.0, 19.5, 11.0, 20.5])
    assert out.met and out.rounds == 3 and out.score == pytest.approx((20.0 * 19.5 * 20.5) ** (1 / 3))
    assert [e.kind for e in store.events(rid) if e.kind.startswith("measure.")] == ["measure.redo"]


def test_an_outlier_that_comes_back_is_kept_not_redone_until_the_budget_runs_out(tmp_path, monkeypatch):
    # The H200 2B run's rounds: 22x, 19.5x, 11.4x, then 11.4x again on the redo (before: redone again
    # and again). Kept: judged over 22, 19.5, 11.4 (the goal, 2x, is met by all of them).
    out, store, rid = _paired_with_ratios(tmp_path, monkeypatch, [22.0, 19.5, 11.4, 11.4, 11.3, 11.2])
    kinds = [e.kind for e in store.events(rid) if e.kind.startswith("measure.")]
    assert kinds == ["measure.redo", "measure.spread"], kinds
    assert out.met and out.rounds == 3 and out.score == pytest.approx((22.0 * 19.5 * 11.4) ** (1 / 3))
