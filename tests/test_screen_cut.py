"""A screen's short pass stops as soon as the candidate is certain to be screened out.

The H200 goal's shape, small: TPOT p50 on a decode scenario, then output throughput on a one-wave burst
of 16 requests (a slow candidate's burst took most of its 21-23 s screen there). The real path: the fake
target's server in its own process (LocalHost), the real load generator, Controller -> run_trial's short
pass -> `fidelity.Screen.plan` -> the bench stopping the burst on the host -> the search's pruner.
"""

from __future__ import annotations

import optuna
import pytest
from fake_target import FAKE_SERVER_DIR, write_fake_target
from own_trials import candidates

from orchestrator.bench.saturation import SaturationPolicy
from orchestrator.bench.scenarios import Scenario
from orchestrator.config.goal import parse_goal
from orchestrator.core.candidate import Candidate
from orchestrator.core.roles import PROBE, RETRY
from orchestrator.hosts.local import LocalHost
from orchestrator.hosts.measure import TrustPolicy
from orchestrator.hosts.site import LocalSite
from orchestrator.knowledge.distill import distill
from orchestrator.loop.controller import Controller
from orchestrator.proposers import SearchProposer
from orchestrator.store import Store
from orchestrator.targets import load_target
from orchestrator.trial.context import TrialContext
from orchestrator.trial.fidelity import is_screened, is_stopped, out_of_reach

BASE, SLOW, FAST = 4.0, 40.0, 3.8  # ms a token: the baseline's, a candidate 10x slower, one a little faster
SCENARIOS = {
    "decode": Scenario(name="decode", prompt_tokens=16, output_tokens=4, num_requests=8, concurrency=1, warmup_requests=1,
                       seed=2, primary_metric="tpot_ms_mean", direction="lower"),
    "throughput": Scenario(name="throughput", prompt_tokens=16, output_tokens=32, num_requests=16, concurrency=16,
                           warmup_requests=0, seed=3),
}


class Steps:
    """Proposes `steps` ((knobs, role) in order), then nothing; screens with the search's own rule.
    `bar=False`: a proposer that does not name its bar, so no short pass is stopped early (the uncut run)."""

    name = "steps"

    def __init__(self, steps, bar=True):
        self.steps, self.search = list(steps), SearchProposer(seed=0)
        if bar:
            self.stop_bar = self.search.stop_bar

    def should_stop_early(self, *a, **kw):
        return self.search.should_stop_early(*a, **kw)

    def propose(self, history, target):
        done = sum(1 for t in history if t.number > 0) + self._probes
        if done >= len(self.steps):
            return None
        knobs, role = self.steps[done]
        self._probes += role == PROBE  # a probe is outside the history the proposer sees
        return Candidate(knobs=knobs, rationale=f"step {done + 1}", proposer=role or self.name)

    _probes = 0


class Spy(LocalHost):
    """The real local host; its site remembers every scenario it benched (with its `stop`) and how long."""

    benched: list

    def site(self):
        host = self

        class Site(LocalSite):
            def bench(self, base_url, model, scenario, **kw):
                res = super().bench(base_url, model, scenario, **kw)
                host.benched.append((host.trial, scenario.name, scenario.stop, res.metrics["duration_s"],
                                     bool(res.metrics.get("stopped_early"))))
                return res

        return Site()

    def start(self, argv, **kw):
        self.trial = int(str(kw["log_path"]).split("trial-")[1].split("/")[0])
        return super().start(argv, **kw)


GOAL = "beat the baseline by 75% on TPOT and improve throughput by 3x within 9 trials"
# A tiny Llama shape and a host whose copy rate puts the decode's TPOT floor at ~2 ms (half the baseline's 4),
# the throughput ceiling of 16 x 32 tokens at ~8000 tok/s (~8x the baseline's four at a time).
CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256, "num_attention_heads": 4}
CEILINGS = {"copy_bytes_per_s": 1.19e8, "bf16_flops_per_s": 1e15}
# With floors: the burst four at a time (the baseline's output tok/s well under its ceiling: its cap the looser).
FOUR_WIDE = {**SCENARIOS, "throughput": SCENARIOS["throughput"].model_copy(update={"concurrency": 4})}


def _floors(store, run_id, model_dir):
    """The run's speed-of-light record (`infergoal floors`), for CONFIG written in `model_dir`."""
    import json

    from gates.plausible import model_numbers

    (model_dir / "config.json").write_text(json.dumps(CONFIG))
    store.add_event(run_id, "speed_of_light", "floors", data={"floors": {}, "ceilings": CEILINGS, "model": model_numbers(CONFIG)})


def _run(tmp_path, steps, *, bar=True, monkeypatch, goal=GOAL, scenarios=SCENARIOS, floors=False, baseline_repeats=2):
    monkeypatch.setattr(Controller, "_confirm_best", lambda self, reason: reason)  # no paired rounds at the stop
    target = load_target(write_fake_target(tmp_path / "fake.toml", choices=(BASE, SLOW, FAST)))
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    goal = parse_goal(goal) if isinstance(goal, str) else goal
    run = store.create_run("r", "g", {}, "h", {}, {}, "fake", "steps")
    if floors:
        _floors(store, run.id, tmp_path)
    host = Spy(tmp_path / "state", standby=False)
    host.benched = []
    ctx = TrialContext(run_id=run.id, goal=goal, target=target, host=host, store=store, model_dir=tmp_path,
                       reference_dir=tmp_path, scenarios=dict(scenarios), run_dir=tmp_path / "run", source_dir=FAKE_SERVER_DIR,
                       accuracy_gate=False, integrity_gate=False,
                       # The screen alone is judged here, not the loop's answers to a loaded host (tests/test_noisy_host.py
                       # judges those): no measurement is redone (it benched a scenario twice), no candidate re-run (a
                       # retry is measured in full, never screened), no baseline re-measured for a moved host state (two
                       # baselines taken under different loads gave a noise margin of 50-100%, another bar).
                       trust=TrustPolicy(probe_s=0.0, settle_s=0.0, min_seconds=0.0, max_slowdown=float("inf"),
                                         state_change=float("inf"), saturation=SaturationPolicy(max_client_cpu=float("inf"))))
    Controller(ctx, Steps([({"tpot_ms": k}, role) for k, role in steps], bar=bar), screen_fraction=0.25,
               baseline_repeats=baseline_repeats).run()
    return store, run.id, host


def _own(store, run_id, tpot_ms):
    """The run's candidate with these knobs (`own_trials`: its re-run, were its first measurement invalid)."""
    return next(t for t in candidates(store, run_id) if t.knobs.get("tpot_ms") == tpot_ms and t.proposer in ("steps", RETRY))


def _slow(store, run_id):
    return _own(store, run_id, SLOW)


def test_a_slow_candidates_screen_is_stopped_early_and_ends_as_it_would_have(tmp_path, monkeypatch):
    (tmp_path / "cut").mkdir()
    (tmp_path / "full").mkdir()
    store, run_id, host = _run(tmp_path / "cut", [(SLOW, None)], monkeypatch=monkeypatch)
    ustore, urun_id, uhost = _run(tmp_path / "full", [(SLOW, None)], bar=False, monkeypatch=monkeypatch)
    cut, uncut = _slow(store, run_id), _slow(ustore, urun_id)
    # The same outcome: discarded, screened out by the same pruner, never gated, never kept.
    for t in (cut, uncut):
        assert t.status == "discarded" and is_screened(t) and "gates not run" in t.error, t.error
        assert "vs a bar of" in t.error and "Optuna ThresholdPruner" in t.error
        assert {m.scenario for m in (store if t is cut else ustore).measurements(t.id)} == {"decode@0.25", "throughput@0.25"}
    assert store.get_run(run_id).best_trial_id == ustore.get_run(urun_id).best_trial_id  # the baseline, both
    # Only the cut one was stopped, and it says so: when, the floor the bar needed, the bound it was under.
    assert "throughput stopped early after" in cut.error and "could no longer reach the" in cut.error
    assert "short-bench score at most" in cut.error and "stopped early" not in uncut.error
    ev = store.events(run_id, kind="screen")[-1].data
    assert ev["stopped_early"]["throughput"]["bound_tok_s"] < ev["stopped_early"]["throughput"]["floor_tok_s"]
    # Its stored score is that bound's: at least what the whole burst scored uncut, still under the bar.
    assert uncut.score <= cut.score < ev["bar"]
    # The burst: stopped at a fraction of what it took in full (~1.25 s at 40 ms a token).
    burst = [b for b in host.benched if b[1] == "throughput@0.25"]
    uburst = [b for b in uhost.benched if b[1] == "throughput@0.25"]
    assert len(burst) == len(uburst) == 1 and burst[0][4] and not (uburst[0][4] or uburst[0][2] is not None), (burst, uburst)
    # No floors: TPOT is unbounded while unmeasured, so the decode (measured first) carries no rule, runs whole.
    assert all(b[2] is None and not b[4] for b in host.benched if b[1] == "decode@0.25"), host.benched
    assert max(b[3] for b in burst) < min(b[3] for b in uburst) / 5, (burst, uburst)
    # ... and the trial's screen phase is shorter for it. Its wall time also holds the deploy and the decode bench,
    # which a shared machine stretches (a fresh-clone CI run saw the cut screen at 1.38 s against 1.73 s uncut, the
    # burst itself cut as above): the ratio is the burst's (b[3]), here only the direction.
    assert cut.timings["screen"] < uncut.timings["screen"], (cut.timings, uncut.timings)
    # The knowledge base learns from measured scores: the uncut short score is one, the stopped one's bound is not.
    assert is_stopped(cut) and not is_stopped(uncut)
    assert {SLOW} == {o["knobs"]["tpot_ms"] for o in distill(ustore, urun_id).observations}
    assert not distill(store, run_id).observations
    # TPE is told it as pruned at its bound (under every measured trial), and proposes on from such a history.
    from orchestrator.proposers.optspace import told

    assert told(cut, (), 0.0) == {"state": optuna.trial.TrialState.PRUNED, "intermediate_values": {0: cut.score}}
    assert told(uncut, (), 0.0) == {"value": uncut.score}
    target = load_target(tmp_path / "cut" / "fake.toml")
    assert SearchProposer(seed=0, n_startup=1).propose(store.list_trials(run_id), target).knobs == {"tpot_ms": FAST}


def test_a_candidate_fast_enough_for_the_bar_is_never_stopped(tmp_path, monkeypatch):
    store, run_id, host = _run(tmp_path, [(SLOW, None), (FAST, None)], monkeypatch=monkeypatch)
    fast = _own(store, run_id, FAST)
    sent = {(b[0], b[1]): b for b in host.benched}
    # Its burst carried a floor (the rule was armed) and ran to its end: passed, measured in full, judged.
    assert sent[(fast.number, "throughput@0.25")][2] is not None and not sent[(fast.number, "throughput@0.25")][4]
    assert not is_screened(fast) and fast.status in ("kept", "discarded") and fast.score > 0.9
    assert {m.scenario for m in store.measurements(fast.id)} >= {"decode", "throughput"}  # the full bench, joined
    assert "stopped" not in (fast.error or "")
    assert sent[(_slow(store, run_id).number, "throughput@0.25")][4]  # the slow one in the same run was stopped


def test_full_fidelity_roles_are_never_stopped(tmp_path, monkeypatch):
    # The same slow knob set as a search candidate (stopped) and as a probe (full fidelity: measured whole).
    store, run_id, host = _run(tmp_path, [(SLOW, None), (SLOW, PROBE)], monkeypatch=monkeypatch)
    trials = store.list_trials(run_id)
    probe = next(t for t in trials if t.proposer == PROBE)
    assert probe.status == "discarded" and not is_screened(probe)  # a probe is never kept, judged in full
    full = {t.number for t in trials if t.proposer not in ("steps", RETRY)}  # the baseline, the probe, any sentinel
    assert {0, probe.number} <= full
    assert all(b[2] is None and not b[4] and "@" not in b[1] for b in host.benched if b[0] in full), host.benched
    assert any(b[4] for b in host.benched if b[0] == _slow(store, run_id).number)  # the search's one was stopped


def test_the_rule_is_exact_and_only_where_the_other_objectives_are_measured_or_capped():
    goal = parse_goal("beat the baseline by 75% on TPOT and improve throughput by 3x")
    base = {"decode:tpot_ms_p50": 10.0, "throughput:output_throughput": 100.0}
    # TPOT 20 ms: speedup 0.5; the score sqrt(0.5 x thr / 100) is under 0.9 exactly below thr = 162, a
    # throughput speedup under 0.9^2 / 0.5.
    below = out_of_reach(0.9, "throughput", goal.objectives, base, {"decode:tpot_ms_p50": [20.0]})
    assert below == pytest.approx(0.9 ** 2 / 0.5)
    assert out_of_reach(0.9, "throughput", goal.objectives, base, {}) is None  # TPOT unmeasured, no cap: unbounded
    # TPOT capped at a 4x speedup (the speed-of-light gate's): the burst alone must reach 0.81 / 4.
    assert out_of_reach(0.9, "throughput", goal.objectives, base, {}, {"decode:tpot_ms_p50": (4.0, 2.5)}) == pytest.approx(0.81 / 4)
    # A latency scenario: throughput measured at 50 tok/s (0.5x), TPOT's speedup must reach 0.81 / 0.5.
    assert out_of_reach(0.9, "decode", goal.objectives, base, {"throughput:output_throughput": [50.0]}) == pytest.approx(1.62)
    only = parse_goal("improve throughput by 3x")
    assert out_of_reach(0.9, "throughput", only.objectives, {"throughput:output_throughput": 100.0}, {}) == pytest.approx(0.9)


def _screen_events(store, run_id, trial):
    return [e.data for e in store.events(run_id, kind="screen") if e.trial_id == trial.id]


def test_with_floors_a_slow_candidates_burst_goes_first_is_stopped_and_its_decode_is_not_run(tmp_path, monkeypatch):
    """The H200's order: with floors TPOT's speedup is capped (~2.3x here, ~13x there) and throughput's looser
    (~9x, ~144x), so the short pass measures the burst first; a slow candidate's burst is stopped with TPOT
    at its cap, and its decode, certain to change nothing, is never run. The same decision as uncut."""
    (tmp_path / "cut").mkdir()
    (tmp_path / "full").mkdir()
    kw = {"monkeypatch": monkeypatch, "scenarios": FOUR_WIDE, "floors": True, "baseline_repeats": 1}
    store, run_id, host = _run(tmp_path / "cut", [(SLOW, None)], **kw)
    ustore, urun_id, uhost = _run(tmp_path / "full", [(SLOW, None)], bar=False, **kw)
    cut, uncut = _slow(store, run_id), _slow(ustore, urun_id)
    for t in (cut, uncut):
        assert t.status == "discarded" and is_screened(t) and "vs a bar of" in t.error, t.error
    assert uncut.score <= cut.score < _screen_events(store, run_id, cut)[-1]["bar"]
    assert is_stopped(cut) and not is_stopped(uncut)
    # Which bound: the burst's throughput, with TPOT at its speed-of-light cap; the decode not run, and why.
    assert "throughput stopped early after" in cut.error and "with decode:tpot_ms_p50 at the speed of light's cap" in cut.error
    assert "decode not run as out of reach: the short score is under the bar even at tpot_ms_p50" in cut.error, cut.error
    ev = _screen_events(store, run_id, cut)[-1]
    assert ev["order"] == ["throughput", "decode"] and set(ev["not_run"]) == {"decode"}
    sent = [b[1] for b in host.benched if b[0] == cut.number]
    assert sent and set(sent) == {"throughput@0.25"}, host.benched  # the decode never sent a request
    assert {m.scenario for m in store.measurements(cut.id)} == {"throughput@0.25"}
    # The uncut run (no bar: no stop, and the goal's order) measured both, whole.
    usent = [b for b in uhost.benched if b[0] == uncut.number]
    assert [b[1] for b in usent] == ["decode@0.25", "throughput@0.25"] and not any(b[2] is not None or b[4] for b in usent), usent
    assert cut.timings["screen"] < uncut.timings["screen"], (cut.timings, uncut.timings)


def test_with_floors_a_candidate_fast_enough_is_never_stopped_nor_its_decode_skipped(tmp_path, monkeypatch):
    store, run_id, host = _run(tmp_path, [(FAST, None)], monkeypatch=monkeypatch, scenarios=FOUR_WIDE, floors=True, baseline_repeats=1)
    fast = _own(store, run_id, FAST)
    mine = {b[1]: b for b in host.benched if b[0] == fast.number}
    assert not is_screened(fast) and fast.status in ("kept", "discarded") and "stopped" not in (fast.error or "")
    # Both short passes carried a rule (the burst's with TPOT capped) and ran to their end; the full bench followed.
    assert mine["throughput@0.25"][2] is not None and mine["decode@0.25"][2] is not None, mine
    assert not any(b[4] for b in mine.values())
    assert {m.scenario for m in store.measurements(fast.id)} >= {"decode", "throughput"}


def test_a_slow_candidates_decode_is_stopped_on_its_tpot_bound_once_throughput_is_measured(tmp_path, monkeypatch):
    """No floors, the goal naming throughput first: the burst is measured whole, then the decode's short pass is
    stopped as soon as its TPOT p50's lower bound proves the score under the bar. The same decision uncut."""
    parsed = parse_goal("beat the baseline by 75% on TPOT and improve throughput by 3x within 9 trials")
    goal = parsed.model_copy(update={"objectives": list(reversed(parsed.objectives))})  # (the parser lists TPOT first)
    assert goal.scenarios == ["throughput", "decode"]
    long_decode = {"decode": SCENARIOS["decode"].model_copy(update={"output_tokens": 16}),
                   "throughput": SCENARIOS["throughput"].model_copy(update={"output_tokens": 16})}
    (tmp_path / "cut").mkdir()
    (tmp_path / "full").mkdir()
    kw = {"monkeypatch": monkeypatch, "goal": goal, "scenarios": long_decode, "baseline_repeats": 1}
    store, run_id, host = _run(tmp_path / "cut", [(SLOW, None)], **kw)
    ustore, urun_id, uhost = _run(tmp_path / "full", [(SLOW, None)], bar=False, **kw)
    cut, uncut = _slow(store, run_id), _slow(ustore, urun_id)
    for t in (cut, uncut):
        assert t.status == "discarded" and is_screened(t), t.error
    assert "decode stopped early after" in cut.error and "its tpot_ms_p50 could no longer get under the" in cut.error, cut.error
    assert is_stopped(cut) and not is_stopped(uncut) and uncut.score <= cut.score
    dec = {m.metric: m.value for m in store.measurements(cut.id) if m.scenario == "decode@0.25"}
    udec = {m.metric: m.value for m in ustore.measurements(uncut.id) if m.scenario == "decode@0.25"}
    assert dec["stopped_early"] == 1 and dec["tpot_ms_p50"] <= udec["tpot_ms_p50"]  # a lower bound of what it measured
    assert dec["duration_s"] < udec["duration_s"] / 2, (dec["duration_s"], udec["duration_s"])
    burst = [b for b in host.benched if b[0] == cut.number and b[1] == "throughput@0.25"]
    assert burst and burst[0][2] is None and not burst[0][4]  # TPOT unmeasured, no floors: the burst could not be stopped


def test_caps_are_the_speed_of_light_gates_own_edge_and_order_the_short_pass(tmp_path):
    """`verdict.speedup_caps` is where `gates.plausible.check` starts failing: at the cap's value it passes, a
    hair past it fails. The order follows: the loosest cap first; without caps, the goal's order."""
    from gates import plausible
    from orchestrator.trial import verdict
    from orchestrator.trial.fidelity import short_order

    store = Store("sqlite://")
    run = store.create_run("r", "g", {}, "h", {}, {}, "fake", "steps")
    goal = parse_goal(GOAL)
    base = verdict.Baseline(samples={}, values={"decode:tpot_ms_p50": 4.0, "throughput:output_throughput": 1000.0}, noise=0.04)
    assert verdict.speedup_caps(store, run.id, base, tmp_path, FOUR_WIDE, goal.objectives) == {}  # no floors: no caps
    _floors(store, run.id, tmp_path)
    caps = verdict.speedup_caps(store, run.id, base, tmp_path, FOUR_WIDE, goal.objectives)
    lims = plausible.limits(store.events(run.id, kind="speed_of_light")[-1].data, CONFIG, FOUR_WIDE)
    for label, (cap, value) in caps.items():
        scenario, key = label.split(":")
        higher = key == "output_throughput"
        assert cap == pytest.approx(value / 1000.0 if higher else 4.0 / value)
        for v, status in ((value, "pass"), (value * (1 + 1e-6) if higher else value * (1 - 1e-6), "fail")):
            assert plausible.check({scenario: {key: v}}, {scenario: {key: lims[scenario][key]}}, noise=0.04).status == status
    assert 1.5 < caps["decode:tpot_ms_p50"][0] < caps["throughput:output_throughput"][0]
    assert short_order(goal.scenarios, goal.objectives, caps) == ("throughput", "decode")
    assert short_order(goal.scenarios, goal.objectives, None) == ("decode", "throughput")
    # A p99 TPOT has no floor (the gate checks p50): uncapped, it goes first, and nothing bounds it while unmeasured.
    p99 = parse_goal("beat the baseline by 75% on p99 TPOT and improve throughput by 3x")
    base99 = verdict.Baseline(samples={}, values={"decode:tpot_ms_p99": 4.0, "throughput:output_throughput": 1000.0}, noise=0.04)
    caps99 = verdict.speedup_caps(store, run.id, base99, tmp_path, FOUR_WIDE, p99.objectives)
    assert set(caps99) == {"throughput:output_throughput"}
    assert short_order(p99.scenarios, p99.objectives, caps99) == ("decode", "throughput")


def test_a_statistic_without_a_proven_bound_never_gets_a_rule():
    """p99 TPOT measured last: no rule (its lower bound is not among those proven); p50 in its place: a rule."""
    from orchestrator.trial.fidelity import Screen

    for stat, ruled in (("p99", False), ("p50", True), ("mean", True)):
        goal = parse_goal(f"improve throughput by 3x and beat the baseline by 75% on {stat} TPOT")
        base = {"throughput:output_throughput": 100.0, f"decode:tpot_ms_{stat}": 10.0}
        s = Screen(fraction=0.25, scenarios={}, judge=lambda r, b: None, bar=0.9, objectives=tuple(goal.objectives), baseline=base)
        rule, skip = s.plan("decode", {"throughput:output_throughput": [50.0]})
        assert skip is None and (rule is not None) == ruled, (stat, rule)
        if ruled:
            assert rule.speedups == ((f"tpot_ms_{stat}", 10.0),) and rule.below == pytest.approx(0.81 / 0.5, rel=1e-6)
        assert s.plan("throughput", {}) == (None, None)  # first, TPOT unmeasured and uncapped: no rule
