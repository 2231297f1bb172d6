"""`infergoal export RUN`: the run as CSV and JSON, plus vLLM- and AIPerf-shaped files per trial.

The store gives the tables (trials, gate results, measurements, events); the bench's own result
files, which each trial writes under the run folder (`trial-N/bench-SCENARIO-REPEAT.json`), are
turned into the public tools' formats with the bench's exporters, so a user can load a trial
into their own vLLM or AIPerf tooling.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

__all__ = ["export_run"]


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _write_csv(path: Path, rows: list[dict[str, Any]], fields: list[str]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v, default=str) if isinstance(v, (dict, list)) else v for k, v in r.items()})
    return path


def _bench_exports(run_dir: Path | None, number: int, out: Path) -> list[str]:
    """Re-export trial `number`'s bench results; names of the files written."""
    from orchestrator.bench.results import ScenarioResult, write_exports

    src = run_dir / f"trial-{number}" if run_dir else None
    if src is None or not src.is_dir():
        return []
    written = []
    for f in sorted(src.glob("bench-*.json")):
        repeat = f.stem.rsplit("-", 1)[-1]
        try:
            res = ScenarioResult.from_json(f.read_text())
        except (ValueError, KeyError, TypeError):
            continue  # a file cut short by a kill: the store still has its numbers
        dest = out / f"trial-{number}" / f"repeat-{repeat}"
        written += [str(p.relative_to(out)) for p in write_exports(res, dest).values()]
    return written


def export_run(store: Any, run_id: int, out_dir: str | Path, *, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Write `run.json`, `trials.csv`, `measurements.csv`, `gates.csv`, `events.csv` and per-trial
    bench exports into `out_dir`. Returns a manifest (also written as `manifest.json`)."""
    from orchestrator.review.why import explain_trial

    run = store.get_run(run_id)
    if run is None:
        raise LookupError(f"no run with id {run_id}; list them with `infergoal status`")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rd = Path(run_dir) if run_dir else None
    trials = store.list_trials(run_id)
    labels = sorted({k for t in trials for k in (t.objective or {})})
    trial_rows, meas_rows, gate_rows, full = [], [], [], []
    bench_files: dict[int, list[str]] = {}
    for t in trials:
        why = explain_trial(store, run_id, t.number)
        row = {"number": t.number, "status": t.status, "score": t.score, "proposer": t.proposer, "commit": t.commit,
               "knobs": t.knobs, "changed": why.changed, "decided_by": why.decided_by, "why": why.sentence,
               "total_s": (t.timings or {}).get("total"), "error": t.error, "launch_cmd": t.launch_cmd,
               "started_at": t.started_at, "finished_at": t.finished_at,
               **{label: (t.objective or {}).get(label) for label in labels}}
        trial_rows.append(row)
        meas = store.measurements(t.id)
        gates = store.gate_results(t.id)
        meas_rows += [{"trial": t.number, "scenario": m.scenario, "repeat": m.repeat, "metric": m.metric,
                       "value": m.value} for m in meas]
        gate_rows += [{"trial": t.number, "gate": g.gate, "status": g.status, "reason": g.reason,
                       "duration_s": g.duration_s, "details": g.details} for g in gates]
        bench_files[t.number] = _bench_exports(rd, t.number, out)
        full.append({"trial": row | {"timings": t.timings, "rationale": t.rationale, "objective": t.objective},
                     "why": why.to_dict(), "gates": [g.__dict__ for g in gates],
                     "measurements": [m.__dict__ for m in meas], "exports": bench_files[t.number]})
    events = [{"ts": e.ts, "kind": e.kind, "trial_id": e.trial_id, "message": e.message, "data": e.data}
              for e in store.events(run_id)]
    (out / "run.json").write_text(json.dumps(_jsonable({"run": run.__dict__, "trials": full, "events": events}), indent=2))
    fields = ["number", "status", "score", "proposer", "commit", "changed", "knobs", *labels, "total_s",
              "decided_by", "why", "error", "launch_cmd", "started_at", "finished_at"]
    files = {
        "run.json": out / "run.json",
        "trials.csv": _write_csv(out / "trials.csv", trial_rows, fields),
        "measurements.csv": _write_csv(out / "measurements.csv", meas_rows, ["trial", "scenario", "repeat", "metric", "value"]),
        "gates.csv": _write_csv(out / "gates.csv", gate_rows, ["trial", "gate", "status", "reason", "duration_s", "details"]),
        "events.csv": _write_csv(out / "events.csv", events, ["ts", "kind", "trial_id", "message", "data"]),
    }
    manifest = {"run": run_id, "out": str(out), "files": {k: str(v) for k, v in files.items()},
                "bench_exports": {str(k): v for k, v in bench_files.items() if v}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest
