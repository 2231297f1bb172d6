"""`infergoal why N`: the first thing that decided a trial, with its evidence, from the store alone.

The controller decides in a fixed order (start-up -> gates -> bench -> keep line / goal), and
records each step's outcome as it goes; this module walks the same order over the stored
records and stops at the first one that settled the trial. When the controller recorded its
decision itself (a `trial.why` event), that record wins and the reconstruction only fills what it
lacks; the noise it judged with is read from those records, not derived again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.roles import BASELINE, BASELINES, MEASUREMENTS, NOT_SEARCH, PAIRED, REMEASURES
from orchestrator.review.actions import HUMAN_ACTIONS
from orchestrator.review.leaseloss import lease_losses, lease_words
from orchestrator.review.trials import budget_line, shown_status, split_trials

__all__ = ["Why", "baseline_noise", "explain_run", "explain_trial", "failure_class", "recorded_noise", "trial_cost"]

#: The event kind in which the controller records its own decision on a trial (`verdict.why_data`).
DECISION_EVENT = "trial.why"
#: The event kind in which the loop records a proposal the search skipped inside a failed region.
SKIP_EVENT = "search.skip"
# Error prefixes the trial writes (`ExcType: message`) -> what broke, in words.
_FAILURE_CLASSES = (
    ("ServerCrashed", "startup", "the server exited before it became healthy"),
    ("ServerTimeout", "startup", "the server did not become healthy in time"),
    ("HostError", "startup", "the host could not launch the server"),
    ("GateTampered", "gate:lock", "a gate file changed under the run (gates.lock mismatch)"),
    ("requests failed", "bench", "requests failed during the benchmark"),
    ("died during the benchmark", "bench", "the server died during the benchmark"),
)
# Usage keys agent proposers record in event data; summed into a trial's or run's cost.
_TOKEN_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
_DOLLAR_KEYS = ("cost_usd", "dollars", "usd")


@dataclass(frozen=True)
class Why:
    """Why a trial ended as it did.

    Attributes:
        decided_by: what settled it: `baseline`, `startup`, `bench`, `gate:integrity`,
            `gate:accuracy`, `gate:audit` (the bench audit), `gate:lock`, `threshold`, `goal`, `confirm`, `approval`, `pending`,
            `interrupted`, or `recorded` (the controller's own record, with no more detail).
        sentence: one line saying it, numbers included.
        evidence: the numbers behind it (gate checks and metrics, score, best, threshold, noise...).
        changed: knobs that differ from the baseline's.
        cost: seconds per step and in total; tokens and dollars when an agent recorded them.
        actions: human actions on this trial (approve/reject) with who and when.
    """

    run_id: int
    number: int
    status: str
    decided_by: str
    sentence: str
    evidence: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    actions: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def failure_class(error: str | None) -> tuple[str, str]:
    """(decided_by, what broke) for a failed trial's stored error text."""
    for needle, kind, words in _FAILURE_CLASSES:
        if needle in (error or ""):
            return kind, words
    return "bench", "the trial raised an error"


def recorded_noise(events: list[Any], *, trial_id: int | None = None, baseline_trial: int | None = None) -> float | None:
    """The baseline noise the controller judged with, as its `trial.why` events recorded it: the
    noise trial `trial_id` was judged with (the newest record: a trial re-judged after a paired A/B
    has two), or the noise of baseline #`baseline_trial`, as given to the candidates judged against
    it. None when it recorded none (a database from before these records)."""
    records = [e for e in events if e.kind == DECISION_EVENT and isinstance(e.data, dict) and "noise" in e.data]
    if trial_id is not None:
        mine = [e.data for e in records if e.trial_id == trial_id]
        return float(mine[-1]["noise"]) if mine else None
    judged = [e.data for e in records if e.data.get("baseline_trial") == baseline_trial]
    return float(judged[0]["noise"]) if judged else None


def baseline_noise(store: Any, run: Any, number: int = 0) -> tuple[float, dict[str, list[float]]]:
    """A baseline trial's repeated samples over the goal's objectives, and their largest relative spread.

    Only for a database without the controller's `trial.why` records (`recorded_noise` is the
    noise the controller used); with them, only the samples are shown.
    """
    from orchestrator.config.goal import GoalSpec
    from orchestrator.trial.context import objective_label

    t0 = store.get_trial_by_number(run.id, number)
    if t0 is None:
        return 0.0, {}
    goal = GoalSpec(**run.goal)
    samples: dict[str, list[float]] = {}
    for m in store.measurements(t0.id):
        for o in goal.objectives:
            if m.scenario == o.scenario and m.metric == o.key:
                samples.setdefault(objective_label(o.scenario, o.key), []).append(m.value)
    spreads = [(max(v) - min(v)) / (sum(v) / len(v)) for v in samples.values() if len(v) > 1 and sum(v)]
    return max(spreads, default=0.0), samples


def _sum_usage(events: list[Any]) -> dict[str, float]:
    tokens = dollars = 0.0
    for e in events:
        data = e.data if isinstance(e.data, dict) else {}
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else data
        tokens += sum(float(usage.get(k) or 0) for k in _TOKEN_KEYS)
        tokens += float(usage.get("tokens") or 0)
        dollars += sum(float(usage.get(k) or 0) for k in _DOLLAR_KEYS)
    return {"tokens": tokens, "dollars": dollars}


def _for_trial(e: Any, trial: Any) -> bool:
    # An agent records a proposal's usage before the trial exists: `for_trial` names its number.
    data = e.data if isinstance(e.data, dict) else {}
    return e.trial_id == trial.id or (e.trial_id is None and data.get("for_trial") == trial.number)


def trial_cost(store: Any, trial: Any, events: list[Any] | None = None) -> dict[str, Any]:
    """Seconds per step (and total) plus any tokens/dollars recorded against the trial."""
    events = store.events(trial.run_id) if events is None else events
    usage = _sum_usage([e for e in events if _for_trial(e, trial) and e.kind != DECISION_EVENT])
    timings = dict(trial.timings or {})
    return {"seconds": timings.get("total", sum(v for k, v in timings.items() if k != "trial")),
            "steps": timings, **usage}


def _decision_record(trial: Any, events: list[Any]) -> dict[str, Any]:
    """The controller's own record of its decision, if this version of it wrote one."""
    for e in reversed(events):  # the newest: a trial re-judged after a paired A/B has two
        if e.trial_id == trial.id and e.kind == DECISION_EVENT and isinstance(e.data, dict):
            return dict(e.data)
    return {}


def _paired(trial: Any, events: list[Any]) -> dict[str, Any] | None:
    """The newest paired A/B outcome on this trial (score, lo, hi, confidence, rounds, met), if any."""
    found = [e.data for e in events if e.trial_id == trial.id and e.kind == PAIRED and isinstance(e.data, dict)]
    return found[-1] if found else None


def _gate_evidence(g: Any) -> dict[str, Any]:
    d = g.details if isinstance(g.details, dict) else {}
    ev: dict[str, Any] = {"gate": g.gate, "status": g.status, "reason": g.reason}
    if g.gate == "integrity":
        ev["checks"] = [{k: c.get(k) for k in ("name", "status", "detail")} for c in d.get("checks", [])]
    elif g.gate in ("accuracy", "audit"):
        ev["metrics"] = d.get("metrics", {})
        if g.gate == "audit":  # which measured requests left the reference, and by how much
            ev["requests"] = [r for r in d.get("requests", []) if r.get("offtop")]
    elif g.gate == "speed_of_light":  # each checked metric against its floor, and the margin (noise + slack)
        ev.update({k: d.get(k) for k in ("checked", "margin", "noise", "slack")})
    elif g.gate == "performance":
        ev["metrics"] = [{k: m.get(k) for k in ("metric", "role", "baseline_mean", "candidate_mean", "delta", "se",
                                                 "required", "verdict")} for m in d.get("metrics", [])]
        for k in ("k_sigma", "interval", "ci_low", "ci_high", "paired"):
            if k in d:
                ev[k] = d[k]
    return ev


def _keep_line(store: Any, run: Any, trial: Any, trials: list[Any], events: list[Any]) -> dict[str, Any]:
    """Rebuild the keep line the controller drew for this trial: best so far x (1 + max(min_gain, noise)),
    with the noise the controller recorded for it."""
    earlier = [t for t in trials if t.number < trial.number and t.status == "kept" and t.score and t.proposer not in NOT_SEARCH]
    best = max(earlier, key=lambda t: t.score, default=None)
    best_score = max(best.score if best else 1.0, 1.0)
    noise = recorded_noise(events, trial_id=trial.id)
    if noise is None:  # a database from before the controller recorded its verdicts
        noise, _ = baseline_noise(store, run)
    min_gain = float((run.config or {}).get("min_gain", 0.03))
    needed = max(min_gain, noise)
    return {"best": best_score, "best_trial": best.number if best else 0, "min_gain": min_gain, "noise": noise,
            "needed_gain": needed, "threshold": best_score * (1 + needed)}


def _prompt_draws(events: list[Any], trial: Any) -> str:
    """`decode #0 draw 123; throughput #0 draw 456`: the prompt draw (`Scenario.prompt_seed`) each of the
    trial's measurements asked, from its `measure.host` events ('' for a trial measured before they were kept)."""
    said = []
    for e in events:
        d = e.data if isinstance(e.data, dict) else {}
        p = d.get("prompts") if e.kind == "measure.host" and e.trial_id == trial.id else None
        if isinstance(p, dict) and p.get("prompt_seed") is not None:
            redone = f" (redone from {', '.join(map(str, p['redone_with']))})" if p.get("redone_with") else ""
            said.append(f"{d.get('scenario')} #{d.get('repeat')} draw {p['prompt_seed']}{redone}")
    return "; ".join(said)


def _while_measured(loss: dict[str, Any], trial: Any) -> bool:
    """Whether the host lease was lost (and not yet taken again) while `trial` ran."""
    if trial.started_at is None or (trial.finished_at is not None and loss["at"] > trial.finished_at):
        return False
    return loss["retaken_at"] is None or loss["retaken_at"] >= trial.started_at


def explain_trial(store: Any, run_id: int, number: int) -> Why:
    """Explain trial `number` of run `run_id`. Raises LookupError when there is no such trial."""
    run = store.get_run(run_id)
    trial = store.get_trial_by_number(run_id, number) if run else None
    if run is None or trial is None:
        raise LookupError(f"run {run_id} has no trial #{number}; list them with `infergoal trials`")
    trials = store.list_trials(run_id)
    events = store.events(run_id)
    gates = store.gate_results(trial.id)
    base = next((t for t in trials if t.number == 0), None)
    changed = {k: v for k, v in trial.knobs.items() if base is None or base.knobs.get(k) != v}
    actions = [{"kind": e.kind, "who": (e.data or {}).get("who", "?") if isinstance(e.data, dict) else "?",
                "ts": e.ts, "message": e.message} for e in events if e.trial_id == trial.id and e.kind in HUMAN_ACTIONS]
    approved = any(a["kind"] == "approve" for a in actions)
    decided_by, sentence, evidence = _decide(store, run, trial, trials, gates, approved, events)
    recorded = _decision_record(trial, events)
    if recorded:
        # On keep/discard the controller's own numbers (threshold and noise at decision time, the
        # paired interval) beat a reconstruction; a rejection is better told by the gate check
        # that made it, so there the record only adds evidence.
        if decided_by in ("threshold", "goal", "recorded", BASELINE, *REMEASURES):
            sentence = str(recorded.get("sentence") or recorded.get("reason") or recorded.get("why") or sentence)
        # A baseline's own record carries the noise it was judged with (none): not the noise it sets.
        # A baseline's (or sentinel's) own record carries the noise it was judged with: not the noise it sets.
        skip = ("sentence", "reason", "why", *(("noise", "noise_basis") if trial.proposer in BASELINES or decided_by == BASELINE else ()))
        evidence = {**evidence, **{k: v for k, v in recorded.items() if k not in skip}}
        decided_by = str(recorded.get("decided_by") or decided_by)
        if isinstance(recorded.get("region"), dict) and "failed region" not in sentence:
            sentence += (f"; marked the failed region ({recorded['region'].get('describe')}): "
                         "the search does not propose it again")
    paired = _paired(trial, events)
    if paired is not None:
        evidence["paired"] = paired
    drawn = _prompt_draws(events, trial)
    if drawn:  # which prompts its measurements asked: a draw of their own each (orchestrator.bench.prompts)
        evidence["prompts"] = drawn
    ran = [e.message for e in events if e.kind == "trial.gpus" and e.trial_id == trial.id]
    if ran:  # a GPU pool's trial: which GPUs (the baseline, sentinels and paired rounds say so too)
        evidence["ran_on"] = ran[-1].split(" on ", 1)[-1]
    during = [x for x in lease_losses(events) if _while_measured(x, trial)]
    if during:  # its numbers may come from a shared host
        evidence["host_lease"] = "; ".join(lease_words(x) for x in during)
    if actions and trial.status in ("kept", "rejected") and any(a["kind"] in ("approve", "reject") for a in actions):
        a = [a for a in actions if a["kind"] in ("approve", "reject")][-1]
        decided_by = "approval"
        done = "approved" if a["kind"] == "approve" else "rejected"
        sentence = f"{done} by {a['who']} at {a['ts']:%Y-%m-%d %H:%M:%S} UTC; before that: {sentence}"
    return Why(run_id=run_id, number=number, status=shown_status(trial), decided_by=decided_by, sentence=sentence,
               evidence=evidence, changed=changed, cost=trial_cost(store, trial, events), actions=actions)


def _decide(store: Any, run: Any, trial: Any, trials: list[Any], gates: list[Any],
            approved: bool, events: list[Any]) -> tuple[str, str, dict[str, Any]]:
    n = trial.number
    if trial.status in ("pending", "running"):
        if run.status == "running":
            return "pending", f"trial #{n} is still in flight ({trial.status})", {}
        return "interrupted", f"trial #{n} was interrupted ({trial.status}); `infergoal resume` re-runs it", {}
    if trial.status == "failed":
        kind, words = failure_class(trial.error)
        lines = [x for x in (trial.error or "").splitlines() if x.strip()] or [""]
        tail = f" … {lines[-1][:200]}" if len(lines) > 1 else ""  # a crash's last log line names the cause
        return kind, f"failed: {words}: {lines[0][:300]}{tail}", {"error": trial.error}
    if trial.status == "invalid":
        bad = next((g for g in gates if g.status == "fail" and g.gate != "performance"), None)
        if bad is not None:
            return f"gate:{bad.gate}", f"invalid: the {bad.gate} gate failed: {bad.reason}", _gate_evidence(bad)
        kind, words = failure_class(trial.error)
        return kind, f"invalid: {words}: {trial.error or ''}"[:400], {"error": trial.error}
    if n == 0 or trial.proposer == BASELINE:
        derived, samples = baseline_noise(store, run, n)
        noise = recorded_noise(events, baseline_trial=n)  # what the candidates judged against it were given
        noise = derived if noise is None else noise
        return BASELINE, (f"the baseline (the target's default knobs); its {max((len(v) for v in samples.values()), default=0)} "
                            f"repeats put the run's noise at {noise:.1%}"), {"noise": noise, "samples": samples}
    perf = next((g for g in reversed(gates) if g.gate == "performance"), None)
    drift = next((g for g in gates if g.gate == "accuracy" and g.status == "drift"), None)
    ev: dict[str, Any] = {"score": trial.score}
    if perf is not None:
        ev["performance"] = _gate_evidence(perf)
    if trial.proposer in BASELINES:  # a sentinel: the noise it set is what later candidates were given
        derived, samples = baseline_noise(store, run, n)
        noise = recorded_noise(events, baseline_trial=n)
        ev.update(noise=derived if noise is None else noise, samples=samples)
        return trial.proposer, (f"{trial.status}: a {trial.proposer} measurement ({trial.rationale}); it judges others, "
                                f"not itself; the candidates after it were judged with noise {ev['noise']:.1%}"), ev
    if trial.proposer in MEASUREMENTS:
        return trial.proposer, f"{trial.status}: a {trial.proposer} measurement ({trial.rationale}); it judges others, not itself", ev
    line = _keep_line(store, run, trial, trials, events)
    ev.update(line)
    score = trial.score or 0.0
    keep_words = (f"threshold {line['threshold']:.3f}x = best {line['best']:.3f}x (#{line['best_trial']}) "
                  f"x (1 + max(min_gain {line['min_gain']:.1%}, noise {line['noise']:.1%}))")
    if drift is not None and (trial.status in ("needs_approval", "rejected") or approved):
        ev["accuracy"] = _gate_evidence(drift)
        return "gate:accuracy", (f"faster (score {score:.3f}x) but the accuracy gate measured drift under a "
                                 f"'without accuracy loss' goal: {drift.reason}; a person decides"), ev
    if trial.status == "discarded":
        return "threshold", f"discarded: score {score:.3f}x did not beat the {keep_words}", ev
    if trial.status == "kept":
        if perf is not None and perf.status == "pass":
            return "goal", f"kept: meets every objective (performance gate: {perf.reason}); score {score:.3f}x", ev
        if score <= line["threshold"] and trial.number:  # only a paired A/B that met the goal keeps it under the line
            return "goal", f"kept: its paired A/B meets the goal, though its score {score:.3f}x is under the {keep_words}", ev
        return "threshold", f"kept: score {score:.3f}x beat the {keep_words}", ev
    return "recorded", f"{trial.status}: score {score:.3f}x", ev


def explain_run(store: Any, run_id: int) -> dict[str, Any]:
    """Why the run stopped, against its budget: trials used, trial time spent, best so far."""
    from orchestrator.config.goal import GoalSpec

    run = store.get_run(run_id)
    if run is None:
        raise LookupError(f"no run with id {run_id}; list them with `infergoal status`")
    trials = store.list_trials(run_id)
    budget = GoalSpec(**run.goal).budget
    counted, measurements = split_trials(trials)
    spent = sum((t.timings or {}).get("total", 0.0) for t in trials)
    best = store.get_trial(run.best_trial_id) if run.best_trial_id else None
    events = store.events(run_id)
    usage = _sum_usage(events)
    # The failed regions as the controller recorded them on the trials that marked them, and the
    # proposals the search skipped inside them.
    regions = [e.data["region"] for e in events if e.kind == DECISION_EVENT and isinstance(e.data, dict)
               and isinstance(e.data.get("region"), dict)]
    skips = [e.data for e in events if e.kind == SKIP_EVENT and isinstance(e.data, dict)]
    return {
        "run": run_id, "status": run.status, "stop_reason": run.stop_reason,
        "budget": {"trials": budget.trials, "wall_s": budget.wall_s, "tokens": budget.tokens,
                   "stall_trials": budget.stall_trials},
        "used": {"trials": len(counted), "measurements": len(measurements), "trial_s": spent, **usage},
        "budget_line": budget_line(len(counted), budget.trials, len(measurements)),
        "best": {"number": best.number, "score": best.score} if best else None,
        "failed_regions": [{"trial": r.get("trial"), "kind": r.get("kind"), "region": r.get("describe"),
                            "skipped": sum(1 for s in skips if s.get("marked_by") == r.get("trial"))} for r in regions],
        "lease_lost": lease_losses(events),
    }
