"""A trial is judged against its own baseline: accuracy drift against the baseline's own figures (an
honest bf16 baseline is not flagged), and noise that is never zero (from the sentinels, or assumed and said).

The accuracy figures are those an H200 measured for a bf16 7B model against its float32 reference."""

from types import SimpleNamespace

import pytest
from seeded_run import TPOT, add_trial, controller_on, seeded_store

from gates.accuracy import judge
from gates.result import GateResult
from gates.thresholds import load_thresholds
from orchestrator.trial.gating import accuracy_reference, run_gates
from orchestrator.trial.verdict import ASSUMED_NOISE, baseline_noise, why_data

CFG = load_thresholds()["accuracy"]
# The honest bf16 7B baseline on the H200 (2026-12-01), against its float32 reference.
BF16 = {"mean_abs_dlogprob": 0.0193, "kl_mean": 0.000109, "containment_fail_rate": 0.0, "greedy_mismatch_rate": 0.03,
        "ppl_log_ratio": 0.001, "gen_offtop_rate": 0.0, "gen_offtop_worst": 0.0, "ppl_served": 10.01, "ppl_reference": 10.0}
# Three times further from the reference, still under every hard limit.
WORSE = {**BF16, "mean_abs_dlogprob": 3 * 0.0193 * 0.8, "kl_mean": 3 * 0.000109}




def test_drift_is_judged_against_the_baselines_own_not_an_absolute_limit():
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


def test_the_baseline_noise_is_the_worst_of_its_own_gate_runs():
    sentinel = {**BF16, "mean_abs_dlogprob": 0.028}  # the same knobs on another window draw
    cand = {**BF16, "mean_abs_dlogprob": 0.04}
    assert judge(cand, CFG, baseline=[BF16])[0] == "drift"
    assert judge(cand, CFG, baseline=[BF16, sentinel])[0] == "pass"


def test_a_trial_is_gated_against_the_recorded_baseline_figures(tmp_path):
    store, run_id = seeded_store(tmp_path)
    t0 = add_trial(store, run_id, 0, "baseline", tpot=30.0, accuracy=BF16)
    s = add_trial(store, run_id, 1, "sentinel", tpot=28.0, accuracy={**BF16, "kl_mean": 0.00012})
    add_trial(store, run_id, 2, "search", status="failed", accuracy={**BF16, "mean_abs_dlogprob": 0.049})  # not a baseline
    cand = add_trial(store, run_id, 3, "search", status="running")
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
    assert run_gates(ctx, Site(BF16), cand, None, "http://x", 1, None) == (None, False, None)  # no drift: no approval
    assert run_gates(ctx, Site(BF16), t0, None, "http://x", 1, None)[1] is False  # the baseline never drifts from itself
    assert run_gates(ctx, Site(WORSE), cand, None, "http://x", 1, None)[1] is True  # clearly worse: needs approval
    assert run_gates(ctx, Site({**BF16, "kl_mean": 0.004}), cand, None, "http://x", 1, None)[0].startswith("accuracy gate:")


def test_noise_of_a_baseline_measured_once_comes_from_its_sentinels_or_is_assumed_and_said():
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


def test_the_controller_never_judges_with_zero_noise(tmp_path):
    store, run_id = seeded_store(tmp_path)
    add_trial(store, run_id, 0, "baseline", tpot=31.96)
    c = controller_on(store, run_id)
    b = c._baseline()
    assert (b.noise, b.noise_basis) == (ASSUMED_NOISE, "assumed")
    for n, v in ((1, 26.33), (2, 23.50), (3, 27.20)):
        add_trial(store, run_id, n, "sentinel", tpot=v)
    add_trial(store, run_id, 4, "sentinel", status="invalid", tpot=90.0)  # an untrusted re-measure is no baseline
    b = c._baseline()
    assert b.trial == 3 and b.values[TPOT] == 27.20
    assert b.noise == pytest.approx(0.3105, abs=1e-3) and b.noise_basis == "across 4 baseline measurements"
