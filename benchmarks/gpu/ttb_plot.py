"""The time-to-best picture of GPU runs: each run's best kept trial so far against the best known setting.

    python benchmarks/gpu/ttb_plot.py RUN_DB... [--best-known benchmarks/gpu/best_known.json] --out PLOT.svg

One line per run database: x the run's GPU-seconds (`time_to_best.py`'s clock), y the closeness of the best kept
search trial so far to the best known setting of the run's card and model (`time_to_best.py`'s rule: the geometric
mean of its measured values against the entry's; 100% is the best known), a step at each kept trial. A dotted line
at 95% is "within 5%"; a star marks the paired GoalMet, where the run stopped if its goal was met. A run whose card
and model have no entry with measured values has no closeness: it is left out, said in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import time_to_best  # beside this script

WITHIN = time_to_best.WITHIN


def curve(res: dict[str, Any]) -> dict[str, Any] | None:
    """A run's best-so-far closeness: steps [(GPU-s, closeness)], the GoalMet point, its end; None without
    measured values to judge against."""
    pts = [(k["at_s"], k["closeness"]) for k in res["kept"] if k["closeness"] is not None]
    if not pts:
        return None
    steps, best = [], 0.0
    for at, c in pts:
        if c > best:
            best = c
            steps.append((at, c))
    met = res["paired_goal_met"]["value"]
    at_met = max((c for at, c in steps if at <= met), default=None) if met is not None else None
    return {"label": f"{res['preset']}, {res['run']['name']}", "card": res["card"], "steps": steps,
            "goal_met": (met, at_met) if met is not None and at_met is not None else None,
            "end_s": res["gpu_s_total"], "within_s": res["kept_within_5pct"]["value"]}


def write_plot(curves: list[dict[str, Any]], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, c in enumerate(curves):
        xs = [0.0] + [at for at, _ in c["steps"]] + [c["end_s"]]
        ys = [0.0] + [100 * y for _, y in c["steps"]] + [100 * c["steps"][-1][1]]
        ax.step(xs, ys, where="post", color=f"C{i}", label=c["label"])
        if c["goal_met"]:
            ax.plot([c["goal_met"][0]], [100 * c["goal_met"][1]], marker="*", ms=11, color=f"C{i}", ls="none")
    ax.plot([], [], marker="*", ms=9, color="grey", ls="none", label="paired GoalMet (the run stops)")
    ax.axhline(100 * (1 - WITHIN), color="grey", lw=0.8, ls=":", label="within 5% of the best known")
    ax.set_xlabel("GPU-seconds from the run's start")
    ax.set_ylabel("best kept so far, % of the best known")
    ax.set_ylim(0, 110)
    ax.set_xlim(left=0)
    ax.legend(fontsize=7, loc="lower right")
    cards = sorted({c["card"] or "?" for c in curves})
    ax.set_title(f"Time to best on the {' and '.join(cards)}: each run's best kept trial so far", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", type=Path, nargs="+")
    ap.add_argument("--best-known", type=Path, default=Path(__file__).with_name("best_known.json"))
    ap.add_argument("--out", type=Path, required=True, help="the plot (.svg or .png)")
    args = ap.parse_args(argv)
    best = json.loads(args.best_known.read_text())
    curves = []
    for db in args.db:
        if not db.exists():
            print(f"ttb_plot: no such database: {db}", file=sys.stderr)
            return 2
        c = curve(time_to_best.analyse(db, best))
        if c is None:
            print(f"ttb_plot: {db.name}: no best known setting with measured values for its card and model: left out")
            continue
        curves.append(c)
        print(f"{db.name}: within 5% at {c['within_s']} GPU-s; paired GoalMet at "
              f"{c['goal_met'][0] if c['goal_met'] else None} GPU-s; best {100 * c['steps'][-1][1]:.1f}%")
    if not curves:
        print("ttb_plot: nothing to plot", file=sys.stderr)
        return 2
    print(f"wrote {write_plot(curves, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
