"""benchmarks/gpu/time_to_best.py on a small run database built here through the store (no GPU, no server)."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

from orchestrator.store import Store

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"

import time_to_best  # noqa: E402

T0 = datetime(2026, 12, 2, 1, 0, 0)
GOAL = {"text": "4x on TPOT and throughput", "objectives": [
    {"kind": "relative", "metric": "tpot", "stat": "p50", "value": 0.75},
    {"kind": "relative", "metric": "throughput", "stat": "p50", "value": 3.0}]}
BEST = {"label": "engine=fast", "paired_ratios": {"tpot": 5.0, "throughput": 20.0},
        "screen": [{"metrics": ["throughput", "tpot"], "score": 10.0, "basis": "measured"}]}


def _at(s: float) -> str:
    return (T0 + timedelta(seconds=s)).isoformat(sep=" ")


def _db(tmp_path: Path, *, reach: bool) -> Path:
    """Two sessions (0-100 s, then a machine away for 1000 s, resumed at 1100 s); trials:
    #0 baseline, #1 kept 5.0x, #2 sentinel, #3 kept (9.9x screening, later paired 10.5x, met)."""
    path = tmp_path / "run.db"
    store = Store(f"sqlite:///{path}")
    run = store.create_run("r", GOAL["text"], GOAL, "h", {}, {}, "local", "search")
    events: list[tuple[int, float]] = []  # (event id, seconds from T0)
    trials: list[tuple[int, float, float]] = []  # (trial id, start, end)

    def event(kind: str, s: float, data: dict, trial_id: int | None = None) -> None:
        events.append((store.add_event(run.id, kind, kind, data=data, trial_id=trial_id).id, s))

    event("run.start", 0, {})
    last = None
    for n, proposer, status, score, start, end in (
            (0, "baseline", "kept", 1.0, 10, 40), (1, "search", "kept", 5.0, 41, 90),
            (2, "sentinel", "kept", 1.0, 1110, 1130),
            (3, "search", "kept" if reach else "discarded", 9.9 if reach else 8.0, 1131, 1150)):
        if n == 2:  # the first invocation ends; the machine is away 1000 s; the run is resumed
            event("session", 100, {"wall_s": 100})
            event("resume", 1100, {})
        t = store.create_trial(run.id, n, commit="c", knobs={"engine": f"e{n}"}, rationale="", proposer=proposer)
        store.start_trial(t.id, "cmd", None)
        store.finish_trial(t.id, status, score=score, timings={"trial": end - start, "deploy": 5.0, "gates": 6.0,
                                                              "bench": end - start - 12.0})
        trials.append((t.id, start, end))
        event("trial.why", end + 0.5, {"score": score}, t.id)
        last = t.id
    if reach:  # after the paired rounds the trial's why carries the paired score: not its screen
        event("trial.why", 1190, {"score": 10.5}, last)
        event("paired", 1200, {"met": True, "score": 10.5, "lo": 9.8, "hi": 11.0, "rounds": 3}, last)
    con = sqlite3.connect(path)
    for eid, s in events:
        con.execute("update events set ts = ? where id = ?", (_at(s), eid))
    for tid, start, end in trials:
        con.execute("update trials set started_at = ?, finished_at = ? where id = ?", (_at(start), _at(end), tid))
    con.execute("update runs set updated_at = ?", (_at(1210),))
    con.commit()
    con.close()
    return path


def test_counts_only_live_sessions_and_the_screening_score(tmp_path: Path) -> None:
    res = time_to_best.analyse(_db(tmp_path, reach=True), BEST)
    assert res["sentinels"] == {"trials": 1, "gpu_s": 20.0, "share": round(20.0 / res["gpu_s_total"], 4)}
    assert res["kind"] == "cold" and res["sessions"] == 2
    a, b = res["kept_within_5pct"], res["paired_goal_met"]
    # #3 kept at 1150.5 s of wall time = 100 s of session 1 + 50.5 s of session 2; screening 9.9 >= 9.5
    assert a["value"] == 150.5 and a["trial"]["number"] == 3 and a["trial"]["score"] == 9.9
    assert b["value"] == 200.0 and b["trial"] == 3 and b["paired"]["score"] == 10.5
    assert res["best_known"]["screen_score"] == 10.0
    m = res["median_trial"]
    assert m["trials"] == 4 and m["value"] == 25.0  # trials of 30, 49, 20, 19 s
    assert [r["number"] for r in m["per_trial"]] == [0, 1, 2, 3]
    assert m["split_median_s"]["deploy"] == 5.0 and m["before_first_trial_s"] == 10.0


def test_not_reached_is_null_with_a_why_and_the_headline_keeps_other_fields(tmp_path: Path) -> None:
    db = _db(tmp_path, reach=False)
    derived = {k: v for k, v in BEST.items() if k != "screen"}  # no measured screen: from the paired ratios
    res = time_to_best.analyse(db, derived)
    assert res["best_known"]["screen_score"] == 10.0 and res["best_known"]["basis"].startswith("derived")
    out = tmp_path / "headline.json"
    out.write_text(json.dumps({"tpot_b_ms": {"value": 4.9}}))
    assert time_to_best.main([str(db), "--best-known", str(_write(tmp_path, derived)), "--out", str(out)]) == 0
    head = json.loads(out.read_text())
    assert head["tpot_b_ms"] == {"value": 4.9}
    ttb = head["time_to_best_cold_s"]
    assert ttb["value"] is None and ttb["paired_goal_met_s"] is None
    assert "95%" in ttb["why"] and "no paired confirmation" in ttb["why"]
    assert ttb["best_reached"]["number"] == 1 and ttb["source"].endswith("run.db")
    assert ttb["gpu_s_total"] == 210.0  # 100 s + (1210 - 1100) s
    assert head["median_trial_s"]["value"] == 25.0


def _write(tmp_path: Path, best: dict) -> Path:
    p = tmp_path / "best.json"
    p.write_text(json.dumps(best))
    return p
