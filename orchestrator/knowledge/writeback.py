"""Turn a distilled run into entries: the winner, knob effects, constraints; move prior statuses.

Each function writes one markdown file (or updates it) and returns its path. Evidence always names
the run, the trial numbers and the measured numbers.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from orchestrator.knowledge.distill import Distilled, importance_method
from orchestrator.knowledge.entries import Entry, demote, parse_entry, promote, render

__all__ = ["digest", "update_prior", "write_constraints", "write_effects", "write_winner"]


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(list(parts), sort_keys=True, default=str).encode()).hexdigest()[:10]


def _today() -> str:
    return dt.date.today().isoformat()


def _has_run(meta: dict[str, Any], run_id: int) -> bool:
    return any(isinstance(ev, dict) and ev.get("run") == run_id for ev in meta.get("evidence", []))


def _others(items: list[Any], run_id: int) -> list[Any]:
    """`items` (evidence, avoid, failures) less this run's: a run written again (stopped, then
    resumed to its end) replaces what it wrote before instead of adding to it."""
    return [x for x in items if not (isinstance(x, dict) and x.get("run") == run_id)]


def _write(path: Path, meta: dict[str, Any], body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(meta, body))
    return path


def write_winner(write_dir: Path, d: Distilled, applies_to: dict[str, Any], key: list[Any], evidence_extra: dict[str, Any]) -> Path | None:
    """The best kept knob set (same id scheme as before: engine, model, hardware, knobs[, workload])."""
    w = d.winner
    if w is None:
        return None
    engine, hw = applies_to["engine"], applies_to["hardware"]
    fid = f"finding-{engine}-{digest(*key[:3], w['knobs'], *key[3:])}"
    path = write_dir / "findings" / f"{fid}.md"
    evidence = {"run": d.run_id, "trial": w["trial"], "score": w["score"], "objective": w["objective"],
                "confirmed_by_relaunch": w["confirmed_by_relaunch"], **evidence_extra}
    unconfirmed = "unconfirmed" in evidence  # the run was stopped before its paired rounds confirmed it
    old = parse_entry(path) if path.is_file() else None
    mine = [ev for ev in (old.meta.get("evidence") or []) if isinstance(ev, dict) and ev.get("run") == d.run_id] if old else []
    others = _others(old.meta.get("evidence") or [], d.run_id) if old else []
    # An entry only this run wrote before (it was stopped, then resumed to its end) is written anew.
    if old is not None and (others or not mine):
        e = old
        meta = dict(e.meta)
        # Another run's entry is promoted by this run's win; an unconfirmed win (the run was stopped)
        # does not move it, and promotes it once confirmed when the resumed run writes again.
        if not unconfirmed and (not mine or any("unconfirmed" in ev for ev in mine)):
            meta["status"] = promote(meta.get("status", "hypothesis"))
        meta["evidence"] = [*others, evidence]
        # This run's earlier number is replaced (a screening score, then its paired ratio), others' stay.
        before = [float(ev["score"]) for ev in others if isinstance(ev, dict) and ev.get("score")] if mine else [float(meta.get("speedup", 0))]
        meta["speedup"] = max([w["score"], *before])
        meta["observations"] = _merge_observations(meta.get("observations") or [], d.observations)
        body = e.body
        if d.probes and meta.get("knobs") == w["knobs"]:
            meta["probes"] = _merge_observations(meta.get("probes") or [], [{**p, "run": d.run_id} for p in d.probes])
            body = body.split(_PROBES_HEAD)[0].rstrip("\n") + "\n" + _probe_text(meta["probes"], w["score"])
        meta["updated"] = _today()
        return _write(path, meta, body)
    meta = {
        "id": fid, "kind": "finding",
        "title": f"{engine} on {hw}: knobs giving {w['score']:.2f}x on '{d.goal}'",
        "applies_to": applies_to,
        "status": "probable" if w["confirmed_by_relaunch"] else "hypothesis",
        "knobs": w["knobs"], "speedup": w["score"], "evidence": [evidence], "created": _today(), "updated": _today(),
        "observations": _merge_observations([], d.observations),
    }
    if d.probes:
        meta["probes"] = _merge_observations([], [{**p, "run": d.run_id} for p in d.probes])
    knob_lines = "\n".join(f"- `{k}` = `{v}`" for k, v in w["knobs"].items())
    stopped = f" The run was stopped before this was confirmed ({evidence['unconfirmed']})." if unconfirmed else ""
    body = (f"\nRun {d.run_id}, trial #{w['trial']} scored {w['score']:.3f}x (geomean speedup over the "
            f"baseline) for the goal `{d.goal}` on model `{applies_to.get('model')}`.{stopped}\n\nKnobs:\n{knob_lines}\n\n"
            "Warm-starts later runs: on this exact setting first, on similar ones (another model size, "
            "a similar host) as a prior weighted by similarity. Each run that reproduces it raises its status; "
            "a similar run where it loses to the baseline lowers it.\n")
    if d.probes:
        body += _probe_text(meta["probes"], w["score"])
    return _write(path, meta, body)


_PROBES_HEAD = "\nOne knob at a time, measured after the run stopped"


def _probe_text(probes: list[dict[str, Any]], winner_score: float) -> str:
    """The probes as the finding's text: each knob's measured change against the winner, largest first."""
    rows = "\n".join(f"- `{p['knob']}` = `{p['value']}` (run {p.get('run', '?')}, trial #{p['trial']}): {p['score']:.3f}x, "
                     f"{(p['score'] / winner_score - 1) if winner_score else 0.0:+.0%} against the winner"
                     for p in sorted(probes, key=lambda p: -abs(p["score"] - winner_score)))
    return (f"{_PROBES_HEAD} (probes; 0.000x: failed), largest change first. A knob that moved the winner "
            f"little did not matter here:\n{rows}\n")


MAX_OBSERVATIONS = 60


def _merge_observations(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Knob set -> its latest score, best first, at most MAX_OBSERVATIONS (a later run's search
    model starts from them, see `reuse.prior_observations`)."""
    by_key = {json.dumps(o["knobs"], sort_keys=True, default=str): o for o in [*old, *new]}
    return sorted(by_key.values(), key=lambda o: -float(o["score"]))[:MAX_OBSERVATIONS]


def write_effects(write_dir: Path, d: Distilled, applies_to: dict[str, Any], key: list[Any]) -> Path | None:
    """Which knob moved which metric in this run (fANOVA importance + measured median changes).

    One entry per setting; a later run that finds the same most important knob raises its status,
    one that finds another lowers it."""
    if not d.effects or not any(e["importance"] for e in d.effects):
        return None  # too few trials for the knobs they varied (`distill.enough_for_importance`): no ranking, no top knob
    engine = applies_to["engine"]
    fid = f"finding-{engine}-knob-effects-{digest(*key)}"
    path = write_dir / "findings" / f"{fid}.md"
    top = d.effects[0]["knob"]
    evidence = {"run": d.run_id, "top_knob": top, "importance": importance_method(),
                "effects": [{"knob": e["knob"], "importance": e["importance"], "values": e["values"],
                             "baseline_value": e["baseline_value"]} for e in d.effects]}
    lines = []
    for e in d.effects:
        imp = ", ".join(f"{m} {v:.2f}" for m, v in e["importance"].items()) or "not enough trials"
        lines.append(f"- `{e['knob']}` (importance: {imp}; baseline {e['baseline_value']})")
        for value, row in e["values"].items():
            changes = ", ".join(f"{k.replace(' change', '')} {v:+.0%}" for k, v in row.items() if k.endswith("change"))
            lines.append(f"  - {value}: trials {row['trials']}, median score {row['median_score']:.2f}x" + (f"; {changes}" if changes else ""))
    body = (f"\nRun {d.run_id} (`{d.goal}`): what each knob did, most important first ({importance_method()} over "
            f"the run's scored trials; changes are medians relative to the baseline trial).\n\n" + "\n".join(lines) + "\n")
    if path.is_file():
        old = parse_entry(path)
        meta = dict(old.meta)
        if not _has_run(meta, d.run_id):
            agree = meta.get("top_knob") == top
            meta["status"] = promote(meta["status"]) if agree else demote(meta["status"])
        meta["evidence"] = [*_others(meta.get("evidence", []), d.run_id), evidence]
        meta["top_knob"] = top
        meta["updated"] = _today()
        return _write(path, meta, body)
    meta = {"id": fid, "kind": "finding", "title": f"{engine} on {applies_to['hardware']}: which knob moves which metric",
            "applies_to": applies_to, "status": "hypothesis", "top_knob": top, "evidence": [evidence],
            "created": _today(), "updated": _today()}
    return _write(path, meta, body)


def write_constraints(write_dir: Path, d: Distilled, applies_to: dict[str, Any], key: list[Any]) -> Path | None:
    """Failures (start-up, gate rejection, OOM) and dead ends, as knob values to avoid on this setting."""
    if not d.failures and not d.dead_ends:
        return None
    engine = applies_to["engine"]
    cid = f"constraint-{engine}-avoid-{digest(*key)}"
    path = write_dir / "constraints" / f"{cid}.md"
    meta: dict[str, Any]
    if path.is_file():
        meta = dict(parse_entry(path).meta)
    else:
        meta = {"id": cid, "kind": "constraint", "title": f"{engine} on {applies_to['hardware']}: what failed or never paid off",
                "applies_to": applies_to, "status": "hypothesis", "avoid": [], "failures": [], "evidence": [],
                "created": _today()}
    fresh = not _has_run(meta, d.run_id)
    # This run's items replace what it wrote before (a stopped run, resumed to its end), others' stay.
    meta["evidence"] = [*_others(meta.get("evidence", []), d.run_id),
                        {"run": d.run_id, "failures": len(d.failures), "dead_ends": len(d.dead_ends)}]
    meta["failures"] = _others(meta.get("failures", []), d.run_id)
    meta["avoid"] = _others(meta.get("avoid", []), d.run_id)
    for f in d.failures:
        meta["failures"] = [*meta.get("failures", []), {"run": d.run_id, **f}]
        # Only a failure that changed a single knob from the baseline pins the blame on it.
        if len(f["changed"]) == 1:
            (k, v), = f["changed"].items()
            meta["avoid"] = [*meta["avoid"], {"knob": k, "value": v, "why": f"{f['kind']}: {f['reason'][:120]}",
                                              "run": d.run_id, "trials": [f["trial"]]}]
    for de in d.dead_ends:
        meta["avoid"] = [*meta["avoid"], {"knob": de["knob"], "value": de["value"], "run": d.run_id, "trials": de["trials"],
                                          "why": f"never beat the baseline (best {de['best_score']:.2f}x)"}]
    if fresh and len(meta["evidence"]) > 1:
        meta["status"] = promote(meta["status"])
    meta["updated"] = _today()
    lines = [f"- avoid `{a['knob']}` = `{a['value']}`: {a['why']} (run {a['run']}, trials {a['trials']})" for a in meta["avoid"]]
    lines += [f"- run {f['run']} trial #{f['trial']} {f['status']} ({f['kind']}): {f['reason'][:160]}" for f in meta.get("failures", [])]
    body = "\nFailures and directions that never paid off on this setting; warm starts skip them on similar settings.\n\n" + "\n".join(lines) + "\n"
    return _write(path, meta, body)


def update_prior(e: Entry, run_id: int, trial: dict[str, Any], sim: float, model: str, min_gain: float = 0.0) -> str:
    """A transferred finding was tried here: a win confirms it (status up), a loss contradicts it (down).

    Returns the new status. Evidence records the other model, the similarity and the score."""
    meta = dict(e.meta)
    if _has_run(meta, run_id):
        return e.status
    won = trial["status"] == "kept" and (trial.get("score") or 0.0) > 1.0 + min_gain
    lost = trial["status"] in ("failed", "invalid", "rejected") or (trial.get("score") is not None and trial["score"] <= 1.0)
    if not (won or lost):
        return e.status  # neither: an improvement too small to count either way
    meta["status"] = promote(e.status) if won else demote(e.status)
    meta["evidence"] = [*meta.get("evidence", []), {"run": run_id, "trial": trial["trial"], "score": trial.get("score"),
                                                    "on_model": model, "similarity": sim,
                                                    "result": "confirmed" if won else "contradicted"}]
    meta["updated"] = _today()
    _write(e.path, meta, e.body)
    return meta["status"]
