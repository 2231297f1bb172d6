"""Review commands of the `infergoal` CLI: why, lineage, export, study, floors, log, shell.

They live in their own typer app, merged into the main one (`app.add_typer(review_app)`), so
the main CLI module stays small. Like the main CLI, commands import what they need when they
run, so `infergoal --help` starts in a fraction of a second. The workspace is the one the global
options (`-w`, `--db`, `-o`) name, through `orchestrator.cli.common`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from orchestrator.cli.common import console, get_store, get_workspace, run_id_of
from orchestrator.cli.errors import emit, fail
from orchestrator.review.leaseloss import lease_words
from orchestrator.review.trials import knob_text, measurement_note, paired_scores, score_text

__all__ = ["review_app", "html_report", "query_trials", "trial_number"]

review_app = typer.Typer()


def trial_number(text: str | None) -> int | None:
    """A trial number given on the command line; anything else ends the command with one line."""
    if text is None:
        return None
    if not text.strip().isdigit():
        fail(f"{text!r} is not a trial number; give one as `infergoal trials` lists them (0 = the baseline), "
             "or none to ask why the run stopped")
    return int(text)


def _open(run: int | None, *, read_only: bool = True) -> tuple[Any, Any, int]:
    """The workspace, its store and the id of run `run` (default: the latest run). Audit commands
    read: the store is opened read-only (nothing created or migrated) unless a command records."""
    store = get_store(read_only=read_only)
    return get_workspace(), store, run_id_of(store, run)


def query_trials(trials: list[Any], status: list[str], proposer: str, where: list[str], sort: str, desc: bool) -> list[Any]:
    """`infergoal trials` filters; a bad filter ends the command with one error line."""
    from orchestrator.review.query import QueryError, select_trials

    try:
        return select_trials(trials, status=status, proposer=proposer, where=where, sort=sort, descending=desc)
    except QueryError as e:
        fail(str(e))


def html_report(store: Any, run_id: int, out_dir: Path, db_url: str) -> Path:
    """Write report.html and keep the run's Optuna study in the database for optuna-dashboard."""
    from orchestrator.report.html import write_html_report
    from orchestrator.review.study import StudyError, save_study

    path = write_html_report(store, run_id, out_dir)
    try:
        save_study(store, run_id, db_url)
    except StudyError:
        pass  # an in-memory store has nowhere to keep a study; the report stands on its own
    return path


@review_app.command()
def why(
    trial: str | None = typer.Argument(None, metavar="N", help="Trial number (0 = baseline); leave out to ask why the run stopped."),
    run: int | None = typer.Option(None, "--run", "-r", help="Run id (default: latest)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Why a trial ended as it did (the first thing that decided it, with its numbers), from the store alone."""
    from orchestrator.review.facts import GLOSSARY, why_facts
    from orchestrator.review.why import explain_run, explain_trial
    from orchestrator.trial.paired import describe, latest_paired

    number = trial_number(trial)
    _, store, rid = _open(run)
    if number is None:
        data = explain_run(store, rid)
        if as_json:
            return emit(data)
        b, u = data["budget"], data["used"]
        console.print(f"run {rid}: {data['status']} — {data['stop_reason'] or 'still running'}", highlight=False)
        wall = f"{b['wall_s'] / 60:g} min" if b["wall_s"] else "unlimited"
        console.print(f"  {data['budget_line']}; trial time {u['trial_s'] / 60:.1f} min of "
                      f"{wall}; stall limit {b['stall_trials']}", highlight=False)
        best = data["best"]
        paired = latest_paired(store, rid, store.get_trial_by_number(rid, best["number"]).id) if best else None
        if best and paired and paired.get("score"):  # its score is the paired ratio now
            console.print(f"  best: #{best['number']}, paired A/B {describe(paired)}", highlight=False)
        elif best:
            console.print(f"  best: #{best['number']} at {best['score']:.3f}x (not confirmed by a paired A/B)", highlight=False)
        for r in data["failed_regions"]:
            console.print(f"  failed region: {r['region']}; proposals skipped inside it: {r['skipped']}", highlight=False)
        for loss in data["lease_lost"]:
            console.print(f"  {escape(lease_words(loss))}", highlight=False)
        return None
    try:
        w = explain_trial(store, rid, number)
    except LookupError as e:
        fail(str(e))
    if as_json:
        return emit(w.to_dict())
    note = measurement_note(store.get_trial_by_number(rid, number))
    console.print(f"run {rid} trial #{number} — {w.status} (decided by {w.decided_by}){note}", highlight=False)
    console.print(f"  {escape(w.sentence)}", highlight=False)
    table = Table("fact", "value", show_header=False, box=None, padding=(0, 2))
    table.columns[0].style = "bold"
    table.columns[1].overflow = "fold"
    for k, v in why_facts(w.evidence):
        table.add_row(k, escape(v))
    table.add_row("changed from the baseline", escape(knob_text(w.changed) if w.changed else "(nothing)"))
    cost = f"{w.cost['seconds']:.1f} s"
    if w.cost.get("tokens"):
        cost += f", {w.cost['tokens']:.0f} tokens, ${w.cost['dollars']:.4f}"
    table.add_row("cost", cost)
    for a in w.actions:
        table.add_row(a["kind"], f"by {a['who']} at {a['ts']:%Y-%m-%d %H:%M:%S} UTC")
    table.add_row("words", f"defined in {GLOSSARY} of the infergoal repository")
    console.print(table)
    return None


@review_app.command("lineage")
def lineage_cmd(
    number: int = typer.Argument(..., help="Trial number."),
    run: int | None = typer.Option(None, "--run", "-r"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """A candidate's ancestry back to the baseline: parents, their commits, and the knobs each step changed."""
    from orchestrator.review.lineage import lineage

    _, store, rid = _open(run)
    try:
        steps = lineage(store, rid, number)
    except LookupError as e:
        fail(str(e))
    if as_json:
        return emit([s.to_dict() for s in steps])
    table = Table("#", "status", "score", "parent", "commit", "changed from parent", "proposer", title=f"run {rid}: lineage of #{number}")
    paired = {store.get_trial(i).number: v for i, v in paired_scores(store, rid).items()}
    for s in steps:
        changed = " ".join(f"{k}: {a}->{b}" for k, (a, b) in s.changed.items()) or ("(baseline)" if s.parent is None else "(same knobs)")
        if s.commits:
            changed += "\n" + "\n".join(s.commits[:5])
        table.add_row(str(s.number), s.status, score_text(s.score, paired.get(s.number)), "" if s.parent is None else f"#{s.parent}",
                      s.commit[:12], changed, s.proposer)
    console.print(table)
    return None


@review_app.command()
def export(
    run: int | None = typer.Argument(None, help="Run id (default: latest)."),
    out: Path | None = typer.Option(None, "--out", help="Folder (default .infergoal/runs/N/export)."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Export a run: run.json, trials/measurements/gates/events CSV, and vLLM- and AIPerf-shaped files per trial."""
    from orchestrator.review.export import export_run

    ws, store, rid = _open(run)
    manifest = export_run(store, rid, out or ws.run_dir(rid) / "export", run_dir=ws.run_dir(rid))
    if as_json:
        return emit(manifest)
    n = sum(len(v) for v in manifest["bench_exports"].values())
    console.print(f"exported run {rid} to {manifest['out']}: {', '.join(manifest['files'])}"
                  f" + {n} vLLM/AIPerf/JSONL file(s) for {len(manifest['bench_exports'])} trial(s)", highlight=False)
    return None


@review_app.command()
def study(
    run: int | None = typer.Argument(None, help="Run id (default: latest)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Write the run's Optuna study beside the store and print the optuna-dashboard command."""
    from orchestrator.review.study import StudyError, dashboard_command, save_study

    ws, store, rid = _open(run)
    try:
        url = save_study(store, rid, ws.db_url)
    except StudyError as e:
        fail(str(e))
    if as_json:
        return emit({"run": rid, "storage": url, "study": f"infergoal-run-{rid}"})
    console.print(f"study infergoal-run-{rid} in {url}\nview it with: {dashboard_command(url)}", highlight=False)
    return None


@review_app.command()
def log(
    run: int | None = typer.Option(None, "--run", "-r", help="Only this run's actions (plus run-less ones like relocks)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The audit log: human actions (relock, approve, reject, steer, stop, contract decisions) with who and when."""
    from orchestrator.review.actions import human_actions

    store = get_store(read_only=True)
    rows = human_actions(store, run) if store is not None else []
    if as_json:
        return emit(rows)
    table = Table("when (UTC)", "run", "who", "action", "message")
    for r in rows:
        table.add_row(f"{r['ts']:%Y-%m-%d %H:%M:%S}", "" if r["run"] is None else str(r["run"]), r["who"], r["kind"], r["message"])
    console.print(table if rows else "no human actions recorded yet")
    return None


@review_app.command()
def shell(ctx: typer.Context) -> None:
    """Interactive prompt with history and completion: /goal, /status, /trials, /show N, /why N, /steer, /approve N, /reject N, /stop, /kb."""
    from orchestrator.cli.shell import Shell
    from orchestrator.store import StoreError

    try:
        sh = Shell(get_workspace(), global_args=_global_args(ctx.find_root().params))
    except StoreError as e:
        fail(str(e), "failed")
    sh.cmdloop()


def _global_args(p: dict[str, Any]) -> list[str]:
    """The global options again, for the background `infergoal goal` a shell starts."""
    args = ["-w", str(p.get("workspace") or ".")]
    if p.get("db"):
        args += ["--db", p["db"]]
    for o in p.get("override") or []:
        args += ["-o", o]
    return args


@review_app.command()
def floors(
    file: Path = typer.Argument(..., help="JSON with a `floors` object, as benchmarks/gpu/sol.py --out writes it."),
    run: int | None = typer.Option(None, "--run", "-r", help="Run id (default: latest)."),
    as_json: bool = typer.Option(False, "--json", help="Print the recorded floors as JSON."),
) -> None:
    """Record the host's physical floors (speed of light) for a run; the HTML report then shows % of them,
    and where they are for the run's model, a trial measured faster than them is invalid."""
    from gates import plausible

    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        fail(f"cannot read {file}: {e}; give the JSON benchmarks/gpu/sol.py --out wrote")
    try:
        record = plausible.record_of(data, str(file))
    except ValueError as e:
        fail(f"{file}: {e}")
    _, store, rid = _open(run, read_only=False)
    store.add_event(rid, "speed_of_light", f"floors from {file.name}", data=record)
    held = "ceilings" in record and "model" in record
    if as_json:
        return emit({"run": rid, "floors": record["floors"], "trials_held_to_them": held})
    checked = "; its next trials are held to them" if held else ""
    console.print(f"run {rid}: floors recorded ({', '.join(record['floors'])}){checked}; `infergoal report --html` shows % of them")
    return None
