"""Build a run's report: data from the store, markdown from a jinja2 template, PNG plots."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from orchestrator.core.oneline import summarize_failure
from orchestrator.core.roles import NOT_SEARCH
from orchestrator.review.facts import GLOSSARY
from orchestrator.review.pareto import run_front
from orchestrator.review.trials import (
    budget_line,
    is_measurement,
    measured_trial,
    paired_scores,
    score_text,
    shown_status,
    split_trials,
)
from orchestrator.trial.paired import beat_baseline, latest_paired

__all__ = ["ReportData", "build_report_data", "md_cell", "write_report"]

STEPS = ("propose", "deploy", "gates", "bench", "teardown", "record")
# Time the engine itself needs (launch, gate probes, benchmark, shutdown) is not overhead;
# what the orchestrator adds around it (proposing, recording, bookkeeping) is.
ENGINE_STEPS = ("deploy", "gates", "bench", "teardown")


@dataclass
class ReportData:
    run: dict[str, Any]
    trials: list[dict[str, Any]]
    best: dict[str, Any] | None
    baseline: dict[str, Any] | None
    objectives: list[dict[str, Any]]
    step_totals: dict[str, float]
    total_s: float
    overhead_s: float
    overhead_pct: float
    gate_rejections: list[dict[str, Any]] = field(default_factory=list)
    paired: dict[str, Any] | None = None
    """The best candidate's paired A/B outcome (ratio, interval, rounds), when it was confirmed."""
    budget_line: str = ""
    """`5 of 5 trials +6 measurements`: what the budget counted, as every face says it."""
    pareto: dict[str, Any] | None = None
    """A goal trading off two objectives: its Pareto front (`review.pareto.Front.to_dict`), else None."""
    beat: bool = False
    """Whether the best candidate beat the baseline: its paired interval clears 1.0 (`paired.beat_baseline`)."""
    glossary: str = GLOSSARY
    throughput: list[dict[str, Any]] = field(default_factory=list)
    """A throughput goal's baseline and best, per host and per GPU (`output_throughput_per_gpu`), whichever it named."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_report_data(store: Any, run_id: int) -> ReportData:
    from orchestrator.config.goal import GoalSpec
    from orchestrator.trial.context import objective_label

    run = store.get_run(run_id)
    if run is None:
        raise LookupError(f"no run {run_id}")
    goal = GoalSpec(**run.goal)
    trials = store.list_trials(run_id)
    base = next((t for t in trials if t.number == 0), None)
    best = store.get_trial(run.best_trial_id) if run.best_trial_id else None
    base_knobs = base.knobs if base else {}
    front = run_front(store, run_id)
    rows = []
    paired_of = paired_scores(store, run_id)
    for t in trials:
        changed = {k: v for k, v in t.knobs.items() if base_knobs.get(k) != v}
        rows.append({
            "number": t.number, "status": shown_status(t), "score": t.score, "proposer": t.proposer,
            "objective": t.objective or {}, "knobs": t.knobs, "changed": changed,
            "error": t.error, "timings": t.timings or {}, "launch_cmd": t.launch_cmd, "rationale": t.rationale,
            # a paired round, sentinel or re-run: a measurement of trial `of`, never a trial of its own
            "measurement": is_measurement(t), "of": measured_trial(t),
            # a confirmed candidate's score is its paired A/B ratio (the loop replaced its screening score)
            "score_paired": score_text(t.score, paired_of.get(t.id)).endswith("paired"),
            "on_front": bool(front and t.number in front.numbers and not is_measurement(t)),
        })
    paired = latest_paired(store, run_id, best.id) if best else None
    objectives = []
    for o in goal.objectives:
        label = objective_label(o.scenario, o.key)
        b = (base.objective or {}).get(label) if base else None
        v = (best.objective or {}).get(label) if best else None
        objectives.append({
            "label": label, "describe": o.describe(), "unit": o.info.unit, "baseline": b, "best": v,
            "target": o.target_for(b) if b is not None else None,
            "speedup": o.speedup(v, b) if (b and v) else None,
            "met": o.met(v, b) if (b and v) else False,
        })
        po = ((paired or {}).get("objectives") or {}).get(label)
        if po:  # the claim is the paired ratio, not best / baseline #0 measured minutes apart
            objectives[-1].update(speedup=po["ratio"], lo=po.get("lo"), hi=po.get("hi"), met=po["verdict"] == "pass",
                                  unpaired=o.speedup(v, b) if (b and v) else None)
    step_totals = {s: sum((t.timings or {}).get(s, 0.0) for t in trials) for s in STEPS}
    total = sum((t.timings or {}).get("total", 0.0) for t in trials)
    engine = sum(step_totals[s] for s in ENGINE_STEPS)
    # Prefer the sessions' wall clock (it also holds the time between trials); fall back to the
    # trials' own totals for runs still in flight.
    sessions = sum(float((e.data or {}).get("wall_s", 0.0)) for e in store.events(run_id, kind="session"))
    total = max(total, sessions)
    overhead = max(total - engine, 0.0)
    rejections = []
    for t in trials:
        for g in store.gate_results(t.id):
            # The performance gate "fails" every candidate that misses the goal: that is in the
            # trial table already. Findings are what integrity and accuracy flagged.
            if g.status != "pass" and g.gate != "performance":
                rejections.append({"trial": t.number, "gate": g.gate, "status": g.status, "reason": g.reason})
    def as_dict(t: Any) -> dict[str, Any] | None:
        return next((r for r in rows if r["number"] == t.number), None) if t else None

    return ReportData(
        run={"id": run.id, "name": run.name, "goal": run.goal_text, "goal_describe": goal.describe(),
             "status": run.status, "stop_reason": run.stop_reason, "created_at": str(run.created_at),
             "proposer": run.proposer, "host": run.host, "target": run.target.get("name")},
        trials=rows, best=as_dict(best), baseline=as_dict(base), objectives=objectives,
        step_totals=step_totals, total_s=total, overhead_s=overhead,
        overhead_pct=100 * overhead / total if total else 0.0, gate_rejections=rejections,
        paired=paired, budget_line=budget_line(len(split_trials(trials)[0]), goal.budget.trials, len(split_trials(trials)[1])),
        pareto=front.to_dict() if front else None, beat=beat_baseline(paired),
        throughput=_throughput(store, goal, base, best),
    )


def _throughput(store: Any, goal: Any, base: Any, best: Any) -> list[dict[str, Any]]:
    """For a throughput goal: the baseline's and the best trial's output tok/s per host and per GPU."""
    scenarios = {o.scenario for o in goal.objectives if o.key.startswith("output_throughput")}
    rows = []
    for name, t in (("baseline", base), ("best", best)):
        if t is None:
            continue
        for scenario in sorted(scenarios):
            got: dict[str, list[float]] = {}
            for m in store.measurements(t.id):
                if m.scenario == scenario and m.metric in ("output_throughput", "output_throughput_per_gpu"):
                    got.setdefault(m.metric, []).append(m.value)
            if "output_throughput" in got:
                host = sum(got["output_throughput"]) / len(got["output_throughput"])
                per_gpu = sum(got["output_throughput_per_gpu"]) / len(got["output_throughput_per_gpu"]) \
                    if got.get("output_throughput_per_gpu") else None
                rows.append({"trial": name, "number": t.number, "scenario": scenario, "per_host": host, "per_gpu": per_gpu,
                             "gpus": round(host / per_gpu) if per_gpu else None})
    return rows


def _plot(data: ReportData, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"kept": "tab:green", "measured": "tab:blue", "discarded": "tab:gray", "failed": "tab:red", "invalid": "tab:purple",
              "needs_approval": "tab:orange", "rejected": "tab:brown"}
    fig, ax = plt.subplots(figsize=(8, 4), dpi=110)
    best, xs, ys = 1.0, [], []
    for t in [t for t in data.trials if not t["measurement"]]:  # measurements are not trials: off the trial axis
        score = t["score"] if t["score"] else 1.0  # failed/invalid trials score 1.0x by convention
        ax.scatter(t["number"], score, color=colors.get(t["status"], "black"), zorder=3,
                   marker="x" if t["status"] in ("failed", "invalid") else "o")
        if t["status"] == "kept" and t["proposer"] not in NOT_SEARCH:
            best = max(best, score)
        xs.append(t["number"])
        ys.append(best)
    ax.step(xs, ys, where="post", color="tab:green", alpha=0.6, label="best kept")
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="baseline")
    for s, c in colors.items():
        ax.scatter([], [], color=c, label=s)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("score (geomean speedup over baseline)")
    ax.set_title(f"run {data.run['id']}: {data.run['goal']}"[:110], fontsize=8)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def md_cell(value: Any) -> str:
    """Text that stays inside one markdown table cell: one line, pipes and backslashes escaped."""
    text = " ".join(str(value if value is not None else "").split())
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")


def write_report(store: Any, run_id: int, out_dir: str | Path) -> Path:
    """Write `report.md` and `speedup.png` into `out_dir`; return the markdown path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = build_report_data(store, run_id)
    plot = _plot(data, out_dir / "speedup.png")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=False, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["num"] = lambda v, nd=2: "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"
    env.filters["cell"] = md_cell
    env.filters["failure"] = summarize_failure
    md = env.get_template("report.md.j2").render(d=data, plot=plot.name)
    path = out_dir / "report.md"
    path.write_text(md)
    return path
