"""Defects seen on an H200 run: one test (or a few) per defect, named after it.

None needs a server or a GPU: the accuracy gate's judging runs on metrics measured on the H200,
nvidia-smi is a fake that answers what the H200 did, and the loop's decisions run on a seeded store.
"""

import os
import subprocess
from types import SimpleNamespace

import pytest

from gates.accuracy import judge
from gates.result import GateResult
from gates.thresholds import load_thresholds
from orchestrator.cli.live import _Progress, resume_progress
from orchestrator.config.goal import parse_goal
from orchestrator.core.candidate import Candidate
from orchestrator.hosts import state
from orchestrator.hosts.measure import TrustPolicy, state_change
from orchestrator.loop.controller import Controller
from orchestrator.store import Store
from orchestrator.trial.paired import PairedOutcome
from orchestrator.trial.run import _run_gates, accuracy_reference
from orchestrator.trial.verdict import ASSUMED_NOISE, baseline_noise, why_data, why_of, why_record

CFG = load_thresholds()["accuracy"]
GOAL = parse_goal("beat the baseline by 20% on TPOT without accuracy loss within 20 trials")
TPOT = "decode:tpot_ms_p50"

# The honest bf16 7B baseline on the H200 (2026-12-01), against its float32 reference.
BF16 = {"mean_abs_dlogprob": 0.0193, "kl_mean": 0.000109, "containment_fail_rate": 0.0, "greedy_mismatch_rate": 0.03,
        "ppl_log_ratio": 0.001, "gen_offtop_rate": 0.0, "gen_offtop_worst": 0.0, "ppl_served": 10.01, "ppl_reference": 10.0}
# Three times further from the reference, still under every hard limit.
WORSE = {**BF16, "mean_abs_dlogprob": 3 * 0.0193 * 0.8, "kl_mean": 3 * 0.000109}


def _store(tmp_path, goal=GOAL):
    store = Store(f"sqlite:///{tmp_path / 'infergoal.db'}")
    run = store.create_run("r", goal.text, goal.model_dump(mode="json"), goal.digest, {"name": "t"}, {}, "local", "search")
    return store, run.id


def _trial(store, run_id, number, proposer, status="kept", tpot=None, accuracy=None, gates=()):
    t = store.create_trial(run_id, number, commit="", knobs={"n": number}, rationale=f"#{number}", proposer=proposer)
    if accuracy is not None:
        store.add_gate_result(t.id, "accuracy", "drift", "r", {"metrics": accuracy}, 1.0)
    for gate, status_ in gates:
        store.add_gate_result(t.id, gate, status_, "r", {}, 0.0)
    if tpot is not None:
        for rep, v in enumerate([tpot] if isinstance(tpot, float) else tpot):
            store.add_measurements(t.id, "decode", {"tpot_ms_p50": v}, repeat=rep)
    if status not in ("pending", "running"):
        store.finish_trial(t.id, status, score=1.0 if number == 0 else 1.5, objective={TPOT: tpot if isinstance(tpot, float) else 0.0})
    return store.get_trial(t.id)


def _controller(store, run_id, **target):
    ctx = SimpleNamespace(run_id=run_id, store=store, goal=GOAL, on_step=lambda s: None, trust=TrustPolicy(), base_commit="",
                          target=SimpleNamespace(baseline_knobs=lambda: {"n": 0}, **target))
    return Controller(ctx, proposer=None)


# --- 1. the bf16 baseline flagged itself ---------------------------------------------------------

def test_defect1_drift_is_judged_against_the_baselines_own_not_an_absolute_limit():
    assert judge(BF16, CFG)[0] == "drift"  # the old absolute judgement: honest bf16 on the 7B needs approval
    # The baseline itself: its drift is the reference candidates are judged against, never drift.
    status, reason = judge(BF16, CFG, is_baseline=True)
    assert status == "pass" and "baseline's own drift" in reason and "mean_abs_dlogprob=0.0193" in reason
    # A candidate as far from the reference as the baseline passes without approval ...
    assert judge(BF16, CFG, baseline=[BF16])[0] == "pass"
    assert judge({**BF16, "mean_abs_dlogprob": 0.021, "kl_mean": 0.00012}, CFG, baseline=[BF16])[0] == "pass"  # its noise
    # ... one clearly worse (~3x the baseline's drift, under every hard limit) still needs approval,
    status, reason = judge(WORSE, CFG, baseline=[BF16])
    assert status == "drift" and "needs approval" in reason and "the baseline's 0.0193 x 1.5" in reason, reason
    # ... and hard limits stay absolute, for candidates and baselines alike.
    broken = {**BF16, "mean_abs_dlogprob": 0.06}
    for kw in ({}, {"baseline": [broken]}, {"is_baseline": True}):
        assert judge(broken, CFG, **kw)[0] == "fail", kw
    # With no baseline figures (none recorded), or a baseline that matches the reference exactly, the
    # configured soft limits hold as before.
    exact = dict.fromkeys(BF16, 0.0) | {"ppl_served": 1.0, "ppl_reference": 1.0}
    assert judge(WORSE, CFG, baseline=[])[0] == judge(WORSE, CFG, baseline=[exact])[0] == "drift"
    assert judge({**exact, "mean_abs_dlogprob": 0.01}, CFG, baseline=[exact])[0] == "pass"


def test_defect1_the_baseline_noise_is_the_worst_of_its_own_gate_runs():
    sentinel = {**BF16, "mean_abs_dlogprob": 0.028}  # the same knobs on another window draw
    cand = {**BF16, "mean_abs_dlogprob": 0.04}
    assert judge(cand, CFG, baseline=[BF16])[0] == "drift"
    assert judge(cand, CFG, baseline=[BF16, sentinel])[0] == "pass"


def test_defect1_a_trial_is_gated_against_the_recorded_baseline_figures(tmp_path):
    store, run_id = _store(tmp_path)
    t0 = _trial(store, run_id, 0, "baseline", tpot=30.0, accuracy=BF16)
    s = _trial(store, run_id, 1, "sentinel", tpot=28.0, accuracy={**BF16, "kl_mean": 0.00012})
    _trial(store, run_id, 2, "search", status="failed", accuracy={**BF16, "mean_abs_dlogprob": 0.049})  # not a baseline
    cand = _trial(store, run_id, 3, "search", status="running")
    assert accuracy_reference(store, run_id, t0) == accuracy_reference(store, run_id, s) == {"is_baseline": True}
    ref = accuracy_reference(store, run_id, cand)
    assert [m["kl_mean"] for m in ref["baseline"]] == [0.000109, 0.00012]

    class Site:  # the gate's own judgement on what the H200's servers measured
        def __init__(self, metrics):
            self.metrics, self.calls = metrics, []

        def accuracy(self, base_url, **kw):
            self.calls.append(kw)
            status, reason = judge(self.metrics, CFG, baseline=kw.get("baseline"), is_baseline=kw.get("is_baseline", False))
            return GateResult("accuracy", status, reason, {"metrics": self.metrics}, 0.1)

    ctx = SimpleNamespace(store=store, run_id=run_id, integrity_gate=False, accuracy_gate=True, reference_dir="ref",
                          target=SimpleNamespace(served_model_name="m", api="completions"))
    assert _run_gates(ctx, Site(BF16), cand, None, "http://x", 1, None) == (None, False, None)  # no drift: no approval
    assert _run_gates(ctx, Site(BF16), t0, None, "http://x", 1, None)[1] is False  # the baseline never drifts from itself
    assert _run_gates(ctx, Site(WORSE), cand, None, "http://x", 1, None)[1] is True  # clearly worse: needs approval
    assert _run_gates(ctx, Site({**BF16, "kl_mean": 0.004}), cand, None, "http://x", 1, None)[0].startswith("accuracy gate:")


# --- 2. noise 0.0% with the baseline measured once ------------------------------------------------

def test_defect2_noise_of_a_baseline_measured_once_comes_from_its_sentinels_or_is_assumed_and_said():
    one = {TPOT: [31.96]}
    assert baseline_noise(one, [one]) == (ASSUMED_NOISE, "assumed") and ASSUMED_NOISE > 0
    runs = [{TPOT: [v]} for v in (31.96, 26.33, 23.50, 27.20)]  # the H200's baseline + sentinels
    noise, basis = baseline_noise(runs[-1], runs)
    assert noise == pytest.approx((31.96 - 23.50) / (sum((31.96, 26.33, 23.50, 27.20)) / 4)) and basis == "across 4 baseline measurements"
    two = {TPOT: [30.0, 30.6]}  # repeats of the newest: as before
    assert baseline_noise(two, [runs[0], two]) == (pytest.approx(0.6 / 30.3), "")
    kept = why_data(number=2, status="kept", proposer="search", score=1.3, best=1.0, min_gain=0.03, noise=ASSUMED_NOISE,
                    baseline_trial=0, gates=[], error=None, noise_basis="assumed")["sentence"]
    assert "noise assumed 5.0% (one baseline measurement)" in kept and "noise 0.0%" not in kept, kept
    kept = why_data(number=2, status="kept", proposer="search", score=1.5, best=1.0, min_gain=0.03, noise=noise,
                    baseline_trial=4, gates=[], error=None, noise_basis=basis)["sentence"]
    assert "set by baseline noise 31.0% across 4 baseline measurements" in kept, kept


def test_defect2_the_controller_never_judges_with_zero_noise(tmp_path):
    store, run_id = _store(tmp_path)
    _trial(store, run_id, 0, "baseline", tpot=31.96)
    c = _controller(store, run_id)
    b = c._baseline()
    assert (b.noise, b.noise_basis) == (ASSUMED_NOISE, "assumed")
    for n, v in ((1, 26.33), (2, 23.50), (3, 27.20)):
        _trial(store, run_id, n, "sentinel", tpot=v)
    _trial(store, run_id, 4, "sentinel", status="invalid", tpot=90.0)  # an untrusted re-measure is no baseline
    b = c._baseline()
    assert b.trial == 3 and b.values[TPOT] == 27.20
    assert b.noise == pytest.approx(0.3105, abs=1e-3) and b.noise_basis == "across 4 baseline measurements"


# --- 3. our own GPU memory counted as others' -----------------------------------------------------

def _smi(gpu_line, apps):
    def smi(query):
        return gpu_line + "\n" if query.startswith("--query-gpu") else apps
    return smi


def test_defect3_gpu_memory_of_our_own_processes_is_not_others(tmp_path):
    line = "GPU-5f2a, 1980, 1980, 41, 44323, 143771, 0"
    # The fp32 reference in this process and the server under test: 44 GB, all ours.
    ours = state.gpu_state({1234, 1240}, smi=_smi(line, "GPU-5f2a, 1234, 28800\nGPU-5f2a, 1240, 15523\n"))
    assert ours[0]["mem_used_mib"] == 44323 and ours[0]["mem_own_mib"] == 44323 and ours[0]["mem_others_mib"] == 0
    # A tenant's process is others'.
    shared = state.gpu_state({1234}, smi=_smi(line, "GPU-5f2a, 1234, 28800\nGPU-5f2a, 999, 15523\n"))
    assert shared[0]["mem_others_mib"] == 15523
    # The H200's resume: before, our 44 GB read as others' and forced a sentinel.
    idle = state.gpu_state({4321}, smi=_smi("GPU-5f2a, 1980, 1980, 35, 0, 143771, 0", ""))
    policy = TrustPolicy()
    assert state_change({"gpus": idle}, {"gpus": ours}, policy) is None
    assert state_change({"gpus": idle}, {"gpus": shared}, policy) is None  # 15.5 of 143.7 GB: under the 25% line
    tenant = state.gpu_state({4321}, smi=_smi("GPU-5f2a, 1980, 1980, 35, 60000, 143771, 0", "GPU-5f2a, 777, 60000\n"))
    assert state_change({"gpus": tenant}, {"gpus": ours}, policy) == "GPU 0 memory used by others moved 0 -> 60000 MiB"
    # A state recorded without the split (an older run) cannot tell ours from others': not compared.
    old = [{"mem_used_mib": 44323.0, "mem_total_mib": 143771.0, "sm_clock_max_mhz": 1980.0}]
    assert state_change({"gpus": idle}, {"gpus": old}, policy) is None


def test_defect3_snapshot_counts_this_process_and_its_children_as_ours(monkeypatch):
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert {os.getpid(), child.pid} <= state.own_tree()
        line = "GPU-5f2a, 1980, 1980, 41, 44323, 143771, 0"
        apps = f"GPU-5f2a, {os.getpid()}, 28800\nGPU-5f2a, {child.pid}, 523\nGPU-5f2a, 1, 1000\n"
        monkeypatch.setattr(state, "nvidia_smi", _smi(line, apps))
        gpu = state.snapshot()["gpus"][0]
        assert gpu["mem_own_mib"] == 29323 and gpu["mem_others_mib"] == 44323 - 29323
    finally:
        child.kill()
        child.wait()


# --- 4. resume messages ---------------------------------------------------------------------------

def test_defect4_an_interrupted_paired_round_is_not_said_to_be_re_run(tmp_path):
    store, run_id = _store(tmp_path)
    _trial(store, run_id, 0, "baseline", tpot=30.0)
    _trial(store, run_id, 1, "search", tpot=10.0)
    pair = _trial(store, run_id, 5, "paired", status="running")
    _controller(store, run_id)._redo_unfinished()
    said = [e.message for e in store.events(run_id, kind="resume")]
    assert store.get_trial(pair.id).status == "invalid"
    assert len(said) == 1 and "re-running" not in said[0] and "#5" in said[0] and "not re-run" in said[0], said


def test_defect4_the_bar_of_a_resumed_run_keeps_its_total_and_what_is_done(tmp_path):
    store, run_id = _store(tmp_path)
    for n, who in enumerate(("baseline", "search", "search", "sentinel", "search", "search", "search")):
        _trial(store, run_id, n, who, tpot=30.0)
    _trial(store, run_id, 7, "paired", status="invalid")
    _trial(store, run_id, 8, "search", status="running")  # interrupted: counts when its re-run ends
    assert resume_progress(store, run_id) == resume_progress(store, None) == (20, 6)
    total, done = resume_progress(store, run_id)
    task = _Progress(total, True, done).progress.tasks[0]
    assert (task.total, task.completed) == (20, 6)
    assert resume_progress(store, 99) == (None, 0)


def test_defect4_a_winner_confirmed_at_the_stop_keeps_what_its_screen_said(tmp_path, monkeypatch):
    store, run_id = _store(tmp_path)
    _trial(store, run_id, 0, "baseline", tpot=[30.0, 30.3])
    t1 = _trial(store, run_id, 1, "search", tpot=12.0, gates=[("performance", "fail")])
    c = _controller(store, run_id)
    c._record_why(t1, "kept", 1.4, None, c._baseline(), screen_met=False)  # what _settle recorded
    outcome = PairedOutcome(trial=1, rounds=3, score=2.4, lo=2.2, hi=2.6, confidence=0.9, met=True, why="met",
                            pair_trials=[[2, 3], [4, 5], [6, 7]])
    monkeypatch.setattr("orchestrator.loop.controller.run_paired", lambda *a, **kw: outcome)
    c._confirm_paired(store.get_trial(t1.id), Candidate({"n": 1}))
    sentence = why_of(store, run_id, t1.id)
    assert "performance fail" in sentence and "paired A/B: 2.40x" in sentence
    assert "may meet the goal" not in sentence, sentence  # the screen said no; the pairs said yes
    assert why_record(store, run_id, t1.id)["screen_met"] is False
    # A trial whose screen did say so keeps saying it after its pairs.
    t2 = _trial(store, run_id, 2, "search", tpot=10.0, gates=[("performance", "pass")])
    c._record_why(t2, "kept", 3.0, None, c._baseline(), screen_met=True)
    c._confirm_paired(store.get_trial(t2.id), Candidate({"n": 2}))
    assert "may meet the goal" in why_of(store, run_id, t2.id)
