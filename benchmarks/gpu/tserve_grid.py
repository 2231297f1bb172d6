"""A small grid of a target's knobs beside a goal run's best, every point measured with the same bench, one table.

    python benchmarks/gpu/tserve_grid.py MODEL_DIR [--target examples/targets/transformers-serve-gpu.toml]
        [--goal benchmarks/gpu/goal_tserve.toml] [--scenarios benchmarks/gpu/scenarios.toml]
        [--grid continuous_batching=false,true --grid attn_implementation=sdpa,eager]
        [--db RUN.db] [--out grid.json] [--logs DIR] [--budget-s 200]

The points, in order: the target's defaults (what every ratio is against), the goal run's best kept trial (the
run database's, when --db is given), then each combination of the --grid values on top of the defaults. A
combination the target's constraints refuse is listed, not launched; one equal to an earlier point is measured
once. Each point is one server launched from the target (on this machine), the goal's scenarios (from the
scenarios file) run against it by the loop's own bench client, the server stopped; no gates. The score is the
goal's: the geometric mean of its objectives' speedups over the defaults point. The goal run's own score (its
database, against its own baseline) stands beside it. Points that would start past --budget-s are skipped; on
SIGTERM (a time limit) the point being measured is stopped, the rest skipped, and what was measured is written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.bench import run_scenario_sync  # noqa: E402
from orchestrator.bench.scenarios import load_scenarios_file  # noqa: E402
from orchestrator.config.goal import load_goal  # noqa: E402
from orchestrator.hosts import HostError, LocalHost  # noqa: E402
from orchestrator.targets import ConstraintViolated, TargetError, load_target  # noqa: E402

GPU = Path(__file__).resolve().parent
SHOWN = (("output_throughput", "tok/s", 1), ("tpot_ms_p50", "TPOT p50 ms", 2), ("ttft_ms_p50", "TTFT p50 ms", 1))


def parse_grid(target: Any, specs: list[str]) -> dict[str, list[Any]]:
    """`name=v1,v2` -> name -> the knob's values (typed as the knob's own choices and type)."""
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        name, _, raw = spec.partition("=")
        knob = target.knobs.get(name)
        if knob is None or not raw:
            raise TargetError(f"--grid {spec!r}: give NAME=V1,V2 with a knob of {target.name} "
                              f"({', '.join(target.knobs)})")
        values = []
        for v in raw.split(","):
            if knob.type == "bool":
                if v.lower() not in ("true", "false", "on", "off", "1", "0"):
                    raise TargetError(f"--grid {spec!r}: {v!r} is not a bool (true/false)")
                values.append(v.lower() in ("true", "on", "1"))
            elif knob.choices is not None:
                match = [c for c in knob.choices if str(c) == v]
                if not match:
                    raise TargetError(f"--grid {spec!r}: {v!r} is not one of {list(knob.choices)}")
                values.append(match[0])
            else:
                values.append(int(v) if knob.type == "int" else float(v))
        grid[name] = values
    return grid


class Stopped(Exception):
    """SIGTERM (the command's time limit): the points measured so far are written and shown."""


_SIGNALLED: list[int] = []
"""The SIGTERMs received. Between points the loop reads this; while a point is measured the handler also raises
`Stopped`, which can land inside an asyncio callback of the bench client that logs it and carries on: the point
then looks measured, so the loop reads this after it too."""
_MEASURING: list[bool] = [False]


def _stopped(signum: int, frame: Any) -> None:
    _SIGNALLED.append(signum)
    if _MEASURING[0]:
        raise Stopped


def goal_best(db: Path) -> dict[str, Any] | None:
    """The run's best kept trial beyond the baseline (knobs, score, number), or None (no run, nothing kept). Read
    from a copy: the database beside the results stays one file."""
    from orchestrator.store import Store

    if not db.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        for part in (db, db.with_name(db.name + "-wal")):  # a live database's last writes are in its WAL
            if part.exists():
                shutil.copy(part, Path(tmp) / part.name)
        return _best(Store(f"sqlite:///{Path(tmp) / db.name}"))


def _best(store: Any) -> dict[str, Any] | None:
    run = store.latest_run()
    if run is None:
        return None
    kept = [t for t in store.list_trials(run.id) if t.status == "kept" and t.number > 0 and t.score
            and t.proposer not in ("sentinel", "paired", "retry", "probe", "baseline")]
    if not kept:
        return {"run": run.name, "status": run.status, "stop_reason": run.stop_reason, "trial": None}
    best = max(kept, key=lambda t: t.score)
    return {"run": run.name, "status": run.status, "stop_reason": run.stop_reason, "trial": best.number,
            "knobs": best.knobs, "score": best.score, "objective": best.objective}


def points(target: Any, grid: dict[str, list[Any]], best: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The points in order, each {label, knobs} (validated) or {label, refused}; repeats folded into `same_as`."""
    out: list[dict[str, Any]] = [{"label": "default", "knobs": target.baseline_knobs()}]
    if best and best.get("trial") is not None:
        out.append({"label": f"goal #{best['trial']}", "knobs": best["knobs"], "goal": best})
    names = list(grid)
    for combo in itertools.product(*(grid[n] for n in names)):
        asked = dict(zip(names, combo, strict=True))
        label = " ".join(f"{n}={v}" for n, v in asked.items())
        try:
            out.append({"label": label, "knobs": target.validate_knobs(asked)})
        except ConstraintViolated as e:
            out.append({"label": label, "refused": str(e)})
    seen: dict[str, str] = {}
    for p in out:
        if "knobs" in p:
            p["knobs"] = target.validate_knobs(p["knobs"])
            key = json.dumps(p["knobs"], sort_keys=True)
            if key in seen:
                p["same_as"] = seen[key]
            else:
                seen[key] = p["label"]
    return out


def measure(host: LocalHost, target: Any, model: str, knobs: dict[str, Any], scenarios: dict[str, Any],
            log: Path, timeout_s: float) -> dict[str, Any]:
    """One launch of the target with `knobs`: seconds to ready, and each scenario's metrics."""
    port = host.free_port()
    argv = target.render(knobs, port=port, model=model, source=target.source)
    t0 = time.monotonic()
    proc = host.start(argv, env=target.launch_env(knobs), cwd=None, log_path=log)
    base = f"http://127.0.0.1:{port}"
    try:
        host.wait_healthy(base + target.health_path, target.ready_timeout_s, proc)
        ready = time.monotonic() - t0
        res = {}
        for name, sc in scenarios.items():
            r = run_scenario_sync(base, target.served_model_name, sc, tokenizer=model, api=target.api,
                                  timeout_s=timeout_s, capabilities=target.capabilities.model_dump())
            res[name] = {k: v for k, v in r.metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        return {"ready_s": round(ready, 1), "scenarios": res, "command": " ".join(argv)}
    finally:
        host.stop(proc)


def score(goal: Any, m: dict[str, Any], base: dict[str, Any]) -> float | None:
    """The goal's geometric-mean speedup of `m` over `base` (None when a metric is missing)."""
    ups = []
    for o in goal.objectives:
        v, b = m.get(o.scenario, {}).get(o.key), base.get(o.scenario, {}).get(o.key)
        if v is None or b is None:
            return None
        ups.append(o.speedup(v, b))
    return math.exp(sum(map(math.log, ups)) / len(ups)) if ups else None


def table(rows: list[dict[str, Any]], goal: Any) -> str:
    """The printed table: one line per point."""
    scen = goal.scenarios[0]
    head = ["point", "x default", *(h for _, h, _ in SHOWN), "ready s", "goal run's score", "knobs"]
    lines = []
    for p in rows:
        m = p.get("result", {}).get("scenarios", {}).get(scen, {})
        if "refused" in p:
            cells = [p["label"], "refused", "", "", "", "", "", p["refused"].split(": ", 1)[-1]]
        elif "skipped" in p or "error" in p:
            cells = [p["label"], p.get("skipped") or "failed", "", "", "", "", "", (p.get("error") or "")[:80]]
        else:
            x = p.get("score")
            g = p.get("goal")
            knobs = " ".join(f"{k}={v}" for k, v in p["knobs"].items())
            cells = [p["label"], f"{x:.2f}x" if x else "-",
                     *(f"{m[k]:.{d}f}" if k in m else "-" for k, _, d in SHOWN),
                     f"{p['result']['ready_s']:.0f}", f"{g['score']:.2f}x (#{g['trial']})" if g else "",
                     knobs + (f"  (= {p['same_as']})" if p.get("same_as") else "")]
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return "\n".join(fmt.format(*r) for r in [head, *lines])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="the model folder the servers serve")
    ap.add_argument("--target", default="examples/targets/transformers-serve-gpu.toml")
    ap.add_argument("--goal", default=str(GPU / "goal_tserve.toml"), help="its objectives: the scenarios and the score")
    ap.add_argument("--scenarios", default=str(GPU / "scenarios.toml"))
    ap.add_argument("--grid", action="append", default=[], metavar="KNOB=V1,V2",
                    help="a knob's values (repeat: the product of all)")
    ap.add_argument("--db", default="", help="the goal run's database: its best kept trial is measured too")
    ap.add_argument("--out", default="grid.json")
    ap.add_argument("--logs", default="", help="where each point's server log goes (default: beside --out)")
    ap.add_argument("--budget-s", type=float, default=0, help="no point starts past this many seconds (0: none)")
    ap.add_argument("--timeout-s", type=float, default=120, help="a request's timeout")
    a = ap.parse_args(argv)
    start = time.monotonic()
    try:
        target = load_target(ROOT / a.target if not Path(a.target).is_absolute() else a.target)
        goal = load_goal(a.goal)
        table_all = load_scenarios_file(a.scenarios)
        missing = [s for s in goal.scenarios if s not in table_all]
        if missing:
            raise TargetError(f"{a.scenarios} has no scenario {', '.join(missing)} (the goal's)")
        scenarios = {s: table_all[s] for s in goal.scenarios}
        best = goal_best(Path(a.db)) if a.db else None
        rows = points(target, parse_grid(target, a.grid), best)
    except (TargetError, ValueError, OSError) as e:
        print(f"tserve_grid: {e}", file=sys.stderr)
        return 2
    if a.db:
        print(f"goal run: {json.dumps(best) if best else 'no run in ' + a.db}", flush=True)
    out = Path(a.out)
    logs = Path(a.logs) if a.logs else out.parent / "grid_logs"
    logs.mkdir(parents=True, exist_ok=True)
    host = LocalHost(logs / "state", standby=False)
    took: list[float] = []
    by_label: dict[str, dict[str, Any]] = {}
    signal.signal(signal.SIGTERM, _stopped)
    for i, p in enumerate(rows):
        if _SIGNALLED and "knobs" in p:  # stopped: the rest skipped
            p["skipped"] = "stopped"
            continue
        if "knobs" not in p:
            print(f"{p['label']}: refused, not launched ({p['refused']})", flush=True)
            continue
        if p.get("same_as"):
            p["result"] = by_label[p["same_as"]].get("result", {})
            if not p["result"]:
                p["skipped"] = f"as {p['same_as']}"
            continue
        used = time.monotonic() - start
        if a.budget_s and used + (max(took) if took else 0) > a.budget_s:
            p["skipped"] = "no time"
            print(f"{p['label']}: skipped at {used:.0f}s (budget {a.budget_s:.0f}s)", flush=True)
            continue
        t0 = time.monotonic()
        try:
            _MEASURING[0] = True
            try:
                p["result"] = measure(host, target, a.model, p["knobs"], scenarios, logs / f"server_{i}.log", a.timeout_s)
            finally:
                _MEASURING[0] = False
            if _SIGNALLED:  # stopped inside the bench client, which went on: this point's numbers are not whole
                raise Stopped
        except (HostError, OSError) as e:
            p["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
        except Stopped:
            p.pop("result", None)
            p["skipped"] = "stopped"
            print(f"{p['label']}: stopped at the command's limit; the rest skipped", flush=True)
            continue
        took.append(time.monotonic() - t0)
        by_label[p["label"]] = p
        print(f"[{time.monotonic() - start:.0f}s] {p['label']}: "
              f"{p.get('error') or json.dumps(p['result']['scenarios'].get(goal.scenarios[0], {}).get('output_throughput'))}",
              flush=True)
    base = rows[0].get("result", {}).get("scenarios")
    for p in rows:
        if base and p.get("result", {}).get("scenarios"):
            p["score"] = score(goal, p["result"]["scenarios"], base)
    out.write_text(json.dumps({"target": target.name, "goal": goal.text if hasattr(goal, "text") else "",
                               "scenarios": {k: v.model_dump() for k, v in scenarios.items()}, "goal_run": best,
                               "points": rows, "seconds": round(time.monotonic() - start, 1)}, indent=2, default=str))
    print(table(rows, goal), flush=True)
    measured = [p for p in rows if p.get("result")]
    return 0 if base and len(measured) > 1 else 1


if __name__ == "__main__":
    sys.exit(main())
