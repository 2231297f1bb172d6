"""Multi-fidelity screening (orchestrator/trial/fidelity.py): the pruning decision, who is never screened,
and the product path (Controller -> run_trial's bench step -> SearchProposer) on a fake bench.

Fast: no server is launched; the fake host starts nothing and the fake site's bench answers from
the candidate's `tpot_ms` knob (a short pass reads `short_tpot`, so a test can make it lie)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_target import write_fake_target

from orchestrator.bench.metrics import compute_metrics
from orchestrator.bench.results import ScenarioResult
from orchestrator.bench.saturation import SaturationPolicy
from orchestrator.bench.scenarios import builtin_scenarios
from orchestrator.bench.timeline import RequestRecord
from orchestrator.config.goal import parse_goal
from orchestrator.core.roles import BASELINE, PAIRED, PROBE, RETRY, SENTINEL
from orchestrator.hosts.base import Proc
from orchestrator.hosts.measure import TrustPolicy
from orchestrator.loop.controller import Controller
from orchestrator.proposers import ScriptedProposer, SearchProposer
from orchestrator.proposers.search import SCREEN_STARTUP
from orchestrator.store import Store
from orchestrator.targets import load_target
from orchestrator.trial.context import TrialContext
from orchestrator.trial.fidelity import (
    MAX_REPEAT_SHARE,
    SCREENED,
    is_screened,
    margin,
    screen_for,
    short_scenario,
)


def _t(number, score, status="discarded", error=None, proposer="search"):
    return SimpleNamespace(id=number + 100, number=number, score=score, status=status, error=error, proposer=proposer)


HISTORY = [_t(0, 1.0, "kept", proposer=BASELINE), _t(1, 1.4, "kept"), _t(2, 0.9), _t(3, 2.0, "kept"), _t(4, 1.2)]


def test_a_clearly_bad_short_score_is_screened_out_and_a_good_one_goes_to_full_fidelity():
    p = SearchProposer(seed=0)
    why = p.should_stop_early(HISTORY, 1.0, 0.10)
    assert why and "1.800x" in why and "best kept 2.000x" in why and "ThresholdPruner" in why
    assert p.should_stop_early(HISTORY, 2.3, 0.10) is None  # would be kept: measured in full
    assert p.should_stop_early(HISTORY, 1.85, 0.10) is None  # within the noise margin of the best
    assert p.should_stop_early(HISTORY, 1.85, 0.05) is not None  # a quieter short bench: a tighter bar
    # A caller that does not state the noise: nothing is screened before SCREEN_STARTUP full measurements.
    assert p.should_stop_early(HISTORY[:SCREEN_STARTUP - 1], 0.1, 0.10) is None
    # The noise stated (the product's screen: `startup=0`): judged from the first search trial, against
    # the baseline's 1.0 less the margin.
    why = p.should_stop_early(HISTORY[:1], 0.8, 0.10, startup=0)
    assert why and "a bar of 0.900x: the best kept 1.000x (the baseline)" in why
    assert p.should_stop_early(HISTORY[:1], 0.95, 0.10, startup=0) is None  # inside the noise: measured in full
    # A screened trial is not a full measurement: it neither counts for the start-up nor sets the best.
    screened = [HISTORY[0], _t(1, 5.0, error=f"{SCREENED} 25% fidelity: x"), _t(2, 1.1), _t(3, 1.2, "kept")]
    assert is_screened(screened[1]) and p.should_stop_early(screened, 0.1, 0.10) is None
    assert p.should_stop_early([*screened, _t(4, 1.0)], 1.0, 0.10) is not None  # bar from 1.2, not 5.0
    # Proposers that do not screen never stop a candidate early.
    assert ScriptedProposer([]).should_stop_early(HISTORY, 0.01, 0.10) is None


def test_short_scenario_runs_the_first_whole_waves_of_the_full_bench():
    sc = builtin_scenarios(1.0)
    thr, dec = short_scenario(sc["throughput"], 0.25), short_scenario(sc["decode"], 0.25)
    assert (thr.measured_requests, thr.concurrency, thr.warmup_requests) == (16, 8, 8)  # 12 requests -> 2 waves of 8
    assert thr.part == (0, 16) and thr.num_requests == 48 and thr.seed == sc["throughput"].seed  # its first 16
    assert dec.measured_requests == 4 and dec.seed == sc["decode"].seed and dec.name == "decode@0.25"
    assert short_scenario(sc["throughput"], 0.01).measured_requests == 8  # at least one wave
    # Not continued (the SLO rate search): other prompts, which the full bench does not re-send.
    slo = short_scenario(sc["slo"], 0.25, continued=False)
    assert slo.part is None and slo.num_requests == 8 and slo.seed != sc["slo"].seed
    assert margin(0.0, 0.25) == 0.10 and margin(0.05, 0.25) == pytest.approx(0.2)


def _screen(trial, store, run_id, fraction=0.25, history=HISTORY, scenarios=None, goal=("throughput",), durations=None):
    return screen_for(fraction=fraction, trial=trial, proposer=SearchProposer(), history=history,
                      scenarios=scenarios or builtin_scenarios(1.0), goal_scenarios=list(goal), score=lambda r: r,
                      noise=0.0, store=store, run_id=run_id, durations=durations)


def test_the_screen_judges_from_the_first_search_trial_when_the_noise_is_known():
    """The baseline's noise is always known to the screen (measured, or assumed and said), so the
    pruner does not wait for 4 full measurements: on the H200 a run holds 4-5 search trials, and with
    that start-up nothing was screened while every candidate paid its short pass."""
    store = Store("sqlite://")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    trial = store.create_trial(run.id, 1, commit="", knobs={}, rationale="", proposer="search")
    s = _screen(trial, store, run.id, history=HISTORY[:1])  # only the baseline measured so far
    why = s.judge(0.8, 2.0)
    assert why and "short-bench score 0.800x vs a bar of 0.900x: the best kept 1.000x (the baseline)" in why
    assert s.judge(0.95, 2.0) is None  # within the margin of the baseline: measured in full


def test_the_h200_goal_is_screened_its_one_wave_scenario_measured_once():
    """The full bench continues the short pass, so a short pass never costs a promising candidate
    extra: the H200 goal (decode 8 at c=1, a one-wave burst of 16 at c=16), which the old request-share
    rule (MAX_SHORT_SHARE, 18 of 24 requests) kept from being screened at all, is screened; its burst is
    measured once, in the short pass, and its decode continues after the short pass's first 2."""
    from orchestrator.bench.scenarios import load_scenarios_file

    gpu = load_scenarios_file(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "scenarios.toml")
    store = Store("sqlite://")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    trial = store.create_trial(run.id, 1, commit="", knobs={}, rationale="", proposer="search")
    s = _screen(trial, store, run.id, scenarios=gpu, goal=("decode", "throughput"))
    assert s is not None and not store.events(run.id, kind="screen")  # nothing skipped
    assert s.scenarios["throughput"].part == (0, 16) and s.scenarios["decode"].part == (0, 2)
    rest = {n: s.full(n, gpu[n]) for n in ("decode", "throughput")}
    assert rest["throughput"].measured_requests == 0  # the wave is not repeated
    assert rest["decode"].part == (2, 8) and rest["decode"].warmup_requests == 0
    assert s.judge(2.5, 1.0) is None
    ev = store.events(run.id, kind="screen")[-1].data
    assert (ev["short_requests"], ev["rest_requests"], ev["full_requests"]) == (18, 6, 24)
    assert ev["continued"] == ["decode", "throughput"]


def test_a_short_pass_that_a_passed_candidate_would_repeat_is_judged_by_time():
    """The SLO rate search cannot be continued: its short pass is measured again in full. Where that
    repeat would be over MAX_REPEAT_SHARE of the full bench's time (the baseline's measured seconds;
    its requests where none are stored) no screen is run, and the event says why."""
    store = Store("sqlite://")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    trial = store.create_trial(run.id, 1, commit="", knobs={}, rationale="", proposer="search")
    # slo at 0.75: 24 of its 32 requests again; decode (16) continues. By requests 24/48 = 50%: screened.
    assert _screen(trial, store, run.id, fraction=0.75, goal=("decode", "slo")) is not None
    # By time: the slo search takes 10 s of the bench's 11: 68% would be measured again. Not screened.
    assert _screen(trial, store, run.id, fraction=0.75, goal=("decode", "slo"), durations={"decode": 1.0, "slo": 10.0}) is None
    ev = store.events(run.id, kind="screen")
    assert [e.data["skipped"] for e in ev] == [True] and ev[0].data["repeat_share"] == pytest.approx(0.682, abs=1e-3)
    assert "slo cannot be continued" in ev[0].message and "of the full bench's time" in ev[0].message
    assert f"> {MAX_REPEAT_SHARE:.0%}" in ev[0].data["reason"]
    # The slo search cheap beside the decode: screened.
    assert _screen(trial, store, run.id, fraction=0.75, goal=("decode", "slo"), durations={"decode": 10.0, "slo": 1.0})


def test_baselines_sentinels_paired_probes_and_retries_are_never_screened():
    store = Store("sqlite://")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    for role in (BASELINE, SENTINEL, PAIRED, PROBE, RETRY):
        assert _screen(_t(5, None, "running", proposer=role), store, run.id) is None, role
    assert _screen(_t(0, None, "running"), store, run.id) is None  # trial #0 is the baseline
    assert _screen(_t(5, None, "running"), store, run.id, fraction=0.0) is None  # off by default
    s = _screen(store.create_trial(run.id, 5, commit="", knobs={}, rationale="", proposer="search"), store, run.id)
    assert s is not None and s.scenarios["throughput"].measured_requests == 16
    full = s.full("throughput", builtin_scenarios(1.0)["throughput"])
    assert full.part == (16, 48) and full.warmup_requests == 0  # the rest; the short pass had the warm-up
    why = s.judge(1.0, 2.0)  # (the fake `score` above returns the result itself)
    assert why.startswith("screened out at 25% fidelity: short-bench score 1.000x vs a bar of 1.800x")
    assert "s of bench saved" in why
    assert s.judge(2.5, 2.0) is None
    ev = [e.data for e in store.events(run.id, kind="screen")]
    assert [e["screened_out"] for e in ev] == [True, False]
    # the 32 requests after the short pass not run, at its pace of 24 requests (16 + 8 warm-up) in 2 s
    assert ev[0]["saved_bench_s"] == pytest.approx(32 / 24 * 2, abs=1e-3) and ev[1]["saved_bench_s"] == 0.0


# --- the product path: Controller -> run_trial -> the bench step -> SearchProposer, on a fake bench ---

class FakeSite:
    python = "python"

    def __init__(self, host):
        self.host = host

    def place(self, path, *, kind="tree"):
        return str(path)

    def verify_gates(self):
        pass

    def facts(self):
        return {}

    def bench(self, base_url, model, scenario, **kw):
        tpot = float(self.host.argv[self.host.argv.index("--tpot-ms") + 1])
        if "@" in scenario.name:  # the short pass
            tpot = self.host.short_tpot.get(tpot, tpot)
        lo, hi = scenario.part or (0, scenario.num_requests)
        self.host.benched.append((scenario.name, scenario.measured_requests, scenario.warmup_requests, tpot))
        self.host.parts.append((self.host.trial_no, scenario.name, scenario.seed, (lo, hi)))
        self.host.draws.append((self.host.trial_no, scenario.name, scenario.prompt_seed, (lo, hi)))
        # One record per request, each of `tpot` ms a token: the metrics are computed as the bench's.
        recs, t = [], 10**12
        for i in range(lo, hi):
            n = scenario.output_tokens
            recs.append(RequestRecord(index=i, prompt_tokens=scenario.prompt_tokens, output_tokens=n, t_scheduled_ns=t,
                                      t_sent_ns=t, t_first_chunk_ns=t + 10**6, t_first_token_ns=t + 10**6,
                                      t_last_token_ns=t + 10**6 + int(tpot * 1e6) * (n - 1), t_done_ns=t + 2 * 10**6 + int(tpot * 1e6) * (n - 1),
                                      usage_prompt_tokens=scenario.prompt_tokens, usage_completion_tokens=n, client_tokens=n,
                                      success=True, done_seen=True, finish_reason="length"))
            t = recs[-1].t_done_ns
        m = compute_metrics(recs, bench_start_ns=10**12, bench_end_ns=t)
        return ScenarioResult(scenario=scenario, metrics=m, requests=recs,
                              meta={"api": "completions", **({"part": [lo, hi], "loop_lag_ms": []} if scenario.part else {})})


class FakeHost:
    """Starts nothing: remembers the launched argv, which the fake site's bench reads its tpot from."""

    name = "fake"

    def __init__(self, short_tpot=None):
        self.argv, self.benched, self.short_tpot = [], [], dict(short_tpot or {})
        self.parts, self.trial_no = [], None  # (trial, scenario, seed, requests [lo, hi)) of every bench
        self.draws = []  # (trial, scenario, prompt_seed, requests [lo, hi)) of every bench

    def site(self):
        return FakeSite(self)

    def free_port(self):
        return 1

    def start(self, argv, *, env, cwd, log_path, preload=()):
        self.argv = list(argv)
        tail = Path(log_path).parent.name.split("-")[-1]  # run_dir/trial-N/server.log
        self.trial_no = int(tail) if tail.isdigit() else None
        Path(log_path).write_text("")
        return Proc(pid=0, pgid=0, argv=tuple(argv), log_path=str(log_path))

    def quiet(self, *, server=False):
        return contextlib.nullcontext()

    def wait_healthy(self, url, timeout, proc):
        pass

    def alive(self, proc):
        return True

    def stop(self, proc):
        pass


CHOICES = (8.0, 7.0, 6.0, 5.0, 4.0, 12.0, 16.0, 20.0, 24.0, 32.0)


def _run(tmp_path, fraction, short_tpot=None, trials=12, gates=False, scenarios=None):
    target = load_target(write_fake_target(tmp_path / "fake.toml", choices=CHOICES))
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    goal = parse_goal(f"beat the baseline by 80% on TPOT within {trials} trials")  # 8 -> 1.6 ms: out of reach
    run = store.create_run("r", "g", {}, "h", {}, {}, "fake", "search")
    host = FakeHost(short_tpot)
    ctx = TrialContext(run_id=run.id, goal=goal, target=target, host=host, store=store, model_dir=tmp_path,
                       reference_dir=tmp_path, scenarios=scenarios or builtin_scenarios(1.0), run_dir=tmp_path / "run",
                       source_dir=tmp_path, accuracy_gate=gates, integrity_gate=gates,
                       # The fake bench returns at once: its client-CPU share over so short a window is
                       # noise, not saturation (a busy host would otherwise make it untrusted).
                       trust=TrustPolicy(probe_s=0.0, settle_s=0.0, saturation=SaturationPolicy(max_client_cpu=float("inf"))))
    reason = Controller(ctx, SearchProposer(seed=0), screen_fraction=fraction).run()
    return store, run.id, host, reason


def test_the_search_screens_bad_candidates_on_a_short_bench_and_measures_the_rest_in_full(tmp_path):
    store, run_id, host, reason = _run(tmp_path, 0.25)
    trials = store.list_trials(run_id)
    search = [t for t in trials if t.proposer == "search"]
    screened = [t for t in search if is_screened(t)]
    assert screened, [(t.knobs, t.status, t.score) for t in search]
    screens = {e.trial_id: e.data for e in store.events(run_id, kind="screen")}
    for t in screened:
        assert t.error.startswith("screened out at 25% fidelity: short-bench score") and "Optuna ThresholdPruner" in t.error
        assert t.score == pytest.approx(8.0 / t.knobs["tpot_ms"]) and screens[t.id]["saved_bench_s"] > 0
        assert {m.scenario for m in store.measurements(t.id)} == {"decode@0.25"}  # the full bench never ran
    # Every search trial judged on a bench got a screen (one the busy host made untrusted may not have);
    # the ones that passed were then measured in full, without warm-up.
    judged = [t for t in search if t.status in ("kept", "discarded")]
    assert {t.id for t in judged} <= set(screens) <= {t.id for t in search}
    full = [t for t in judged if not is_screened(t)]
    assert full and all({m.scenario for m in store.measurements(t.id)} == {"decode", "decode@0.25"} for t in full)
    # Their full bench continued the short pass: the 12 requests after its 4, no second warm-up, the same
    # seeded prompts; stored as one measurement of all 16, which says which requests came from which pass.
    assert ("decode", 12, 0, 5.0) in host.benched or ("decode", 12, 0, 4.0) in host.benched
    seed = builtin_scenarios(1.0)["decode"].seed
    for t in full:
        sent = sorted((lo, hi, sd) for n, name, sd, (lo, hi) in host.parts if n == t.number)
        assert sent[:2] == [(0, 4, seed), (4, 16, seed)], sent  # then only whole re-measures, if any
        assert all(p == (0, 16, seed) for p in sent[2:])
        m = {x.metric: x.value for x in store.measurements(t.id) if x.scenario == "decode" and x.repeat == 0}
        assert (m["completed"], m["short_pass_requests"], m["continued_requests"]) == (16, 4, 12)
        assert m["tpot_ms_count"] == 16
    # Each measurement asks a draw of prompts of its own; a continuation the rest of its short pass's draw.
    for t in full:
        drawn = [(sd, part) for n, _, sd, part in host.draws if n == t.number]
        assert drawn[0][0] == drawn[1][0] is not None and drawn[1][1][0] == 4
    paired = [t.number for t in trials if t.proposer == "paired"]  # both halves of a round: one draw
    starts = [sd for n, name, sd, (lo, hi) in host.draws if lo == 0 and n not in paired[1::2]]  # each measurement's first pass
    assert paired and None not in starts and len(set(starts)) == len(starts)
    for a, b in zip(paired[::2], paired[1::2], strict=True):
        assert [sd for n, _, sd, _ in host.draws if n == a] == [sd for n, _, sd, _ in host.draws if n == b]
    base = sorted((lo, hi, sd) for n, name, sd, (lo, hi) in host.parts if n == 0)
    assert base and all(p == (0, 16, seed) for p in base)  # what a single full bench sends: the same requests
    # Baselines, sentinels and paired rounds are measured at full fidelity only, with their warm-up.
    loop = [t for t in trials if t.proposer != "search"]
    assert loop and not any(t.id in screens for t in loop)
    assert all({m.scenario for m in store.measurements(t.id)} <= {"decode"} for t in loop)
    # A screened trial is never kept, never the best; the best is the fastest knob set the search found.
    best = store.get_trial(store.get_run(run_id).best_trial_id)
    assert best.proposer == "search" and not is_screened(best) and best.status == "kept"
    assert best.knobs["tpot_ms"] == min(t.knobs["tpot_ms"] for t in judged)
    assert "screened out" in next(e.message for e in store.events(run_id, kind="trial.why") if e.trial_id == screened[0].id)


def test_a_short_bench_that_flatters_a_slow_candidate_costs_only_its_full_bench(tmp_path):
    # The short pass of 32 ms reads 4 ms: it passes the screen, and its full bench judges it (discarded).
    store, run_id, _, _ = _run(tmp_path, 0.25, short_tpot={32.0: 4.0})
    slow = [t for t in store.list_trials(run_id) if t.proposer == "search" and t.knobs["tpot_ms"] == 32.0]
    assert slow and all(t.status == "discarded" and not is_screened(t) and t.score == pytest.approx(0.25) for t in slow)


def test_a_one_wave_goal_scenario_is_measured_once_in_the_short_pass(tmp_path):
    sc = builtin_scenarios(1.0)
    sc["decode"] = sc["decode"].model_copy(update={"num_requests": 8, "concurrency": 8})  # one wave
    store, run_id, host, _ = _run(tmp_path, 0.25, trials=5, scenarios=sc)
    search = [t for t in store.list_trials(run_id) if t.proposer == "search"]
    screens = {e.trial_id: e.data for e in store.events(run_id, kind="screen")}
    assert search and not any(d.get("skipped") for d in screens.values())
    passed = [t for t in search if t.id in screens and not is_screened(t) and t.status in ("kept", "discarded")]
    assert passed
    for t in passed:
        sent = [(name, lo, hi) for n, name, _, (lo, hi) in host.parts if n == t.number]
        assert sent[0] == ("decode@0.25", 0, 8) and ("decode", 8, 8) not in sent  # the wave measured once
        m = {x.metric: x.value for x in store.measurements(t.id) if x.scenario == "decode" and x.repeat == 0}
        assert (m["completed"], m["short_pass_requests"], m["continued_requests"]) == (8, 8, 0)


def test_screening_is_off_by_default(tmp_path):
    store, run_id, host, _ = _run(tmp_path, 0.0, trials=6)
    assert not store.events(run_id, kind="screen") and all("@" not in name for name, *_ in host.benched)


def test_the_gates_run_only_for_candidates_the_screen_passes(tmp_path, monkeypatch):
    """A screened-out candidate is never kept, so it is not gated (13-28 s a trial on the H200); one the
    screen passes is gated before its full bench, so a fast cheat still ends invalid, and the baseline,
    never screened, is gated first as before."""
    import orchestrator.trial.run as trial_mod

    gated = []

    def fake_gates(ctx, site, trial, candidate, base_url, port, proc, caps):
        gated.append(trial.number)
        if candidate.knobs.get("tpot_ms", 8.0) <= 5.0:  # the fast ones cheat: the gates catch them
            return "accuracy drift: the test's cheat", False, None
        return None, False, None

    monkeypatch.setattr(trial_mod, "capability_verdict", lambda *a, **k: None)
    monkeypatch.setattr(trial_mod, "run_gates", fake_gates)
    store, run_id, host, _ = _run(tmp_path, 0.25, gates=True)
    trials = store.list_trials(run_id)
    screens = {e.trial_id: e.data for e in store.events(run_id, kind="screen")}
    screened = [t for t in trials if is_screened(t)]
    assert screened and all(t.number not in gated and "gates not run" in t.error for t in screened)
    passed = [t for t in trials if t.proposer == "search" and t.id in screens and not is_screened(t)]
    assert passed and all(t.number in gated for t in passed)
    honest = [t for t in passed if t.knobs["tpot_ms"] > 5.0 and t.status in ("kept", "discarded")]
    for t in honest:  # gated between the short pass and its continuation: one measurement of all 16 requests
        m = {x.metric: x.value for x in store.measurements(t.id) if x.scenario == "decode" and x.repeat == 0}
        assert (m["completed"], m["short_pass_requests"]) == (16, 4)
    cheats = [t for t in passed if t.knobs["tpot_ms"] <= 5.0]
    assert cheats and all(t.status == "invalid" and "accuracy drift" in t.error for t in cheats)
    assert all({m.scenario for m in store.measurements(t.id)} == {"decode@0.25"} for t in cheats)  # no full bench
    assert 0 in gated and gated.index(0) == 0  # the baseline: gated, first
    best = store.get_trial(store.get_run(run_id).best_trial_id)
    assert best.knobs.get("tpot_ms", 8.0) > 5.0 and best.number in gated
