"""Time to best from one run database: GPU-seconds of the loop until it found and confirmed the best.

    python benchmarks/gpu/time_to_best.py RUN_DB [--best-known benchmarks/gpu/best_known.json]
        [--run-id N] [--kind cold|warm] [--headline benchmarks/gpu/results/headline.json]

The clock runs from the run's start (`infergoal goal`; the model forge happens before
it and is not counted) and only while a session of the run was live: a run resumed on a fresh
machine adds its sessions' seconds (`run.start` / `resume` events up to each `session` event), never
the time the machine was away. Measured to:

(a) the first kept search trial within 5% of the best known setting (`--best-known`), decided when
    the trial was (its first `trial.why`). The best known setting is the file's entry for the run's
    card (the GPU named in the run's `run.start` fingerprint) and model preset (the target's
    `forge:PRESET`); with no such entry, (a) is not reached, says why in one line, and the run's own
    best is reported. An entry that holds the setting's measured values of the goal's objectives
    (`objectives`, keyed as the loop records them: `decode:tpot_ms_p50`, ...) is judged on the trial's
    own measured values: the geometric mean over the objectives of the trial's value against the
    entry's (inverted where lower is better) must be at least 0.95. A ratio to the run's own baseline
    is not used there: on one card the naive baseline moved 24.8-37.7 ms TPOT between runs, and one
    setting scored 9.6-14.0x against it. Without those values, the trial's *screening* score (a paired
    confirmation later overwrites the trial's score) against the entry's screening score for the
    goal's metrics, else the geometric mean of its paired per-metric ratios over them;
(b) the first paired outcome that met the goal (the `paired` event; `GoalMet` follows it).

Also the median trial time and the per-trial deploy / gates / bench / other / idle split (the
report's own `trial_timeline`; a baseline, sentinel or paired row reads `measured`, as the CLI
shows it), and the baseline's re-measures (sentinels): their GPU-seconds and share of the run's.
Only with `--headline PATH` is that headline.json updated (not replaced): `time_to_best_<kind>_s`
(the value is (a), (b) beside it) and `median_trial_s`, each naming the database; a figure not
reached is null with a `why`. `--kind` defaults to warm when the run started from the knowledge
base (a `kb.warm_start` or `kb.priors` event), else cold. The database is read from a copy.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sqlite3
import statistics
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

from orchestrator.config.goal.spec import Objective  # noqa: E402
from orchestrator.core.roles import NOT_SEARCH, SENTINEL  # noqa: E402
from orchestrator.report.svg import trial_timeline  # noqa: E402
from orchestrator.review.trials import shown_status  # noqa: E402
from orchestrator.trial.context import objective_label  # noqa: E402
from orchestrator.trial.goalbars import ratios  # noqa: E402

__all__ = ["analyse", "closeness", "entry_for", "gpu_seconds", "main", "sessions", "target_score", "update_headline"]

WITHIN = 0.05  # "within 5% of the best known setting"


@dataclass(frozen=True)
class _Trial:
    """The fields `trial_timeline` reads, from a database row."""

    id: int
    number: int
    status: str
    proposer: str
    score: float | None
    knobs: dict[str, Any]
    timings: dict[str, float] | None
    started_at: datetime | None
    finished_at: datetime | None
    objective: dict[str, float] | None = None


def _ts(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _read(db: Path, queries: dict[str, tuple[str, tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """Rows of each query, read from a copy of the database: opening a WAL database, even read-only,
    leaves -wal / -shm files beside it (the results folder is committed)."""
    if not db.exists():
        raise FileNotFoundError(db)
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in ("", "-wal"):
            if Path(f"{db}{suffix}").exists():
                shutil.copyfile(f"{db}{suffix}", Path(tmp) / f"run.db{suffix}")
        con = sqlite3.connect(Path(tmp) / "run.db")
        try:
            out: dict[str, list[tuple[Any, ...]]] = {}
            for name, (sql, params) in queries.items():
                if name != "run":
                    params = (out["run"][0][0],)
                out[name] = con.execute(sql, params).fetchall()
                if name == "run" and not out[name]:
                    raise LookupError(f"no run in {db}")
            return out
        finally:
            con.close()


def sessions(events: list[tuple[datetime, str]], last_seen: datetime) -> list[tuple[datetime, datetime]]:
    """(start, end) of each live session: from `run.start` / `resume` to the next `session` event
    (a session killed without one ends at the next start, or at the run's last record)."""
    out: list[tuple[datetime, datetime]] = []
    start: datetime | None = None
    for ts, kind in sorted(events):
        if kind in ("run.start", "resume"):
            if start is not None:  # the previous invocation ended without its `session` event
                out.append((start, ts))
            start = ts
        elif kind == "session" and start is not None:
            out.append((start, ts))
            start = None
    if start is not None:
        out.append((start, max(last_seen, start)))
    return out


def gpu_seconds(spans: list[tuple[datetime, datetime]], at: datetime) -> float:
    """Seconds of live sessions from the run's start up to ``at``."""
    total = 0.0
    for a, b in spans:
        if at <= a:
            break
        total += (min(at, b) - a).total_seconds()
    return total


def _label(knobs: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(knobs.items()))


def entry_for(best: dict[str, Any], card: str | None, preset: str | None) -> tuple[dict[str, Any] | None, str]:
    """(the best known entry for ``card`` and ``preset``, a line saying which or why none). A file without
    `entries` is one setting for any card and model (an explicit --best-known of one entry)."""
    if "entries" not in best:
        return best, "the one setting of --best-known (any card, any model)"
    for e in best["entries"]:
        if card and e.get("card", "").lower() == card.lower() and e.get("preset") == preset:
            ev = e.get("evidence", {})
            where = f"{ev['db']} #{ev['trial']}" if ev.get("db") else "no run database"
            return e, f"the entry for {e['card']} / {preset} ({where})"
    cards = sorted({f"{e.get('card')} / {e.get('preset')}" for e in best["entries"]})
    return None, (f"no best known setting for {card or 'a run whose database names no GPU'} / {preset or '?'} "
                  f"(entries: {'; '.join(cards)}): the run's own best is reported instead")


def _card(events: list[tuple[datetime, str, Any, dict[str, Any]]]) -> str | None:
    """The GPU the run ran on: the first name in its first `run.start` fingerprint (nvidia-smi's name)."""
    for _, kind, _, data in events:
        gpus = (data.get("fingerprint") or {}).get("gpus") if kind == "run.start" else None
        if gpus:
            return str(gpus[0]).split(",")[0].strip()
    return None


def _preset(target_json: str | None) -> str | None:
    model = str(json.loads(target_json or "{}").get("model") or "")
    return model.removeprefix("forge:") or None


def target_score(best: dict[str, Any], metrics: list[str]) -> tuple[float | None, str]:
    """(the best known setting's screening score for a goal on ``metrics``, where it comes from)."""
    for s in best.get("screen", []):
        if sorted(s["metrics"]) == sorted(metrics):
            return float(s["score"]), s.get("basis", "measured")
    ratios = best.get("paired_ratios", {})
    if metrics and all(m in ratios for m in metrics):
        score = math.prod(float(ratios[m]) for m in metrics) ** (1 / len(metrics))
        return score, ("derived: geometric mean of the best known setting's paired ratios over "
                       + ", ".join(f"{m} {ratios[m]}x" for m in metrics) + " (no screening score measured for this goal)")
    return None, f"the best known setting has no score for the objectives {metrics}"


def closeness(measured: dict[str, float], known: dict[str, float], objectives: list[Objective]) -> float | None:
    """How close a trial's measured objective values come to the best known setting's: the loop's score of them
    with the best known as the baseline (the geometric mean of `goalbars.ratios`, each speedup > 1 where better);
    None when the trial lacks one of them."""
    labels = [objective_label(o.scenario, o.key) for o in objectives]
    if not labels or any(not measured.get(k) or not known.get(k) for k in labels):
        return None
    speedups = ratios(measured, known, objectives).values()
    return math.exp(sum(math.log(s) for s in speedups) / len(labels))


def analyse(db: Path, best: dict[str, Any], run_id: int | None = None) -> dict[str, Any]:
    """Every figure of the run, as a dict (see the module docstring)."""
    rows = _read(db, {
        "run": ("select id, name, goal_json, updated_at, target_json from runs "
                + ("where id = ?" if run_id is not None else "order by id desc limit 1"),
                (run_id,) if run_id is not None else ()),
        "trials": ("select id, number, status, proposer, score, knobs_json, timings_json, started_at, finished_at, "
                   "objective_json from trials where run_id = ? order by number", ()),
        "events": ("select ts, kind, trial_id, data_json from events where run_id = ? order by ts, id", ())})
    rid, name, goal_json, updated, target_json = rows["run"][0]
    goal = json.loads(goal_json)
    trials = [_Trial(i, n, st, pr, sc, json.loads(kj or "{}"), json.loads(tj) if tj else None, _ts(sa), _ts(fa),
                     json.loads(oj) if oj else None)
              for i, n, st, pr, sc, kj, tj, sa, fa, oj in rows["trials"]]
    events = [(_ts(ts), kind, tid, json.loads(dj) if dj else {}) for ts, kind, tid, dj in rows["events"]]
    last = max([e[0] for e in events] + [t.finished_at for t in trials if t.finished_at] + [_ts(updated)])
    spans = sessions([(ts, k) for ts, k, _, _ in events], last)
    total = sum((b - a).total_seconds() for a, b in spans)
    metrics = [o["metric"] for o in goal.get("objectives", [])]
    card, preset = _card(events), _preset(target_json)
    entry, which = entry_for(best, card, preset)
    target, basis = target_score(entry, metrics) if entry is not None else (None, which)
    objs = [Objective(**o) for o in goal.get("objectives", [])]
    labels = [objective_label(o.scenario, o.key) for o in objs]
    known = (entry or {}).get("objectives") or {}
    absolute = bool(labels) and all(k in known for k in labels)
    if absolute:
        basis = ("measured values " + ", ".join(f"{k} {known[k]:g}" for k in labels)
                 + "; each trial judged on its own measured values, not on its ratio to the run's baseline")
    by_id = {t.id: t for t in trials}
    warm = any(k in ("kb.warm_start", "kb.priors") for _, k, _, _ in events)

    # (a) the screening score of each kept search trial, when it was decided
    screened: dict[int, tuple[datetime, float]] = {}
    for ts, kind, tid, data in events:
        if kind == "trial.why" and tid in by_id and tid not in screened and data.get("score") is not None:
            screened[tid] = (ts, float(data["score"]))
    kept = sorted((ts, score, by_id[tid]) for tid, (ts, score) in screened.items()
                  if by_id[tid].status == "kept" and by_id[tid].proposer not in NOT_SEARCH
                  and by_id[tid].number > 0)
    best_seen = max(kept, key=lambda k: k[1], default=None)
    near = {t.id: closeness(t.objective or {}, known, objs) for _, _, t in kept} if absolute else {}
    closest = max(((near[t.id], t, ts) for ts, _, t in kept if near.get(t.id) is not None), key=lambda c: c[0], default=None)
    if absolute:
        hit = next((k for k in kept if (near[k[2].id] or 0.0) >= 1 - WITHIN), None)
    else:
        hit = next((k for k in kept if target is not None and k[1] >= (1 - WITHIN) * target), None)
    a: dict[str, Any] = {"value": round(gpu_seconds(spans, hit[0]), 1) if hit else None}
    if hit:
        a["trial"] = {"number": hit[2].number, "score": round(hit[1], 3), "knobs": _label(hit[2].knobs)}
        if absolute:
            a["trial"]["closeness"] = round(near[hit[2].id], 3)
    elif absolute:
        a["why"] = (f"no kept trial came within {WITHIN:.0%} of the best known setting's measured values in {total:.0f} "
                    "GPU-seconds" + (f" (closest: #{closest[1].number} at {closest[0]:.1%})" if closest else ""))
    else:
        a["why"] = (f"no kept trial reached {1 - WITHIN:.0%} of the best known screening score "
                    f"{target:.2f}x in {total:.0f} GPU-seconds" if target is not None else basis)
    # (b) the first paired outcome that met the goal
    met = next(((ts, data, tid) for ts, kind, tid, data in events if kind == "paired" and data.get("met")), None)
    b: dict[str, Any] = {"value": round(gpu_seconds(spans, met[0]), 1) if met else None}
    if met:
        b["trial"] = by_id[met[2]].number if met[2] in by_id else None
        b["paired"] = {k: met[1].get(k) for k in ("score", "lo", "hi", "rounds")}
    else:
        pairs = [d for _, k, _, d in events if k == "paired"]
        b["why"] = (f"{len(pairs)} paired confirmation(s), none met the goal" if pairs
                    else f"no paired confirmation ran in {total:.0f} GPU-seconds")

    done = [t for t in trials if t.timings and t.timings.get("trial")]
    rows = trial_timeline(done)
    for r, t in zip(rows, done, strict=True):
        r.update(proposer=t.proposer, status=shown_status(t), trial=round(float(t.timings["trial"]), 2),
                 **{k: round(float(v), 2) for k, v in r.items() if isinstance(v, float)})
    split = {s: round(statistics.median(r[s] for r in rows), 2) for s in ("deploy", "gates", "bench", "other", "idle")} if rows else {}
    median = {"value": round(statistics.median(float(t.timings["trial"]) for t in done), 2) if done else None,
              "trials": len(done), "split_median_s": split, "per_trial": rows}
    if not done:
        median["why"] = "no finished trial"
    first = min((t.started_at for t in trials if t.started_at), default=None)
    median["before_first_trial_s"] = round(gpu_seconds(spans, first), 1) if first else None  # start-up, on the clock
    sentinel_s = sum(float(t.timings["trial"]) for t in done if t.proposer == SENTINEL)
    return {"db": str(db), "run": {"id": rid, "name": name, "goal": goal.get("text", "")},
            "kind": "warm" if warm else "cold", "gpu_s_total": round(total, 1),
            "sentinels": {"trials": sum(1 for t in done if t.proposer == SENTINEL), "gpu_s": round(sentinel_s, 1),
                          "share": round(sentinel_s / total, 4) if total else None},
            "sessions": len(spans), "card": card, "preset": preset,
            "best_known": {"entry": which, "label": (entry.get("label") or _label(entry.get("knobs", {})))
                           if entry is not None else None, "evidence": (entry or {}).get("evidence"),
                           "screen_score": None if absolute else target, "basis": basis, "within": WITHIN,
                           **({"objectives": {k: known[k] for k in labels}} if absolute else {})},
            "best_reached": ({"number": best_seen[2].number, "score": round(best_seen[1], 3),
                              "at_s": round(gpu_seconds(spans, best_seen[0]), 1), "knobs": _label(best_seen[2].knobs)}
                             if best_seen else None),
            **({"closest": {"number": closest[1].number, "closeness": round(closest[0], 3),
                            "at_s": round(gpu_seconds(spans, closest[2]), 1), "knobs": _label(closest[1].knobs)}}
               if closest else {}),
            "kept": [{"number": t.number, "at_s": round(gpu_seconds(spans, ts), 1), "score": round(score, 3),
                      "closeness": None if near.get(t.id) is None else round(near[t.id], 4)} for ts, score, t in kept],
            "kept_within_5pct": a, "paired_goal_met": b, "median_trial": median}


def update_headline(out: Path, res: dict[str, Any], kind: str, db_label: str) -> dict[str, Any]:
    """Write `time_to_best_<kind>_s` and `median_trial_s` into ``out`` (other fields kept)."""
    head = json.loads(out.read_text()) if out.exists() else {}
    a, b = res["kept_within_5pct"], res["paired_goal_met"]
    entry: dict[str, Any] = {"value": a["value"], "paired_goal_met_s": b["value"], "gpu_s_total": res["gpu_s_total"],
                             "best_known": res["best_known"], "best_reached": res["best_reached"],
                             "source": db_label, "run": res["run"]["name"], "goal": res["run"]["goal"],
                             **({"closest": res["closest"]} if res.get("closest") else {})}
    whys = [w for w in (a.get("why"), b.get("why") and f"paired: {b['why']}") if w]
    if whys:
        entry["why"] = "; ".join(whys)
    if "trial" in a:
        entry["trial"] = a["trial"]
    if "paired" in b:
        entry["paired"] = b["paired"]
    head[f"time_to_best_{kind}_s"] = entry
    m = res["median_trial"]
    head["median_trial_s"] = {"value": m["value"], "trials": m["trials"], "split_median_s": m["split_median_s"],
                              "before_first_trial_s": m["before_first_trial_s"],
                              "per_trial": [{k: r[k] for k in ("number", "proposer", "status", "trial", "deploy", "gates",
                                                               "bench", "other", "idle")} for r in m["per_trial"]],
                              "source": db_label, **({"why": m["why"]} if "why" in m else {})}
    out.write_text(json.dumps(head, indent=1) + "\n")
    return head


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("--best-known", type=Path, default=Path(__file__).with_name("best_known.json"))
    ap.add_argument("--run-id", type=int, default=None)
    ap.add_argument("--kind", choices=("cold", "warm"), default=None, help="default: warm when the run started from the KB")
    ap.add_argument("--headline", type=Path, default=None, metavar="PATH",
                    help="also write time_to_best_<kind>_s and median_trial_s into this headline.json "
                         "(e.g. benchmarks/gpu/results/headline.json); default: print only")
    args = ap.parse_args(argv)
    try:
        res = analyse(args.db, json.loads(args.best_known.read_text()), args.run_id)
    except (LookupError, FileNotFoundError) as e:  # a workspace whose run never started
        print(f"time_to_best: {e}", file=sys.stderr)
        return 1
    kind = args.kind or res["kind"]
    a, b, m = res["kept_within_5pct"], res["paired_goal_met"], res["median_trial"]
    bk = res["best_known"]
    print(f"run {res['run']['name']} ({kind}, {res['sessions']} session(s), {res['gpu_s_total']:.0f} GPU-s) "
          f"on {res['card'] or 'an unnamed GPU'}, model {res['preset'] or '?'}")
    if bk.get("objectives"):
        print(f"  best known: {bk['entry']}: {bk['basis']}")
    elif bk["screen_score"] is not None:
        print(f"  best known: {bk['screen_score']:.2f}x, {bk['entry']}: {bk['basis']}")
    else:
        print(f"  best known: none: {bk['basis']}")
    def shown(v: float | None) -> str:
        return f"{v} s" if v is not None else "not reached"

    print(f"  (a) kept within 5%: {shown(a['value'])}"
          + (f" (#{a['trial']['number']} {a['trial']['score']}x" + (f", {a['trial']['closeness']:.1%} of the best known"
                                                                     if "closeness" in a["trial"] else "") + ")"
             if "trial" in a else f": {a.get('why')}"))
    print(f"  (b) paired GoalMet: {shown(b['value'])}" + ("" if b["value"] else f": {b['why']}"))
    if res["best_reached"]:
        br = res["best_reached"]
        print(f"  best reached: #{br['number']} {br['score']}x at {br['at_s']} s ({br['knobs']})")
    if res.get("closest"):
        c = res["closest"]
        print(f"  closest to the best known: #{c['number']} at {c['closeness']:.1%} of its measured values, {c['at_s']} s")
    sn = res["sentinels"]
    print(f"  sentinels: {sn['trials']} baseline re-measure(s), {sn['gpu_s']} GPU-s"
          + (f", {sn['share']:.1%} of the run" if sn["share"] is not None else ""))
    print(f"  median trial {m['value']} s over {m['trials']}; median split {m['split_median_s']}; "
          f"{m['before_first_trial_s']} s from the run's start to its first trial")
    for r in m["per_trial"]:
        print(f"   #{r['number']:<3} {r['proposer']:<9} {r['status']:<10} trial {r['trial']:6.1f}  deploy {r['deploy']:5.1f}"
              f"  gates {r['gates']:5.1f}  bench {r['bench']:5.1f}  other {r['other']:5.1f}  idle {r['idle']:5.1f}")
    if args.headline:
        update_headline(args.headline, res, kind, _rel(args.db))
        print(f"wrote time_to_best_{kind}_s, median_trial_s -> {args.headline}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
