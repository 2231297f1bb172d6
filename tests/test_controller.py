"""Controller decisions on a fast, torch-free target: the bench's fake streaming server.

The fake server's `--tpot-ms` is a knob, so speedups are known in advance; faults are knobs too.
Gates that need a real model (integrity, accuracy) are off here — they have their own tests and
run in tests/test_e2e.py; the lock check and the performance gate stay on.
"""

import json
import shutil
import threading
from pathlib import Path

import pytest
from burners import Burners
from fake_target import write_fake_target
from own_trials import candidates

import gates.lock
from gates.lock import GateTampered
from orchestrator.config.goal import load_goal, parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.runs import start_run
from orchestrator.store import Store

pytestmark = pytest.mark.slow  # launches (fake) servers


@pytest.fixture
def fake_ws(tmp_path, tiny_model):
    target = write_fake_target(
        tmp_path / "fake.toml", choices=(8.0, 6.0, 4.0, 7.9, 2.0),
        # A hanging request costs the whole bench.timeout_s: every 5th one hangs (2 of the decode
        # scenario's 10 at scale 0.5, not all 10: 6 s, not 30), and the trial still fails on them.
        extra_launch='{% if fault != "none" %} --fault {{ fault }} {% endif %}{% if fault == "hang" %} --fault-every 5 {% endif %}',
        extra_knobs='[knobs.fault]\ntype = "categorical"\nchoices = ["none", "http500", "hang", "crash"]\ndefault = "none"',
    )

    def make(steps, extra=()):
        f = tmp_path / "steps.json"
        f.write_text(json.dumps(steps))
        return Workspace(tmp_path, [f'target="{target}"', f'proposer="scripted:{f}"', "gates.accuracy=false",
                                    "gates.integrity=false", "bench.scale=0.5", "bench.timeout_s=3", *extra])
    return make


def _trials(ws, run_id):
    """The baseline and the proposer's candidates, in order (0 = baseline, 1 = first candidate): `own_trials`."""
    return dict(enumerate(candidates(Store(ws.db_url), run_id)))


def test_goal_met_is_confirmed_by_paired_ab_on_fresh_servers(fake_ws):
    # 8 -> 2 ms is 4x by design; on a loaded host every sleep overruns a little, so the measured
    # ratio is lower (2-3x) but stays clear of the goal's 1.67x.
    ws = fake_ws([{"tpot_ms": 6.0}, {"tpot_ms": 2.0}, {"tpot_ms": 7.9}])
    out = start_run(ws, parse_goal("beat the baseline by 40% on TPOT within 6 trials"))
    trials = Store(ws.db_url).list_trials(out.run_id)
    t = _trials(ws, out.run_id)
    assert t[1].status == "kept" and t[1].score < 1.45  # 8 -> 6 ms: better, not enough
    assert t[2].status == "kept" and t[2].score > 1.7  # meets the 40% cut
    # The claim rests on A B A B rounds on fresh servers, not on trial #2's own number.
    pairs = [x for x in trials if x.proposer == "paired" and x.status == "kept" and f"#{t[2].number}," in x.rationale]
    assert len(pairs) >= 6 and [p.knobs["tpot_ms"] for p in pairs[:2]] == [8.0, 2.0]
    assert not [x for x in trials if x.knobs.get("tpot_ms") == 7.9], "the run stops once the goal is confirmed"
    assert out.stop_reason.startswith("GoalMet") and f"#{t[2].number} " in out.stop_reason and "paired" in out.stop_reason
    store = Store(ws.db_url)
    assert store.get_run(out.run_id).best_trial_id == t[2].id
    paired = [e.data for e in store.events(out.run_id, kind="paired")]
    assert len(paired) == 1 and paired[0]["met"] and paired[0]["lo"] >= 1 / 0.6
    assert paired[0]["lo"] <= paired[0]["score"] <= paired[0]["hi"]
    assert abs(t[2].score - paired[0]["score"]) < 1e-9, "the trial's score is the paired ratio"
    perf = {n: [g.status for g in store.gate_results(t[n].id) if g.gate == "performance"] for n in (1, 2)}
    assert perf[1] == ["fail"] and perf[2][-1] in ("pass", "remeasure")
    # Every used measurement carries the host's state.
    hosts = [e for e in store.events(out.run_id, kind="measure.host") if e.trial_id == t[2].id]
    assert hosts and {"load1", "steal", "foreign_load", "client_cpu"} <= set(hosts[0].data["window"])


def _burn_from_paired_round(burn, seconds=None):
    """on_step: start the burners when the first paired round starts; stop them `seconds` later (None: never)."""
    def on_step(step):
        if step.startswith("paired round") and burn.started == 0:
            burn.start()
            if seconds is not None:
                threading.Timer(seconds, burn.stop).start()
    return on_step


def test_a_paired_round_beside_a_tenant_the_baseline_never_saw_is_redone(fake_ws):
    # Both halves of a round would see the burners alike, so they agree with each other; but they
    # measure the speedup beside a tenant the baseline never had. The round waits and is redone.
    ws = fake_ws([{"tpot_ms": 2.0}], extra=["bench.settle_s=20"])
    burn = Burners()
    try:
        out = start_run(ws, parse_goal("beat the baseline by 40% on TPOT within 2 trials"), on_step=_burn_from_paired_round(burn, 4.0))
    finally:
        burn.stop()
    store = Store(ws.db_url)
    redo = [e.message for e in store.events(out.run_id, kind="measure.redo")]
    assert burn.started == 1 and any("busier than at the baseline" in m for m in redo), redo
    paired = [e.data for e in store.events(out.run_id, kind="paired")]
    assert out.stop_reason.startswith("GoalMet") and paired[-1]["met"], (out.stop_reason, redo)


def test_a_host_that_stays_busy_through_the_confirmation_claims_nothing(fake_ws):
    ws = fake_ws([{"tpot_ms": 2.0}], extra=["bench.settle_s=1"])
    burn = Burners()
    try:
        out = start_run(ws, parse_goal("beat the baseline by 40% on TPOT within 2 trials"), on_step=_burn_from_paired_round(burn))
    finally:
        burn.stop()
    store = Store(ws.db_url)
    paired = [e.data for e in store.events(out.run_id, kind="paired")]
    assert not out.stop_reason.startswith("GoalMet"), out.stop_reason
    assert paired and not paired[-1]["met"] and not paired[-1]["score"], paired
    assert "too busy to measure" in paired[-1]["why"] and "busier than at the baseline" in paired[-1]["why"]
    redo = [e.message for e in store.events(out.run_id, kind="measure.redo") if e.message.startswith("round")]
    assert redo and "stayed busy" in redo[0], redo
    # The round after a settle wait the host stayed busy through measures its half once (no redo at
    # once beside the same tenant): the first round's half made up to 3 attempts, every later one 1.
    halves = {t.id for t in store.list_trials(out.run_id) if t.proposer == "paired"}
    attempts = [e.data["attempts"] for e in store.events(out.run_id, kind="measure.host") if e.trial_id in halves]
    assert len(attempts) > len(redo) and set(attempts[1:]) == {1}, (attempts, redo)


def test_a_winner_whose_screen_stalled_is_confirmed_at_the_stop(tmp_path, tiny_model):
    # 8 -> 2 ms is 4x, but the candidate's first server runs 3x slow (6 ms: 1.33x, under the goal's
    # 1.67x): kept, not confirmed during the search. At the stop its pairs, on fresh servers at
    # speed, meet the goal: the run ends GoalMet, not "BudgetExhausted ... goal met".
    marker = tmp_path / "slow-once"
    target = write_fake_target(
        tmp_path / "fake.toml", choices=(8.0, 2.0), extra_launch='{% if slow_once %} --slow-once {{ slow_once }} {% endif %}',
        extra_knobs=f'[knobs.slow_once]\ntype = "categorical"\nchoices = ["", "{marker}"]\ndefault = ""')
    f = tmp_path / "steps.json"
    f.write_text(json.dumps([{"tpot_ms": 2.0, "slow_once": str(marker)}]))
    ws = Workspace(tmp_path, [f'target="{target}"', f'proposer="scripted:{f}"', "gates.accuracy=false",
                              "gates.integrity=false", "bench.scale=0.5", "bench.timeout_s=3"])
    out = start_run(ws, parse_goal("beat the baseline by 40% on TPOT within 2 trials"))
    t = _trials(ws, out.run_id)
    assert marker.exists() and t[1].status == "kept"
    why = [e.message for e in Store(ws.db_url).events(out.run_id, kind="trial.why") if e.trial_id == t[1].id]
    assert "may meet the goal" not in why[0], why  # the screen said no
    # ... and still says no once the pairs, at the stop, said yes (it once said both).
    assert len(why) == 2 and "paired A/B" in why[1] and "may meet the goal" not in why[1], why
    assert out.stop_reason.startswith("GoalMet") and "confirmed at the stop (BudgetExhausted" in out.stop_reason, out.stop_reason
    assert Store(ws.db_url).get_run(out.run_id).best_trial_id == t[1].id


def test_crashing_and_hanging_candidates_fail_the_trial_not_the_run(fake_ws):
    ws = fake_ws([{"fault": "http500"}, {"fault": "hang"}, {"tpot_ms": 4.0}])
    out = start_run(ws, parse_goal("beat the baseline by 10% on TPOT within 4 trials"))
    t = _trials(ws, out.run_id)
    assert t[1].status == "failed" and "http_500" in t[1].error
    assert t[2].status == "failed" and "timeout" in t[2].error
    assert t[3].status == "kept"
    # neither a bench failure without an out-of-memory message nor a timeout marks a failed region
    assert not [e for e in Store(ws.db_url).events(out.run_id, kind="trial.why") if "region" in (e.data or {})]
    assert out.stop_reason.startswith("GoalMet")


def test_server_that_dies_at_launch_is_a_failed_trial_with_its_log(fake_ws):
    # fakeserver rejects an unknown --fault value: the process exits before it is healthy.
    ws = fake_ws([{"fault": "crash"}])
    out = start_run(ws, parse_goal("beat the baseline by 10% on TPOT within 2 trials"))
    t = _trials(ws, out.run_id)
    assert t[1].status == "failed" and "ServerCrashed" in t[1].error and "invalid choice" in t[1].error
    # a deterministic start-up crash marks exactly its knob set, and its why says so
    [why] = [e for e in Store(ws.db_url).events(out.run_id, kind="trial.why") if e.trial_id == t[1].id]
    assert why.data["region"]["kind"] == "crash" and f"marked the failed region (start-up crash at #{t[1].number}: exactly" in why.message
    assert out.stop_reason.startswith(("ProposerExhausted", "BudgetExhausted"))


def test_stall_and_budget_stops(fake_ws, tmp_path):
    ws = fake_ws([{"tpot_ms": 7.9}] * 1 + [{"fault": "http500"}] * 5)
    goal = tmp_path / "g.toml"
    goal.write_text('[[objectives]]\nmetric = "tpot"\nvalue = 0.5\n[budget]\ntrials = 10\nstall_trials = 3\n')
    out = start_run(ws, load_goal(goal))
    # 7.9 ms vs 8 ms is inside this host's noise: kept or not, three failures in a row then stall.
    assert out.stop_reason.startswith("Stalled") and len(_trials(ws, out.run_id)) in (4, 5)


def test_gate_file_edited_mid_run_stops_the_run(fake_ws, tmp_path, monkeypatch):
    # Work on a copy of the gate suite, so the real one is never touched.
    copy = tmp_path / "gates_copy"
    shutil.copytree(Path(gates.lock.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(gates.lock, "_root", lambda root=None: Path(root) if root else copy)
    ws = fake_ws([{"tpot_ms": 6.0}, {"tpot_ms": 4.0}])
    edits = []

    def on_step(step):
        if step.startswith("bench") and not edits and _trials(ws, 1).get(1, None) is not None:
            (copy / "thresholds.toml").write_text((copy / "thresholds.toml").read_text() + "\n# loosened\n")
            edits.append(step)

    with pytest.raises(GateTampered, match="thresholds.toml"):
        start_run(ws, parse_goal("beat the baseline by 60% on TPOT within 5 trials"), on_step=on_step)
    store = Store(ws.db_url)
    run = store.latest_run()
    t = _trials(ws, run.id)
    assert run.status == "failed" and "GateTampered" in run.stop_reason
    assert t[1].status == "kept", "the trial measured before the edit stands"
    # The next trial (candidate #2, or a baseline sentinel if the host's load moved) is refused.
    last = store.list_trials(run.id)[-1]
    assert last.status == "invalid" and "thresholds.toml" in last.error
    assert not store.measurements(last.id), "nothing measured after the edit counts"
    assert [e.kind for e in store.events(run.id, kind="gates.tampered")] == ["gates.tampered"]


def test_probes_after_the_stop_measure_the_winners_neighbours_and_a_resume_finishes_them(fake_ws):
    """`probe_winner = 2`: after GoalMet the winner's first two one-knob neighbours are measured,
    never kept, outside the trial budget; the finding records them. A run interrupted between
    them resumes into the probes, keeps its stop reason and measures nothing twice."""
    from orchestrator.knowledge.entries import parse_entry
    from orchestrator.runs import resume_run

    ws = fake_ws([{"tpot_ms": 2.0}], extra=["probe_winner=2"])

    def stop_after_first_probe(trial):
        if trial.proposer == "probe":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start_run(ws, parse_goal("beat the baseline by 40% on TPOT within 2 trials"), on_trial=stop_after_first_probe)
    store = Store(ws.db_url)
    run = store.latest_run()
    assert run.status == "stopped"
    [decided] = [e.message for e in store.events(run.id, kind="probe.start")]
    assert decided.startswith("GoalMet")
    out = resume_run(ws, run.id)
    assert out.stop_reason == decided
    trials = store.list_trials(run.id)
    probes = [t for t in trials if t.proposer == "probe"]
    win = store.get_trial(store.get_run(run.id).best_trial_id)
    assert win.knobs["tpot_ms"] == 2.0 and win.proposer in ("scripted", "retry")  # a retry: re-run on a busy host
    # the winner with tpot_ms changed, in the target's order of choices; 8.0 is the baseline's knob set, measured already
    assert [t.knobs["tpot_ms"] for t in probes] == [6.0, 4.0]
    assert all(t.status == "discarded" and t.score and t.score < win.score for t in probes)
    assert len({json.dumps(t.knobs, sort_keys=True) for t in probes}) == 2
    finding = next(p for p in (ws.kb_write_dir / "findings").glob("*.md") if parse_entry(p).meta.get("knobs"))
    assert [p["trial"] for p in parse_entry(finding).meta["probes"]] == sorted(
        (t.number for t in probes), key=lambda n: -store.get_trial_by_number(run.id, n).score)


def test_a_run_interrupted_in_its_paired_rounds_still_writes_its_knowledge(fake_ws):
    """The product path of a stop from outside (`timeout -s INT` in the paired rounds at the stop, as on
    the H200's 2B run): `start_run` re-raises the interrupt after writing the best kept trial as an
    unconfirmed winner, so a run on another model starts warm."""
    from orchestrator.knowledge.entries import parse_entry

    ws = fake_ws([{"tpot_ms": 6.0}])

    def stop_in_the_paired_rounds(trial):
        if trial.proposer == "paired":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # 8 -> 6 ms is kept, not the 80% asked: paired rounds at the stop
        start_run(ws, parse_goal("beat the baseline by 80% on TPOT within 2 trials"), on_trial=stop_in_the_paired_rounds)
    store = Store(ws.db_url)
    run = store.latest_run()
    assert run.status == "stopped"
    [written] = store.events(run.id, kind="kb.write_back")
    assert written.data["interrupted"] and "unconfirmed" in written.message
    finding = parse_entry(Path(written.data["path"]))
    assert finding.status == "hypothesis" and finding.meta["knobs"]["tpot_ms"] == 6.0
    assert "not confirmed by paired rounds" in finding.meta["evidence"][0]["unconfirmed"]


def test_an_absolute_goal_is_met_by_the_setting_under_its_bar_and_confirmed_in_every_paired_round(fake_ws):
    """Bars in absolute terms (`get p50 TPOT under 3.5 ms`, as benchmarks/gpu's best-known goal writes them): a
    setting over the bar is kept but does not meet it; the one under it is confirmed in paired rounds, each of which
    must meet the bar, and the run stops there."""
    ws = fake_ws([{"tpot_ms": 6.0}, {"tpot_ms": 2.0}, {"tpot_ms": 7.9}])
    goal = parse_goal("get p50 TPOT under 3.5 ms within 6 trials")
    assert [o.kind for o in goal.objectives] == ["absolute"]
    out = start_run(ws, goal)
    t = _trials(ws, out.run_id)
    store = Store(ws.db_url)
    perf = {n: [g.status for g in store.gate_results(t[n].id) if g.gate == "performance"] for n in (1, 2)}
    assert perf[1] == ["fail"] and perf[2][-1] == "pass"  # 6 ms misses the bar, 2 ms is under it
    paired = [e.data for e in store.events(out.run_id, kind="paired")]
    assert len(paired) == 1 and paired[0]["met"]
    assert out.stop_reason.startswith("GoalMet") and f"#{t[2].number} " in out.stop_reason
    assert not [x for x in store.list_trials(out.run_id) if x.knobs.get("tpot_ms") == 7.9]


def test_a_run_interrupted_in_its_paired_rounds_resumes_them_where_they_stopped(fake_ws):
    """Cut after two whole paired rounds of a winner (a command's wall limit, as on the H200's transformers serve
    run): the resumed run continues that confirmation before proposing, its two rounds count, and only the rounds
    still needed are measured."""
    from orchestrator.runs import resume_run

    ws = fake_ws([{"tpot_ms": 2.0}])
    halves: list[int] = []

    def stop_after_two_rounds(trial):
        if trial.proposer == "paired" and trial.status == "kept":
            halves.append(trial.number)
            if len(halves) == 4:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start_run(ws, parse_goal("beat the baseline by 40% on TPOT within 2 trials"), on_trial=stop_after_two_rounds)
    store = Store(ws.db_url)
    run = store.latest_run()
    assert run.status == "stopped" and not store.events(run.id, kind="paired")
    out = resume_run(ws, run.id)
    assert out.stop_reason.startswith("GoalMet"), out.stop_reason
    [paired] = store.events(run.id, kind="paired")
    assert paired.data["met"] and paired.data["pair_trials"][:2] == [halves[:2], halves[2:]]
    said = [e.message for e in store.events(run.id, kind="resume")]
    assert any("continues from its 2 whole rounds" in m for m in said), said
    after = [t for t in store.list_trials(run.id) if t.number > halves[-1]]
    assert all(t.proposer == "paired" for t in after), [(t.number, t.proposer) for t in after]  # nothing proposed first
    used = [t for t in after if t.status == "kept"]
    assert len(used) == 2 * (paired.data["rounds"] - 2)


def test_a_run_resumed_on_other_gpus_is_refused_and_keeps_everything(fake_ws):
    """A run continues only on the GPU models it started on: one started on an H200 (its `run.start` fingerprint)
    resumed on this host (other GPUs, or none) is refused in one line that says what to do, before anything runs."""
    import sqlite3

    from orchestrator.hosts import HostError
    from orchestrator.runs import resume_run

    ws = fake_ws([{"tpot_ms": 6.0}])

    def stop_at_the_first_trial(trial):
        if trial.number == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start_run(ws, parse_goal("beat the baseline by 80% on TPOT within 3 trials"), on_trial=stop_at_the_first_trial)
    store = Store(ws.db_url)
    run = store.latest_run()
    [start] = store.events(run.id, kind="run.start")
    here = start.data["fingerprint"].get("gpus") or []
    card = "NVIDIA H200, 143771 MiB, 580.159.04" if not here else "NVIDIA A100-SXM4-80GB, 81920 MiB, 550.54"
    with sqlite3.connect(ws.db_url.removeprefix("sqlite:///")) as db:
        db.execute("update events set data_json = ? where id = ?",
                   (json.dumps({"fingerprint": {**start.data["fingerprint"], "gpus": [card]}}), start.id))
    before = [(t.number, t.status) for t in store.list_trials(run.id)]
    with pytest.raises(HostError) as e:
        resume_run(ws, run.id)
    said = str(e.value)
    assert f"run {run.id} was measured on {card.split(',')[0]}; this host has " in said and "`infergoal goal`" in said, said
    assert "\n" not in said
    assert [(t.number, t.status) for t in store.list_trials(run.id)] == before
    assert store.get_run(run.id).status == run.status
    assert [e.message for e in store.events(run.id, kind="resume")] == []
