"""A run with every trial status, built through the store API (no server, no torch, fast).

Numbers are chosen so each decision is known in advance: the baseline's two TPOT repeats (10.0,
10.4 ms) put the noise at 3.9%, above min_gain 3%, so the keep line is best x 1.039.
"""

from __future__ import annotations

import json
from pathlib import Path

from fake_target import write_fake_target

from orchestrator.bench.metrics import compute_metrics
from orchestrator.bench.results import ScenarioResult
from orchestrator.bench.scenarios import builtin_scenarios
from orchestrator.bench.timeline import RequestRecord
from orchestrator.config.goal import parse_goal
from orchestrator.store import Store
from orchestrator.targets import load_target

GOAL = "beat the baseline by 40% on TPOT within 12 trials"
# number, status, proposer, tpot knob, score, tpot ms, ttft ms, throughput tok/s, error
ROWS = [
    (0, "kept", "baseline", 8.0, 1.0, 10.2, 20.0, 100.0, None),
    (1, "failed", "search", 6.0, None, None, None, None,
     "ServerCrashed: server exited before it became healthy; last log lines:\nCUDA out of memory"),
    (2, "kept", "search", 6.0, 1.25, 8.16, 22.0, 125.0, None),
    (3, "discarded", "search", 7.9, 1.27, 8.03, 19.0, 127.0, None),
    (4, "invalid", "search", 4.0, None, None, None, None, "integrity gate: no_cache: repeated prompts answered 40x faster"),
    (5, "invalid", "search", 4.0, None, None, None, None, "accuracy gate: accuracy below hard limit: kl_mean=3.1 > 0.5"),
    (6, "needs_approval", "agent", 4.0, 1.9, 5.37, 30.0, 190.0, None),
    (7, "kept", "search", 4.0, 2.0, 5.1, 18.0, 200.0, None),
    (8, "kept", "confirm", 4.0, 1.98, 5.15, 18.5, 198.0, None),
    (9, "needs_approval", "agent", 4.0, 1.6, 6.4, 25.0, 160.0, None),
]


def _bench_file(path: Path, tpot_ms: float, ttft_ms: float) -> None:
    """A real ScenarioResult JSON, as a trial writes it, from synthetic request timings."""
    sc = builtin_scenarios(0.5)["decode"]
    reqs, t = [], 0
    for i in range(4):
        first = t + int(ttft_ms * 1e6)
        chunks = [first + int(k * tpot_ms * 1e6) for k in range(sc.output_tokens)]
        reqs.append(RequestRecord(index=i, prompt_tokens=sc.prompt_tokens, output_tokens=sc.output_tokens,
                                  t_scheduled_ns=t, t_sent_ns=t, t_first_chunk_ns=first, t_first_token_ns=first,
                                  t_last_token_ns=chunks[-1], t_done_ns=chunks[-1], chunk_ns=chunks,
                                  usage_prompt_tokens=sc.prompt_tokens, usage_completion_tokens=sc.output_tokens,
                                  client_chunks=len(chunks), done_seen=True, success=True))
        t = chunks[-1] + 1000
    metrics = compute_metrics(reqs, bench_start_ns=0, bench_end_ns=t)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ScenarioResult(scenario=sc, metrics=metrics, requests=reqs).to_json())


def build_run(store: Store, tmp_path: Path, *, with_files: bool = True) -> int:
    """Record the ROWS run; bench files under `tmp_path/runs/ID` when `with_files`."""
    goal = parse_goal(GOAL)
    target = load_target(write_fake_target(tmp_path / "fake.toml", choices=(8.0, 6.0, 4.0, 7.9)))
    run = store.create_run("audit demo", goal.text, goal.model_dump(mode="json"), goal.digest,
                           target.model_dump(mode="json"), {"min_gain": 0.03}, "local", "search")
    run_dir = tmp_path / "runs" / str(run.id)
    for n, status, proposer, knob, score, tpot, ttft, thr, error in ROWS:
        rationale = "confirm by a clean relaunch: #7" if proposer == "confirm" else f"proposal {n}"
        t = store.create_trial(run.id, n, commit="c0ffee", knobs={"tpot_ms": knob}, rationale=rationale, proposer=proposer)
        store.start_trial(t.id, f"python fakeserver.py --tpot-ms {knob}", None)
        if n == 4:
            store.add_gate_result(t.id, "integrity", "fail", "no_cache: repeated prompts answered 40x faster", {
                "checks": [{"name": "diff", "status": "pass", "detail": "skipped: no diff"},
                           {"name": "no_cache", "status": "fail", "detail": "repeated prompts answered 40x faster"}]}, 2.0)
        if n == 5:
            store.add_gate_result(t.id, "integrity", "pass", "all probes passed", {"checks": []}, 2.0)
            store.add_gate_result(t.id, "accuracy", "fail", "accuracy below hard limit: kl_mean=3.1 > 0.5",
                                  {"metrics": {"kl_mean": 3.1, "ppl_log_ratio": 0.9}}, 3.0)
        if n in (6, 9):
            store.add_gate_result(t.id, "accuracy", "drift", "measurable drift (needs approval): kl_mean=0.08 > 0.05",
                                  {"metrics": {"kl_mean": 0.08}}, 3.0)
        if tpot is not None:
            reps = (10.0, 10.4) if n == 0 else (tpot,)
            for rep, v in enumerate(reps):
                store.add_measurements(t.id, "decode", {"tpot_ms_p50": v, "ttft_ms_p50": ttft, "output_throughput": thr,
                                                        "completed": 4.0, "failed": 0.0}, repeat=rep)
                if with_files:
                    _bench_file(run_dir / f"trial-{n}" / f"bench-decode-{rep}.json", v, ttft)
        if n > 0 and score is not None:
            met = n in (7, 8)
            store.add_gate_result(t.id, "performance", "pass" if met else "fail",
                                  "all targets met, no guard regressed" if met else
                                  f"target decode:tpot_ms_p50: improvement {1 - tpot / 10.2:+.3f} (±2·0.020) misses 0.400",
                                  {"k_sigma": 2.0, "metrics": [{"metric": "decode:tpot_ms_p50", "role": "target",
                                                                "baseline_mean": 10.2, "candidate_mean": tpot,
                                                                "delta": 1 - tpot / 10.2, "se": 0.02, "required": 0.4,
                                                                "verdict": "pass" if met else "fail"}]}, 0.01)
        timings = {"propose": 0.1, "deploy": 3.0, "gates": 1.0 if n else 0.0, "bench": 6.0, "teardown": 0.5, "record": 0.02}
        timings["total"] = sum(timings.values())
        objective = {"decode:tpot_ms_p50": tpot} if tpot is not None else {}
        store.finish_trial(t.id, status, score=score, objective=objective, error=error, timings=timings)
        if n == 6:
            store.add_event(run.id, "agent.usage", "agent proposal", trial_id=t.id,
                            data={"input_tokens": 1200, "output_tokens": 300, "cost_usd": 0.0081})
    trials = {t.number: t for t in store.list_trials(run.id)}
    store.set_best_trial(run.id, trials[7].id)
    store.add_event(run.id, "session", "session ended", data={"wall_s": 120.0})
    store.add_event(run.id, "stop", "GoalMet: #7 meets every objective, confirmed by a clean relaunch (#8)")
    store.add_event(run.id, "kb.write_back", "finding written", data={"path": str(tmp_path / "kb" / "finding-fake-1.md")})
    (tmp_path / "kb").mkdir(exist_ok=True)
    (tmp_path / "kb" / "finding-fake-1.md").write_text(
        "---\nid: finding-fake-1\nkind: finding\ntitle: 'fake on cpu: knobs giving 2.00x'\nstatus: probable\n---\n\nRun 1.\n")
    store.set_run_status(run.id, "finished", "GoalMet: #7 meets every objective, confirmed by a clean relaunch (#8)")
    json.dumps(ROWS)  # the table is plain data
    return run.id


def add_measurements(store: Store, run_id: int, *, judged_after_sentinel: bool = True) -> None:
    """Add to the ROWS run what the loop adds around trials: a sentinel (#10) and a paired A/B round
    of #7 (#11 baseline half, #12 candidate half), with the controller's `trial.why` records.

    The sentinel was judged with no noise (nothing before it); #9, judged after it, was given its
    77.3% noise. #7's record holds its screening score (2.0x against baseline #0) and the paired
    ratio 2.01x; the paired event carries per-objective ratios for the report's objective table.
    `judged_after_sentinel=False` leaves #9's record out: then no candidate was judged against #10."""
    trials = {t.number: t for t in store.list_trials(run_id)}
    rows = [(10, "sentinel", "sentinel after #9", (10.0, 17.7)),
            (11, "paired", "paired A/B of #7, round 1: baseline", (10.1,)),
            (12, "paired", "paired A/B of #7, round 1: candidate", (5.0,))]
    for n, role, rationale, tpots in rows:
        t = store.create_trial(run_id, n, commit="c0ffee", knobs={"tpot_ms": 4.0 if n == 12 else 8.0}, rationale=rationale,
                               proposer=role)
        store.start_trial(t.id, "python fakeserver.py", None)
        for rep, v in enumerate(tpots):
            store.add_measurements(t.id, "decode", {"tpot_ms_p50": v, "ttft_ms_p50": 20.0, "output_throughput": 1000 / v,
                                                    "completed": 4.0, "failed": 0.0}, repeat=rep)
        store.finish_trial(t.id, "kept", score=None, objective={"decode:tpot_ms_p50": sum(tpots) / len(tpots)},
                           timings={"bench": 6.0, "total": 8.0})
        if n == 10:
            store.add_event(run_id, "trial.why", "#10 kept: a baseline measurement (sentinel)", trial_id=t.id,
                            data={"noise": 0.0, "noise_basis": "", "baseline_trial": None, "score": None,
                                  "sentence": "#10 kept: a baseline measurement (sentinel); candidates after it are judged against it"})
    paired = {"score": 2.01, "lo": 1.93, "hi": 2.09, "confidence": 0.9, "rounds": 1, "met": True, "pair_trials": [[11, 12]],
              "objectives": {"decode:tpot_ms_p50": {"ratio": 2.01, "lo": 1.93, "hi": 2.09, "verdict": "pass"}}}
    store.add_event(run_id, "paired", "#7: 2.01x [1.93, 2.09]", trial_id=trials[7].id, data=paired)
    store.add_event(run_id, "trial.why", "#7 kept", trial_id=trials[7].id,
                    data={"score": 2.0, "best": 1.25, "threshold": 1.299, "needed_gain": 0.0392156862745098, "noise": 0.0392156862745098,
                          "min_gain": 0.03, "noise_basis": "", "baseline_trial": 0, "screen_met": True, "gates": {"performance": "pass"},
                          "paired": paired, "sentence": "#7 kept: score 2.000x against baseline #0 cleared 1.299x (best 1.250x + "
                          "3.9%, set by baseline noise 3.9%); gates: performance pass; paired A/B: 2.01x [1.93, 2.09] "
                          "(90%, 1 paired rounds), goal met"})
    if not judged_after_sentinel:
        return
    store.add_event(run_id, "trial.why", "#9 needs_approval", trial_id=trials[9].id,
                    data={"score": 1.6, "noise": 0.773, "noise_basis": "", "baseline_trial": 10, "sentence": "#9 needs_approval"})
