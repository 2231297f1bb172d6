"""Plots for the HTML report, as inline SVG strings (no image files, nothing to fetch)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
from matplotlib.ticker import MaxNLocator  # noqa: E402

from orchestrator.core.roles import NOT_SEARCH  # noqa: E402
from orchestrator.review.pareto import non_dominated  # noqa: E402

__all__ = ["best_so_far_svg", "pareto_front", "pareto_svg", "timeline_svg", "trial_timeline"]

COLORS = {"kept": "tab:green", "measured": "tab:blue", "discarded": "tab:gray", "failed": "tab:red", "invalid": "tab:purple",
          "needs_approval": "tab:orange", "rejected": "tab:brown"}


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "infergoal"}):  # text stays text; stable ids
        fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: it is inlined in HTML


def best_so_far_svg(trials: Sequence[dict[str, Any]], *, x: str, xlabel: str) -> str:
    """Score per trial (coloured by status) and the best kept score so far, against `x`.

    Measurements of a trial (paired rounds, sentinels, re-runs: `measurement` set) are not trials:
    they are left off. The points are drawn in `x` order, so a time axis only moves forward; each
    point's group has an id starting `trial-points` (the browser test counts them), the line `best-so-far`."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    shown = sorted((t for t in trials if not t.get("measurement")), key=lambda t: t[x])
    best, xs, ys = 1.0, [], []
    for failed in (False, True):
        pts = [t for t in shown if (t["status"] in ("failed", "invalid")) == failed]
        if pts:  # failed/invalid trials score 1.0x by convention
            ax.scatter([t[x] for t in pts], [t["score"] or 1.0 for t in pts], color=[COLORS.get(t["status"], "black") for t in pts],
                       zorder=3, s=22, marker="x" if failed else "o", gid="trial-points-failed" if failed else "trial-points")
    for t in shown:
        if t["status"] == "kept" and t["proposer"] not in NOT_SEARCH:
            best = max(best, t["score"] or 1.0)
        xs.append(t[x])
        ys.append(best)
    ax.step(xs, ys, where="post", color="tab:green", alpha=0.7, label="best so far", gid="best-so-far")
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="baseline")
    for s, c in COLORS.items():
        if any(t["status"] == s for t in shown):
            ax.scatter([], [], color=c, label=s, s=22)
    if x == "number":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("score (× baseline)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _svg(fig)


def pareto_front(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Points not dominated on (lower TTFT, higher throughput), by rising TTFT (`review.pareto.non_dominated`)."""
    front = non_dominated(points, {"ttft": "minimize", "throughput": "maximize"})
    return sorted(front, key=lambda p: p["ttft"])  # type: ignore[arg-type, return-value]


def pareto_svg(points: Sequence[dict[str, Any]], front: Sequence[dict[str, Any]], scenario: str = "", *,
               x: str = "ttft", y: str = "throughput", xlabel: str = "", ylabel: str = "") -> str:
    """Every point (coloured by status, labelled #N) and the front drawn as a line through its members,
    in rising `x`. Default axes: TTFT p50 against output throughput in `scenario`; a goal's two
    objectives name their own (`x`, `y`: the point keys; the labels)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    for p in points:
        ax.scatter(p[x], p[y], color=COLORS.get(p["status"], "black"), s=22, zorder=3)
        ax.annotate(f"#{p['number']}", (p[x], p[y]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    line = sorted(front, key=lambda p: p[x])
    # Markers too: a front of one point is a point, and a line through one point draws nothing.
    ax.plot([p[x] for p in line], [p[y] for p in line], color="tab:blue", lw=1.2, marker="o", ms=9,
            mfc="none", mew=1.5, zorder=4, label="Pareto front", gid="pareto-front")
    ax.set_xlabel(xlabel or f"TTFT p50 (ms), scenario {scenario}")
    ax.set_ylabel(ylabel or "output throughput (tok/s)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _svg(fig)


TIMELINE_STEPS = (("deploy", "tab:blue"), ("gates", "tab:orange"), ("bench", "tab:green"),
                  ("other", "tab:gray"), ("idle", "lightgray"))


def trial_timeline(trials: Sequence[Any]) -> list[dict[str, Any]]:
    """Seconds per trial spent deploying, gating, benchmarking, on the rest of the trial (teardown,
    audit), and idle before it (from the previous trial's end to its start: proposing, recording).

    `trials`: store trial records in run order (their `timings`, `started_at`, `finished_at`)."""
    rows, prev_end = [], None
    for t in trials:
        tm = t.timings or {}
        steps = {s: float(tm.get(s, 0.0)) for s in ("deploy", "gates", "bench")}
        steps["other"] = max(float(tm.get("trial", 0.0)) - sum(steps.values()), 0.0)
        if prev_end is not None and t.started_at is not None:
            steps["idle"] = max((t.started_at - prev_end).total_seconds(), 0.0)
        else:  # the first trial, or one never started: what the loop spent around it
            steps["idle"] = float(tm.get("propose", 0.0)) + float(tm.get("record", 0.0))
        prev_end = t.finished_at or prev_end
        rows.append({"number": t.number, "status": t.status, **steps})
    return rows


def timeline_svg(rows: Sequence[dict[str, Any]]) -> str:
    """One stacked bar per trial: deploy / gates / bench / other / idle seconds (`trial_timeline`)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    xs = [r["number"] for r in rows]
    bottom = [0.0] * len(rows)
    for step, color in TIMELINE_STEPS:
        heights = [r[step] for r in rows]
        ax.bar(xs, heights, bottom=bottom, color=color, label=step, width=0.8)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, loc="upper left", ncol=5)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return _svg(fig)
