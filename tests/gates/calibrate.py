"""Calibrate the accuracy gate: run it over many seeds on honest and damaged servers.

``PYTHONPATH=. python tests/gates/calibrate.py --seeds 20 [--only fp32,bf16] [--out report.json]``

Starts every server named (default: the honest variants of ``HONEST`` plus the damaged/cheating
ones of ``gate_servers.GEN_SPECS``), runs :func:`gates.accuracy.check` once per seed on each, and
prints one row per server: how many runs passed / drifted / failed and the worst value of every
metric. False rejections of an honest variant are the ``fail`` (and ``drift``) counts of its row;
``tests/gates/README.md`` records a run of this script. Not a test: 20 seeds x 7 servers takes
minutes, so CI runs a few seeds in ``test_gates_generation.py`` instead. ``--rejudge OUT.json``
judges a recorded run again with the thresholds of today (and ``--margin M`` another off-top
margin), without servers.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gate_servers import HONEST, start_fleet, stop_fleet  # noqa: E402

from gates import accuracy, load_thresholds  # noqa: E402
from gates.generation import summarize_generation  # noqa: E402


def rejudge(run: dict, margin: float | None, cfg: dict) -> tuple[str, str, dict]:
    """Judge a recorded run again with ``cfg`` (and another off-top ``margin``, from the gaps)."""
    metrics = {k: v for k, v in run.items() if isinstance(v, float)}
    records = run.get("records")
    if records and margin is not None:
        for r in records:
            r["offtop"] = sum(g > margin for g in r["gaps"])
        metrics.update(summarize_generation(records, int(cfg["generation"]["new_tokens"])))
    if "gen_offtop_rate" not in metrics:  # failed before scoring (counts, errors): keep the verdict
        return run["status"], run["reason"], metrics
    status, reason = accuracy.judge(metrics, cfg)
    return status, reason, metrics


def table(runs: dict[str, list[dict]], margin: float | None = None) -> None:
    cfg = load_thresholds()["accuracy"]
    print("\n| server | runs | pass | drift | fail | offtop rate min-max | worst prompt offtop | nll excess | worst prompt"
          " nll excess | prefix short | mean s/run |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        judged = [rejudge(r, margin, cfg) for r in rs]

        def worst(key: str, judged: list = judged, pick: Any = max) -> float:
            return pick((m.get(key, float("nan")) for _, _, m in judged), default=float("nan"))
        counts = {s: sum(j[0] == s for j in judged) for s in ("pass", "drift", "fail")}
        print(f"| {name} | {len(rs)} | {counts['pass']} | {counts['drift']} | {counts['fail']} | "
              f"{worst('gen_offtop_rate', pick=min):.4f}-{worst('gen_offtop_rate'):.4f} | {worst('gen_offtop_worst'):.3f} | {worst('gen_nll_excess'):.4f} | "
              f"{worst('gen_nll_excess_worst'):.3f} | {worst('gen_prefix_short'):.3f} | "
              f"{sum(r['seconds'] for r in rs) / max(len(rs), 1):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--only", default=",".join(HONEST), help="comma-separated server names")
    ap.add_argument("--out", default=None, help="write every run's metrics here as JSON (after every seed)")
    ap.add_argument("--model", default=None, help="model folder (default: the forge's tiny model)")
    ap.add_argument("--rejudge", default=None, help="no servers: judge a recorded --out JSON with today's thresholds")
    ap.add_argument("--margin", type=float, default=None, help="with --rejudge: recompute off-top at this margin")
    args = ap.parse_args()
    if args.rejudge:
        table(json.loads(Path(args.rejudge).read_text()), args.margin)
        return
    # SIGTERM (a timeout) must still run the finally below that stops every server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.model:
        model_dir = Path(args.model).resolve()
    else:
        from orchestrator.models import forge

        model_dir = Path(forge.default_model())
    names = args.only.split(",")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        fleet = start_fleet(names, model_dir, Path(tmp))
        try:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for name in names:
                    s = fleet[name]
                    t0 = time.perf_counter()
                    r = accuracy.check(s.url, served_model=s.name, reference_model_dir=model_dir, seed=seed,
                                       chat=True)
                    runs[name].append({"seed": seed, "status": r.status, "reason": r.reason,
                                       "seconds": time.perf_counter() - t0, "records": r.details.get("generation"),
                                       **r.details.get("metrics", {})})
                    print(f"seed {seed} {name}: {r.status} ({time.perf_counter() - t0:.1f}s) {r.reason[:110]}",
                          flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(runs, indent=1))
        finally:
            stop_fleet(fleet)
    table(runs)


if __name__ == "__main__":
    main()
