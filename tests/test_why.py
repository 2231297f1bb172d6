"""Why a trial was kept or discarded, and the paired speedup, as `show`, `status` and the report say them."""

import json

from typer.testing import CliRunner

from gates.result import GateResult
from orchestrator.cli import app
from orchestrator.store import Store
from orchestrator.trial.paired import PairedOutcome, describe
from orchestrator.trial.verdict import why_data

runner = CliRunner()
PAIRED = PairedOutcome(trial=1, rounds=3, score=4.31, lo=4.12, hi=4.50, confidence=0.9, met=True,
                       why="throughput:output_throughput: paired 4.31x [4.12, 4.50] reaches 2.500x in every pair",
                       pair_trials=[[2, 3], [4, 5], [6, 7]]).to_dict()


def test_the_sentence_names_score_best_threshold_noise_and_gates():
    gates = [GateResult("integrity", "pass", "", {}, 0.1), GateResult("performance", "fail", "", {}, 0.0)]
    d = why_data(number=4, status="discarded", proposer="search", score=1.52, best=1.60, min_gain=0.03, noise=0.08,
                 baseline_trial=3, gates=gates, error=None)
    s = d["sentence"]
    assert s.startswith("#4 discarded: score 1.520x against baseline #3 did not clear the keep line 1.728x")
    assert "best 1.600x + 8.0%, set by baseline noise 8.0%" in s and "integrity pass, performance fail" in s
    assert d["threshold"] == 1.60 * 1.08 and d["noise"] == 0.08
    kept = why_data(number=5, status="kept", proposer="search", score=2.0, best=1.6, min_gain=0.03, noise=0.01,
                    baseline_trial=0, gates=[], error=None, paired=PAIRED, screen_met=True)["sentence"]
    assert "cleared the keep line 1.648x" in kept and "set by min_gain 3%" in kept and "may meet the goal" in kept
    assert "paired A/B: 4.31x [4.12, 4.50] (90%, 3 paired rounds), goal met" in kept
    failed = why_data(number=6, status="invalid", proposer="search", score=None, best=1.6, min_gain=0.03, noise=0.0,
                      baseline_trial=0, gates=[], error="untrusted measurement in throughput after 3 attempts: x")
    assert failed["sentence"].startswith("#6 invalid: untrusted measurement")


def _run_with_a_baseline(tmp_path):
    """A throughput run in the workspace's store whose baseline (#0, batching off) was measured at 200 tok/s."""
    store = Store(f"sqlite:///{tmp_path / '.infergoal' / 'infergoal.db'}")
    run = store.create_run("r", "improve throughput by 2.5x", {"objectives": [{"metric": "throughput", "value": 1.5}]},
                           "h", {"name": "t"}, {}, "local", "search")
    t0 = store.create_trial(run.id, 0, commit="", knobs={"batching": "off"}, rationale="", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0, objective={"throughput:output_throughput": 200.0})
    return store, run


def test_show_status_and_report_give_the_paired_ratio_and_the_reason(tmp_path):
    store, run = _run_with_a_baseline(tmp_path)
    t1 = store.create_trial(run.id, 1, commit="", knobs={"batching": "on"}, rationale="", proposer="search")
    store.finish_trial(t1.id, "kept", score=4.31, objective={"throughput:output_throughput": 900.0})
    store.set_best_trial(run.id, t1.id)
    store.add_event(run.id, "paired", describe(PAIRED), data=PAIRED, trial_id=t1.id)
    store.add_event(run.id, "trial.why", "#1 kept: score 4.310x cleared 1.030x", data={"sentence": "#1 kept: score 4.310x cleared 1.030x"},
                    trial_id=t1.id)
    store.add_event(run.id, "measure.host", "m", trial_id=t1.id, data={
        "scenario": "throughput", "repeat": 0, "attempts": 2, "untrusted": [],
        "window": {"load1": 3.1, "foreign_load": 0.4, "steal": 0.0, "client_cpu": 0.2},
        "prompts": {"seed": 3, "prompt_seed": 2718281828, "redone_with": [314159]}})
    store.set_run_status(run.id, "finished", "GoalMet: #1 meets every objective")

    r = runner.invoke(app, ["-w", str(tmp_path), "show", "1"])
    assert r.exit_code == 0, r.output
    assert "why: #1 kept: score 4.310x cleared 1.030x" in r.output
    assert "paired A/B: 4.31x [4.12, 4.50] (90%, 3 paired rounds), goal met" in r.output
    assert "load 3.10" in r.output and "2 attempts" in r.output and "prompts drawn 2718281828" in r.output
    r = runner.invoke(app, ["-w", str(tmp_path), "why", "1"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "throughput #0 draw 2718281828 (redone from 314159)" in r.output, r.output
    d = json.loads(runner.invoke(app, ["-w", str(tmp_path), "show", "1", "--json"]).output)
    assert d["paired"]["lo"] == 4.12 and d["why"].startswith("#1 kept") and d["host"][0]["attempts"] == 2
    r = runner.invoke(app, ["-w", str(tmp_path), "status"], env={"COLUMNS": "200"})
    assert "4.31x [4.12, 4.50]" in r.output
    assert json.loads(runner.invoke(app, ["-w", str(tmp_path), "status", "--json"]).output)[0]["paired"]["hi"] == 4.5
    d = json.loads(runner.invoke(app, ["-w", str(tmp_path), "report", "--json"]).output)
    text = open(d["report"]).read()
    assert "paired speedup **4.31× [4.12, 4.50]**" in text and "3 A/B rounds on fresh servers" in text


def test_why_numbers_are_never_scientific_and_abbreviations_are_said():
    from orchestrator.review.facts import plain_number, why_facts

    assert [plain_number(v) for v in (1040.0, 999.7, 12.345, 0.5, 0.0000123, 0.0, 3)] == \
        ["1040", "1000", "12.3", "0.5", "0.0000123", "0", "3"]
    perf = {"gate": "performance", "status": "pass", "reason": "faster", "k_sigma": 2.0,
            "metrics": [{"metric": "throughput", "baseline_mean": 1040.0, "candidate_mean": 20805.5, "verdict": "pass"}]}
    said = " ".join(f"{k}: {v}" for k, v in why_facts({"performance": perf, "objective": {"throughput": 123456.7}}))
    assert "e+" not in said and "1040 -> 20806" in said and "123457" in said
    assert "standard errors a change must clear (k_sigma)=2" in said


def test_why_names_the_glossary_and_calls_a_baseline_measured(tmp_path):
    store, run = _run_with_a_baseline(tmp_path)
    r = runner.invoke(app, ["-w", str(tmp_path), "why", "0"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert r.output.startswith("run 1 trial #0 — measured (decided by baseline)") and "docs/glossary.md" in r.output


def _keep_line_run(tmp_path, *, paired_confirms: bool, noisy: bool = False):
    """A run whose trial #1 the screen says may meet the goal (TPOT 8 -> 6 ms: 1.33x for a 1.2x goal)
    while min_gain 60% puts its keep line at 1.6x. Its paired rounds measure it at 6 ms again
    (`paired_confirms`) or at the baseline's 8 ms (the screen was luck). `noisy`: the baseline's two
    repeats measure 8 and 12 ms (a 40% spread, more than the goal's 25% step)."""
    from fake_target import write_fake_target
    from test_fidelity import CHOICES, FakeHost, FakeSite

    from orchestrator.bench.saturation import SaturationPolicy
    from orchestrator.bench.scenarios import builtin_scenarios
    from orchestrator.config.goal import parse_goal
    from orchestrator.hosts.measure import TrustPolicy
    from orchestrator.loop.controller import Controller
    from orchestrator.proposers import ScriptedProposer
    from orchestrator.targets import load_target
    from orchestrator.trial.context import TrialContext

    class LuckySite(FakeSite):
        def bench(self, base_url, model, scenario, **kw):
            if noisy and self.host.trial_no == 0:
                self.host.calls = getattr(self.host, "calls", 0) + 1
                self.host.argv[self.host.argv.index("--tpot-ms") + 1] = "12.0" if self.host.calls % 2 == 0 else "8.0"
            if not paired_confirms and self.host.trial_no != 1 and "6.0" in self.host.argv:
                self.host.argv[self.host.argv.index("6.0")] = "8.0"  # in its paired rounds, no faster than the baseline
            return super().bench(base_url, model, scenario, **kw)

    class LuckyHost(FakeHost):
        def site(self):
            return LuckySite(self)

    tmp_path.mkdir(parents=True, exist_ok=True)
    target = load_target(write_fake_target(tmp_path / "fake.toml", choices=CHOICES))
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    run = store.create_run("r", "g", {}, "h", {}, {}, "fake", "scripted")
    ctx = TrialContext(run_id=run.id, goal=parse_goal("beat the baseline by 20% on TPOT within 2 trials"), target=target,
                       host=LuckyHost(), store=store, model_dir=tmp_path, reference_dir=tmp_path,
                       scenarios=builtin_scenarios(0.5), run_dir=tmp_path / "run", source_dir=tmp_path, accuracy_gate=False,
                       integrity_gate=False,
                       trust=TrustPolicy(probe_s=0.0, settle_s=0.0, saturation=SaturationPolicy(max_client_cpu=float("inf"))))
    reason = Controller(ctx, ScriptedProposer([{"tpot_ms": 6.0}]), min_gain=0.6).run()
    return store, run.id, reason


def test_a_trial_under_its_keep_line_is_not_kept_when_its_paired_ab_does_not_confirm_it(tmp_path):
    store, rid, reason = _keep_line_run(tmp_path, paired_confirms=False)
    t1 = store.get_trial_by_number(rid, 1)
    best = store.get_trial(store.get_run(rid).best_trial_id)
    assert t1.status == "discarded" and best.number == 0, (t1.status, best.number, reason)  # no candidate: the baseline
    why = runner.invoke(app, ["-w", str(tmp_path), "--db", f"sqlite:///{tmp_path / 'db.sqlite'}", "why", "1"],
                        env={"COLUMNS": "300"}).output
    assert "#1 discarded: score 1.333x against baseline #0 did not clear the keep line 1.600x" in why
    assert "a paired A/B decides" in why and "goal not met" in why and "kept" not in why.split("\n")[0]


def test_a_trial_under_its_keep_line_is_kept_by_a_paired_ab_that_meets_the_goal(tmp_path):
    store, rid, reason = _keep_line_run(tmp_path, paired_confirms=True)
    t1 = store.get_trial_by_number(rid, 1)
    assert reason.startswith("GoalMet") and t1.status == "kept" and store.get_run(rid).best_trial_id == t1.id
    from orchestrator.trial.verdict import why_of

    said = why_of(store, rid, t1.id)
    assert said.startswith("#1 kept: its paired A/B meets the goal, though its score 1.333x against baseline #0 is under "
                           "the keep line 1.600x"), said


def test_a_baseline_noisier_than_the_goal_says_so_when_measured_and_in_the_verdict(tmp_path):
    from orchestrator.trial.verdict import NOISE_HIGH

    store, rid, reason = _keep_line_run(tmp_path / "noisy", paired_confirms=False, noisy=True)
    [said] = store.events(rid, kind=NOISE_HIGH)
    assert said.trial_id == store.get_trial_by_number(rid, 0).id  # recorded on the baseline, as it was measured
    assert said.message.startswith("the baseline's noise 40.0% is larger than the 25.0% change the goal asks for")
    for what in ("bench.baseline_repeats", "taskset", "a quieter host"):
        assert what in said.message and what in reason, reason
    store, rid, reason = _keep_line_run(tmp_path / "quiet", paired_confirms=False)  # repeats that agree: nothing said
    assert not store.events(rid, kind=NOISE_HIGH) and "noise" not in reason
