"""Paired A/B confirmation: the only number a claim rests on.

A candidate that looked good in the search is re-measured against the baseline in rounds, each
on fresh servers, alternating A (baseline) and B (candidate). The machine's slow drift (another
tenant, a thermal throttle) hits both halves of a pair alike and cancels in the ratio; a round
whose two halves saw clearly different host states is redone. The goal is met when the
bootstrap interval of the paired speedups clears it (`gates.performance.paired_check`).

Both halves are also held to the host state of the reference baseline (`host_ref`): a pair whose
halves agree with each other but ran beside a tenant the baseline never saw measures the speedup
under *that* tenant (on 2 cores, an OpenMP server beside one other runnable task slows 2-20x,
erratically). Such a half is redone; before a redone round the host gets `trust.settle_s` to calm
down; when it never does, the confirmation says the host is too busy to measure, and claims nothing.

Both halves of a round ask the same prompts, a draw no earlier launch, trial or round asked
(`Scenario.prompt_seed`); the next round (a redone one too) draws another: a server that keeps what
it answered across launches has nothing to replay.

Each half is a trial row (proposer `paired`) with its own measurements and host state, so the
evidence is auditable; the outcome is a `paired` event on the candidate's trial. A confirmation that
was interrupted (a kill, a command's wall limit) continues where it stopped: its whole rounds, both
halves measured, count again when the same candidate is confirmed (`measured_rounds`), and only the
rounds still needed run; a round cut in half is not used. A confirmation cut before its first whole
round starts again (`interrupted` finds it either way).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field, replace
from statistics import median
from typing import Any

from gates.performance import bootstrap_interval, pair_speedups, paired_check
from gates.thresholds import section
from orchestrator.bench.prompts import fresh_seed
from orchestrator.core.candidate import Candidate
from orchestrator.core.roles import PAIRED
from orchestrator.hosts.measure import idle_state, slowdown
from orchestrator.trial.context import TrialContext, objective_label
from orchestrator.trial.run import run_trial

__all__ = ["PairedOutcome", "beat_baseline", "describe", "interrupted", "latest_paired", "measured_rounds", "run_paired"]


@dataclass(frozen=True)
class PairedOutcome:
    """The paired verdict on one candidate trial."""

    trial: int
    """Number of the candidate trial that was confirmed."""
    rounds: int
    score: float
    """Geometric mean over pairs of each pair's geomean speedup across the goal's objectives."""
    lo: float
    hi: float
    confidence: float
    met: bool
    why: str
    objectives: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Objective label -> ratio, lo, hi, required, pairs, verdict, why."""
    pair_trials: list[list[int]] = field(default_factory=list)
    """[baseline trial number, candidate trial number] per used round."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe(p: dict[str, Any] | PairedOutcome, *, short: bool = False) -> str:
    """`2.31x [2.10, 2.52] (90%, 3 paired rounds)`; `short`: `2.31x [2.10, 2.52]`."""
    d = p.to_dict() if isinstance(p, PairedOutcome) else p
    if not d.get("score"):
        return "not confirmed" if short else f"not confirmed ({d.get('why', '')[:160]})"
    if short:
        return f"{d['score']:.2f}x [{d['lo']:.2f}, {d['hi']:.2f}]"
    return f"{d['score']:.2f}x [{d['lo']:.2f}, {d['hi']:.2f}] ({d['confidence']:.0%}, {d['rounds']} paired rounds)"


def beat_baseline(p: dict[str, Any] | PairedOutcome | None) -> bool:
    """Whether a paired outcome shows the candidate faster than the baseline: the low end of its
    interval above 1.0. An interval that holds 1.0 (`1.11x [0.79, 1.49]`) is within the noise, and
    no screening score alone (no paired rounds) shows it either: only such a candidate is a "best
    candidate" in the reports and a knob set "giving" a speedup in the knowledge base."""
    d = p.to_dict() if isinstance(p, PairedOutcome) else p
    return bool(d and d.get("score") and d.get("lo") is not None and float(d["lo"]) > 1.0)


def latest_paired(store: Any, run_id: int, trial_id: int | None = None) -> dict[str, Any] | None:
    """The newest paired outcome of the run (of one candidate trial, when `trial_id` is given)."""
    found = store.events(run_id, kind=PAIRED, trial_id=trial_id)
    return dict(found[-1].data) if found else None


_ROUND = re.compile(r"^paired A/B of #(\d+), round \d+: (baseline|candidate)$")


def _rationale(n: int, rnd: int, role: str) -> str:
    return f"paired A/B of #{n}, round {rnd}: {role}"  # `_ROUND` reads it back


def _whole_rounds(store: Any, run_id: int) -> dict[int, list[tuple[Any, Any]]]:
    """Candidate trial number -> (baseline row, candidate row) of each whole round no paired outcome of the run
    used (a `paired` event's `pair_trials`): both halves measured (`kept`), one right after the other."""
    used = {num for e in store.events(run_id, kind=PAIRED) for pair in (e.data or {}).get("pair_trials") or () for num in pair}
    rows = sorted((t for t in store.list_trials(run_id) if t.proposer == PAIRED and t.status == "kept" and t.number not in used),
                  key=lambda t: t.number)
    out: dict[int, list[tuple[Any, Any]]] = {}
    for a, b in zip(rows, rows[1:], strict=False):
        ma, mb = _ROUND.match(a.rationale or ""), _ROUND.match(b.rationale or "")
        if (ma and mb and b.number == a.number + 1 and ma.group(1) == mb.group(1)
                and (ma.group(2), mb.group(2)) == ("baseline", "candidate")):
            out.setdefault(int(ma.group(1)), []).append((a, b))
    return out


def measured_rounds(store: Any, run_id: int, trial_number: int, labels: Any = ()) -> list[tuple[Any, Any]]:
    """(baseline row, candidate row) of each whole round of an interrupted confirmation of trial `trial_number`
    (`_whole_rounds`). A round redone, abandoned or cut in half is `invalid` and never counts; `labels`: the
    objectives both halves must have measured."""
    return [(a, b) for a, b in _whole_rounds(store, run_id).get(trial_number, [])
            if all(k in (a.objective or {}) and k in (b.objective or {}) for k in labels)]


def interrupted(store: Any, run_id: int) -> int | None:
    """The number of the trial whose paired confirmation an interruption cut short: it has paired rows (whole
    rounds or only a half, measured or cut) and no paired outcome, since a trial is confirmed once. The one with
    the newest row; None when there is none. Its whole rounds (`measured_rounds`) count when it continues."""
    trials = store.list_trials(run_id)
    judged = {e.trial_id for e in store.events(run_id, kind=PAIRED)}
    ids = {t.number: t.id for t in trials}
    newest: dict[int, int] = {}
    for t in trials:
        if t.proposer == PAIRED and (m := _ROUND.match(t.rationale or "")) and ids.get(int(m.group(1))) not in judged:
            newest[int(m.group(1))] = max(newest.get(int(m.group(1)), -1), t.number)
    return max(newest, key=newest.__getitem__, default=None)


def run_paired(ctx: TrialContext, candidate_trial: Any, candidate: Candidate, baseline_knobs: dict[str, Any],
               create: Any, *, thresholds: dict[str, Any] | None = None, on_trial: Any = lambda t: None,
               host_ref: dict[str, Any] | None = None) -> PairedOutcome:
    """Measure A B A B ... on fresh servers and judge the goal on the paired ratios.

    `create(Candidate) -> trial row` makes the store rows (the controller numbers them);
    `on_trial(record)` is told of each finished row, like every other trial of the run;
    `host_ref`: the host's state during the reference baseline (None: halves judged only against each other).
    The whole rounds an interrupted confirmation of this candidate measured (`measured_rounds`) count as its
    first rounds (the candidate's gates ran in the first of them)."""
    cfg = section(thresholds, "performance")
    first, most = int(cfg.get("paired_rounds", 3)), int(cfg.get("paired_max_rounds", 5))
    rounds = _Rounds(ctx, candidate_trial, candidate, baseline_knobs, create, on_trial, host_ref, max_redo=ctx.trust.max_redo * first)
    rounds.resume(most)
    measure = rounds.count < first  # resumed with enough whole rounds: they are judged before another is measured
    while True:
        if measure:
            got = rounds.measure()
            if isinstance(got, PairedOutcome):
                return got
            if not got or rounds.count < first:
                continue
        measure = True
        if rounds.drop_outlier():
            continue
        out = _judge(ctx, candidate_trial.number, rounds.base_vals, rounds.cand_vals, rounds.pair_trials,
                     can_add=rounds.count < most, thresholds=thresholds)
        if out is not None:
            return out


class _Rounds:
    """A confirmation's whole rounds (each objective's baseline and candidate values, the trial numbers of each
    round) and its redo budget, shared by rounds redone for the host and rounds dropped as outliers."""

    def __init__(self, ctx: TrialContext, candidate_trial: Any, candidate: Candidate, baseline_knobs: dict[str, Any],
                 create: Any, on_trial: Any, host_ref: dict[str, Any] | None, *, max_redo: int) -> None:
        self.ctx, self.trial, self.candidate, self.baseline_knobs = ctx, candidate_trial, candidate, baseline_knobs
        self.create, self.on_trial, self.host_ref, self.max_redo = create, on_trial, host_ref, max_redo
        self.n, self.store = candidate_trial.number, ctx.store
        self.base_vals: dict[str, list[float]] = {}
        self.cand_vals: dict[str, list[float]] = {}
        self.pair_trials: list[list[int]] = []
        self.redo = 0
        self.redone: list[float] = []  # log ratios of the rounds redone as outliers
        # The round after a settle wait the host stayed busy through measures each half once: an attempt
        # redone at once mostly meets the same tenant (`TrustPolicy.settle_s`), and an untrusted half
        # brings the round back to wait for the host again before the next try.
        self.next_ctx = ctx

    @property
    def count(self) -> int:
        return len(self.pair_trials)

    def _add(self, a_row: Any, b_row: Any, a: dict[str, float], b: dict[str, float]) -> None:
        for label in a:
            self.base_vals.setdefault(label, []).append(a[label])
            self.cand_vals.setdefault(label, []).append(b[label])
        self.pair_trials.append([a_row.number, b_row.number])

    def resume(self, most: int) -> None:
        """Count the whole rounds an interrupted confirmation of this candidate measured (`measured_rounds`)."""
        ctx = self.ctx
        labels = [objective_label(o.scenario, o.key) for o in ctx.goal.objectives]
        for a_row, b_row in measured_rounds(self.store, ctx.run_id, self.n, labels)[:most]:
            self._add(a_row, b_row, {k: float(a_row.objective[k]) for k in labels}, {k: float(b_row.objective[k]) for k in labels})
        if self.pair_trials:
            self.store.add_event(ctx.run_id, "resume", f"paired A/B of #{self.n} continues from its {self.count} whole "
                                 f"round{'s' if self.count != 1 else ''} measured before the interruption ("
                                 + ", ".join(f"#{a}/#{b}" for a, b in self.pair_trials) + ")",
                                 data={"pair_trials": self.pair_trials}, trial_id=self.trial.id)

    def measure(self) -> PairedOutcome | bool:
        """Measure one round: True when it is whole and counted, False when it is to be measured again (a half the
        host made untrusted, halves beside different loads), or the failed outcome (a half failed; the host stayed
        too busy past the redo budget)."""
        ctx, store, rnd = self.ctx, self.store, self.count
        half_ctx, self.next_ctx = self.next_ctx, ctx
        ctx.on_step(f"paired round {rnd + 1}")
        halves = []
        drawn = fresh_seed()  # one fresh set of prompts for both halves (a fair A/B); the next round gets another
        for role, knobs, commit in (("baseline", self.baseline_knobs, ctx.base_commit),
                                    ("candidate", self.candidate.knobs, self.candidate.commit)):
            c = Candidate(dict(knobs), commit=commit, rationale=_rationale(self.n, rnd + 1, role), proposer=PAIRED)
            row = self.create(c)
            res = run_trial(half_ctx, row, c, repeats=1, gates=(role == "candidate" and rnd == 0), host_ref=self.host_ref,
                            prompts=drawn)
            halves.append((row, res))
            if res.error:
                break
        bad = next(((row, res) for row, res in halves if res.error), None)
        if bad is not None:
            row, res = bad
            for other, r in halves:
                if other.id != row.id:
                    self.on_trial(store.finish_trial(other.id, "invalid", objective=_obj(r), error="round abandoned: its other half failed",
                                                     timings=_timings(r)))
            self.on_trial(store.finish_trial(row.id, res.status_hint, error=res.error, timings=_timings(res)))
            untrusted = (res.error or "").startswith("untrusted")
            if untrusted and self.redo < self.max_redo:
                self.redo += 1  # the host, not the candidate: measure the round again, once the host has calmed down
                waited, calm = _settle(ctx, self.host_ref)
                self.next_ctx = ctx if calm else replace(ctx, trust=replace(ctx.trust, max_redo=0))
                store.add_event(ctx.run_id, "measure.redo", f"round {rnd + 1} redone{waited}: {res.error}", trial_id=self.trial.id)
                return False
            busy = "the host is too busy to measure: " if untrusted else ""
            return _failed(self.n, rnd, f"{busy}round {rnd + 1} (#{row.number}): {res.error}", self.pair_trials)
        (a_row, a), (b_row, b) = halves
        ha, hb = _host(a), _host(b)
        x = slowdown(ha, hb, own_load=max(ha.get("own_load", 0.0), hb.get("own_load", 0.0))) if ha and hb else 1.0
        if max(x, 1 / x) > 1 + ctx.trust.max_slowdown and self.redo < self.max_redo:
            # One half ran beside another tenant, the other did not: this pair measures the tenant.
            why = (f"round redone: others' runnable tasks {ha['foreign_load']:.2f}/CPU during the baseline half, "
                   f"{hb['foreign_load']:.2f}/CPU during the candidate's")
            for row, res in halves:
                self.on_trial(store.finish_trial(row.id, "invalid", objective=_obj(res), error=why, timings=_timings(res)))
            store.add_event(ctx.run_id, "measure.redo", why, data={"round": rnd + 1, "hosts": [ha, hb]}, trial_id=self.trial.id)
            self.redo += 1
            return False
        for row, res in halves:
            self.on_trial(store.finish_trial(row.id, "kept", objective=_obj(res), timings=_timings(res)))
        self._add(a_row, b_row, {k: a.mean(k) for k in a.samples}, {k: b.mean(k) for k in a.samples})
        return True

    def drop_outlier(self) -> bool:
        """Drop a round far from the others (its rows invalid) so that another is measured in its place; True when
        one was dropped. An outlier that a redone round reproduces stays: the servers vary that much."""
        ctx = self.ctx
        logs = _pair_logs(ctx, self.base_vals, self.cand_vals, self.count)
        odd = _outlier(logs)
        if odd is not None and any(abs(logs[odd] - r) <= math.log(OUTLIER_FACTOR) for r in self.redone):
            # The outlier came back: a stall does not repeat itself, a server (or baseline) that varies
            # this much between launches does. Judged with it (a wider interval, more rounds if it
            # straddles the goal) instead of redone until the budget runs out (the H200 2B run of
            # 2026-12-02: rounds of 22x, 19.5x, 11.4x, 11.4x, 11.4x ... redone until the run was stopped).
            self.store.add_event(ctx.run_id, "measure.spread",
                                 f"round {odd + 1}'s ratio {math.exp(logs[odd]):.2f}x reproduces a redone round's: kept, "
                                 f"the rounds' spread is the servers'", data={"round": odd + 1}, trial_id=self.trial.id)
            return False
        if odd is None or self.redo >= self.max_redo:
            return False
        self.redone.append(logs[odd])
        # A stall in one half that the run-queue samples did not see (a page-cache miss, a burst
        # between two samples): one round far from all the others. Either direction is redone.
        why = (f"round redone: its ratio {math.exp(logs[odd]):.2f}x is far from the other rounds' median "
               f"{math.exp(median(logs[:odd] + logs[odd + 1:])):.2f}x")
        for num in self.pair_trials[odd]:
            row = self.store.get_trial_by_number(ctx.run_id, num)
            self.on_trial(self.store.finish_trial(row.id, "invalid", objective=row.objective, error=why, timings=row.timings))
        for vals in (*self.base_vals.values(), *self.cand_vals.values()):
            del vals[odd]
        del self.pair_trials[odd]
        self.store.add_event(ctx.run_id, "measure.redo", why, data={"round": odd + 1}, trial_id=self.trial.id)
        self.redo += 1
        return True


def _judge(ctx: TrialContext, n: int, base_vals: dict[str, list[float]], cand_vals: dict[str, list[float]],
           pair_trials: list[list[int]], *, can_add: bool, thresholds: dict[str, Any] | None) -> PairedOutcome | None:
    """The outcome, or None when the interval straddles the goal and another round may help."""
    objectives: dict[str, dict[str, Any]] = {}
    per_pair = _pair_logs(ctx, base_vals, cand_vals, len(pair_trials))
    for o in ctx.goal.objectives:
        label = objective_label(o.scenario, o.key)
        sp = pair_speedups(base_vals[label], cand_vals[label], higher_better=o.info.direction == "maximize")
        if o.kind == "relative":
            pc = paired_check(sp, required=o.speedup(o.target_for(1.0), 1.0), thresholds=thresholds, can_add_rounds=can_add)
            objectives[label] = {"ratio": pc.ratio, "lo": pc.lo, "hi": pc.hi, "required": pc.required, "pairs": list(pc.pairs),
                                 "verdict": pc.verdict, "why": pc.why}
        else:
            ok = all(o.met(c, b) for b, c in zip(base_vals[label], cand_vals[label], strict=True))
            objectives[label] = {"ratio": math.exp(sum(math.log(s) for s in sp) / len(sp)), "pairs": sp,
                                 "verdict": "pass" if ok else "fail", "why": f"{o.describe()} {'met' if ok else 'missed'} in every pair"}
    if any(v["verdict"] == "remeasure" for v in objectives.values()):
        return None
    scores = [math.exp(x) for x in per_pair]
    conf = float(section(thresholds, "performance").get("paired_confidence", 0.9))
    lo, hi = bootstrap_interval(scores, confidence=conf)
    score = math.exp(sum(per_pair) / len(per_pair))
    met = all(v["verdict"] == "pass" for v in objectives.values())
    why = "; ".join(f"{k}: {v['why']}" for k, v in objectives.items())
    return PairedOutcome(n, len(pair_trials), score, lo, hi, conf, met, why, objectives, pair_trials)


def _pair_logs(ctx: TrialContext, base_vals: dict[str, list[float]], cand_vals: dict[str, list[float]], n: int) -> list[float]:
    """Per pair: the log of its geomean speedup across the goal's objectives."""
    per_pair = [0.0] * n
    for o in ctx.goal.objectives:
        label = objective_label(o.scenario, o.key)
        sp = pair_speedups(base_vals[label], cand_vals[label], higher_better=o.info.direction == "maximize")
        per_pair = [acc + math.log(x) / len(ctx.goal.objectives) for acc, x in zip(per_pair, sp, strict=True)]
    return per_pair


OUTLIER_FACTOR = 1.25
"""A round whose ratio is more than this factor away from the median of the other rounds (and than 3
robust standard deviations of them) is an outlier. 25%: the spread of honest rounds on a shared
2-core host was within +-10% (docs/results.md)."""


def _outlier(logs: list[float]) -> int | None:
    """Index of the round farthest from the median of the others, when it is an outlier (3+ rounds)."""
    if len(logs) < 3:
        return None
    worst, far = None, 0.0
    for i, x in enumerate(logs):
        rest = logs[:i] + logs[i + 1:]
        med = median(rest)
        mad = sorted(abs(y - med) for y in rest)[len(rest) // 2]
        dist = abs(x - med)
        if dist > max(math.log(OUTLIER_FACTOR), 3 * 1.4826 * mad) and dist > far:
            worst, far = i, dist
    return worst


def _settle(ctx: TrialContext, ref: dict[str, Any] | None) -> tuple[str, bool]:
    """Wait (at most `trust.settle_s`) until an idle probe says the host is no busier than at `ref`.

    Returns a note for the redo event (how long it waited, and whether the host calmed down), and
    False when the host stayed busier for the whole wait (True when it calmed or could not be probed)."""
    if not ref or "foreign_load" not in ref or ctx.trust.settle_s <= 0:
        return "", True
    t0 = time.monotonic()
    while True:
        now = idle_state(ctx.host, ctx.trust.probe_s)
        if "foreign_load" not in now:
            return "", True
        x = slowdown(now, ref, own_load=ref.get("own_load", 0.0))
        if x <= 1 + ctx.trust.max_slowdown:
            return f" after {time.monotonic() - t0:.0f} s for the host to calm down", True
        if time.monotonic() - t0 >= ctx.trust.settle_s:
            return (f" though the host stayed busy for {ctx.trust.settle_s:g} s (others' runnable tasks "
                    f"{now['foreign_load']:.2f}/CPU vs {ref['foreign_load']:.2f}/CPU at the baseline)"), False


def _failed(n: int, rnd: int, why: str, pair_trials: list[list[int]]) -> PairedOutcome:
    return PairedOutcome(n, rnd, 0.0, 0.0, 0.0, 0.0, False, why, {}, pair_trials)


def _host(r: Any) -> dict[str, float]:
    """Mean run-queue loads during a half's measurements ({} when the host could not be sampled)."""
    wins = [w for w in r.host if "foreign_load" in w]
    if not wins:
        return {}
    return {k: sum(w[k] for w in wins) / len(wins) for k in ("foreign_load", "own_load")}


def _timings(r: Any) -> dict[str, float]:
    """The trial's step times, with `record` and `total` like every controller-recorded trial."""
    return dict(r.timings, record=0.0, total=r.timings.get("trial", 0.0))


def _obj(r: Any) -> dict[str, float]:
    return {label: r.mean(label) for label in r.samples}
