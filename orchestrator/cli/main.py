"""The `infergoal` app: its global options, starting and resuming a goal, the views of a run.

The other command groups live beside it (`review`, `kb`, `hosts`) and are merged in here; this
module is the only one that imports them.

Every command that prints data takes `--json`. Global options (`-w`, `--db`, `-o`, `--debug`) go
before the command: `infergoal -o bench.scale=0.5 goal "..."`.

Every error is one line on stderr (`error: what; what to do next`) and a documented exit code
(orchestrator/core/exitcodes.py); with `--json` the same outcome is also printed as JSON on stdout.
A traceback is shown only under `--debug`.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from orchestrator.cli.common import STATE, console, err, get_store, get_workspace, run_id_of, whoami
from orchestrator.cli.errors import ERRORS, GuardedGroup, emit, fail
from orchestrator.cli.hosts import hosts_app
from orchestrator.cli.kb import kb_app
from orchestrator.cli.live import drive, finish, resume_progress
from orchestrator.cli.review import html_report, query_trials, review_app

__all__ = ["app"]

app = typer.Typer(
    cls=GuardedGroup,
    help=(
        "infergoal: optimise an LLM server toward a goal — search + gates + memory.\n\n"
        "Quick start: `infergoal goal \"improve throughput by 2.5x without accuracy loss within 12 trials\"` runs the embedded default (the hfserve example on a tiny local model, "
        "Optuna search, SQLite under .infergoal/). Then `infergoal trials`, `infergoal show N`, `infergoal report`."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
model_app = typer.Typer(help="Make local Hugging Face-format models (no hub needed).", no_args_is_help=True)
gates_app = typer.Typer(help="Verify or relock the immutable gate suite.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(gates_app, name="gates")
app.add_typer(review_app)  # why, lineage, export, study, floors, log, shell (orchestrator/cli/review.py)
app.add_typer(hosts_app, name="hosts")
app.add_typer(kb_app, name="kb")  # orchestrator/cli/kb.py


@app.callback()
def main(
    workspace: Path = typer.Option(Path("."), "--workspace", "-w", help="Workspace folder (holds infergoal.toml and .infergoal/)."),
    db: str = typer.Option("", "--db", help="SQLAlchemy URL of the store, e.g. postgresql+psycopg://user@host/db (default: SQLite in .infergoal/)."),
    override: list[str] = typer.Option([], "--override", "-o", help="Config override a.b=value, e.g. -o bench.scale=0.5 (repeatable)."),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error instead of one line."),
) -> None:
    STATE.workspace = workspace
    STATE.overrides = list(override) + ([f"db={json.dumps(db)}"] if db else [])
    ERRORS.debug = debug
    # SIGINT is how a run is stopped cleanly (Ctrl-C, the shell's /stop, a pool's supervisor). A
    # process started from a background job inherits SIGINT *ignored*, and Python then never raises
    # KeyboardInterrupt: the run could only be killed, leaving it "running". Take SIGINT back.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# --- running ------------------------------------------------------------------------------
@app.command()
def goal(
    text: str = typer.Argument(..., help='Goal text, e.g. "beat the baseline by 20% on TTFT and TPOT without accuracy loss within 30m", or a goal .toml file.'),
    target: str = typer.Option("", "--target", "-t", help="Target TOML (default: examples/targets/hfserve.toml)."),
    host: str = typer.Option("", "--host", help="Where engines run: local (default), ssh://user@host:port, a name from `infergoal hosts add`, or several (a pool) separated by commas."),
    proposer: str = typer.Option("", "--proposer", "-p", help="search (default), claude, hybrid or scripted:FILE.json."),
    agent: str = typer.Option("", "--agent", help="Use the code agent: `claude` (same as --proposer claude; with --proposer hybrid, the hybrid)."),
    seed: int | None = typer.Option(None, "--seed", help="Search seed."),
    probe_winner: int | None = typer.Option(None, "--probe-winner", min=0, max=100, metavar="N",
                                            help="After the stop, measure up to N one-knob neighbours of the winner for "
                                            "the knowledge base (which knob moved it, by how much); the next model's "
                                            "run swaps the knobs that mattered. Default 0 (config `probe_winner`)."),
    name: str = typer.Option("", "--name", help="Run name."),
    share_host: bool = typer.Option(False, "--share-host", help="Measure even while another run (of any workspace or user) "
                                    "holds the host; numbers will be noisier. Same as -o allow_concurrent_runs=true."),
    no_report: bool = typer.Option(False, "--no-report", help="Skip writing the report at the end."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Start a run toward a goal and drive it until the goal is met, the budget is spent or it stalls."""
    from orchestrator.config.goal import GoalError, load_goal
    from orchestrator.runs import start_run

    try:
        spec = load_goal(text)
    except GoalError as e:
        fail(str(e))
    if len(name) > 200:
        fail(f"--name is {len(name)} characters; keep it to 200")
    if agent and agent != "claude":
        fail(f"unknown agent {agent!r}; the agent is `claude` (key from ANTHROPIC_API_KEY)")
    proposer = proposer or agent
    extra = [f"target={json.dumps(str(Path(target).resolve()))}"] if target else []
    extra += [f"host={json.dumps(host)}"] if host else []
    extra += [f"proposer={json.dumps(proposer)}"] if proposer else []
    extra += [f"seed={seed}"] if seed is not None else []
    extra += [f"probe_winner={probe_winner}"] if probe_winner is not None else []
    extra += ["allow_concurrent_runs=true"] if share_host else []
    STATE.overrides = [*STATE.overrides, *extra]
    ws = get_workspace(create=True)
    from orchestrator.targets import TargetError, load_target

    try:
        load_target(ws.target_path)  # a bad target is refused before anything starts
    except TargetError as e:
        fail(str(e))
    if not as_json:
        console.print(f"[bold]goal:[/] {spec.describe()}", highlight=False)
    outcome = drive(lambda **kw: start_run(ws, spec, name=name, **kw), spec.budget.trials, as_json)
    finish(outcome, as_json, not no_report)


@app.command()
def resume(
    run: int | None = typer.Argument(None, help="Run id (default: the latest run)."),
    share_host: bool = typer.Option(False, "--share-host", help="Measure even while another run holds the host (noisier numbers)."),
    no_report: bool = typer.Option(False, "--no-report"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Continue a run that was stopped or killed: interrupted trials are re-run, none lost or duplicated."""
    from orchestrator.runs import resume_run

    ws = get_workspace()
    if get_store(read_only=True) is None:  # nothing to resume: do not create a database to say so
        fail("no run to resume; start one with `infergoal goal \"...\"`")
    total, done = resume_progress(get_store(read_only=True), run)  # the bar keeps the goal's budget and what is done
    outcome = drive(lambda **kw: resume_run(ws, run, share_host=share_host, **kw), total, as_json, done)
    finish(outcome, as_json, not no_report)


# --- auditing ------------------------------------------------------------------------------
def _trial_dict(t: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(t)


@app.command()
def status(as_json: bool = typer.Option(False, "--json")) -> None:
    """List runs with their state and best score (`interrupted`: running, but its process is gone)."""
    from orchestrator.config.goal import GoalSpec
    from orchestrator.core.oneline import summarize_failure
    from orchestrator.hosts.runlease import LEASE_LOST, LEASE_RETAKEN, display_status
    from orchestrator.review.leaseloss import lease_losses
    from orchestrator.review.trials import budget_line, split_trials
    from orchestrator.trial.paired import describe, latest_paired

    store = get_store(read_only=True)
    rows = []
    for r in store.list_runs() if store else []:
        trials, measured = split_trials(store.list_trials(r.id))  # the budget's trials; measurements beside them
        best = store.get_trial(r.best_trial_id) if r.best_trial_id else None
        paired = latest_paired(store, r.id, best.id) if best else None
        rows.append({"id": r.id, "name": r.name, "status": display_status(r), "trials": len(trials), "measurements": len(measured),
                     "budget_line": budget_line(len(trials), GoalSpec.model_validate(r.goal).budget.trials, len(measured)),
                     "best_trial": best.number if best else None, "best_score": best.score if best else None,
                     "paired": paired, "stop_reason": summarize_failure(r.stop_reason) or None, "created_at": r.created_at,
                     "owner": f"{r.owner_host}:{r.owner_pid}" if r.owner_pid else None,
                     "lease_lost": lease_losses(store.events(r.id, kind=LEASE_LOST) + store.events(r.id, kind=LEASE_RETAKEN))})
    if as_json:
        return emit(rows)
    if not rows:
        console.print("no runs yet; start one with `infergoal goal \"...\"`")
        return
    table = Table("run", "status", "trials", "best", "score", "stop reason", "name")
    for c in table.columns[2:]:
        c.overflow = "fold"  # a budget line, stop reason or name cut short is no answer: wrap it
    for r in rows:
        lost = r["lease_lost"]
        if lost:  # its measurements may have shared the host: say so beside its status
            r["status"] += "\n(host lease lost" + (", taken again)" if all(x["retaken_at"] for x in lost) else ")")
        score = describe(r["paired"], short=True) if r["paired"] else (f"{r['best_score']:.3f}x (unpaired)" if r["best_score"] else "")
        table.add_row(str(r["id"]), r["status"], r["budget_line"], "" if r["best_trial"] is None else f"#{r['best_trial']}",
                      score, escape(r["stop_reason"] or ""), escape(r["name"]))
    console.print(table)


@app.command()
def trials(
    run: int | None = typer.Option(None, "--run", "-r", help="Run id (default: latest)."),
    status: list[str] = typer.Option([], "--status", "-s", help="Only trials with this status (repeatable)."),
    proposer: str = typer.Option("", "--proposer", help="Only trials from this proposer (substring)."),
    where: list[str] = typer.Option([], "--where", help="Metric filter, e.g. 'score>1.2', 'tpot_ms_p50<40', 'time<60' (repeatable)."),
    sort: str = typer.Option("number", "--sort", help="Sort key: number, score, time or an objective metric."),
    desc: bool = typer.Option(False, "--desc", help="Sort descending."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON; `measurement: true` rows (with `of`: the trial "
                                 "they measure) are not counted in the budget."),
) -> None:
    """The trials of a run: status, score, objective values, changed knobs; filtered and sorted on request."""
    store = get_store(read_only=True)
    rid = run_id_of(store, run)
    everything = store.list_trials(rid)
    ts = query_trials(everything, status, proposer, where, sort, desc)
    from orchestrator.review.pareto import run_front
    from orchestrator.review.trials import (
        budget_line,
        is_measurement,
        knob_text,
        measured_trial,
        paired_scores,
        score_text,
        shown_status,
        split_trials,
    )

    front = run_front(store, rid)  # a goal trading off two objectives: which trials are on its front
    if as_json:  # each row says whether the budget counted it: a trial, or a measurement `of` one
        return emit([_trial_dict(t) | {"measurement": is_measurement(t), "of": measured_trial(t)}
                     | ({"on_front": t.number in front.numbers} if front else {}) for t in ts])
    from orchestrator.config.goal import GoalSpec

    base = everything[0].knobs if everything else {}
    paired = paired_scores(store, rid)  # a confirmed candidate's score is its paired ratio: say so
    counted, measured = split_trials(everything)
    budget = GoalSpec.model_validate(store.get_run(rid).goal).budget.trials
    captions = ["↳ rows are measurements of the trial they name (paired rounds, sentinels, re-runs): not trials"] if measured else []
    if front and front.points:  # nothing measured yet: no caption for an empty front
        captions.append(f"◆ on the Pareto front of {' and '.join(o.describe() for o in front.objectives)} "
                        f"({len(front.members)} of {len(front.points)} measured trials)")
    table = Table("#", "status", "score", "objective", "changed knobs", "time s", "proposer",
                  title=f"run {rid}: {budget_line(len(counted), budget, len(measured))}",
                  caption="\n".join(captions) or None)
    for c in table.columns[3:5]:
        c.overflow = "fold"
    for t in ts:
        changed = knob_text({k: v for k, v in t.knobs.items() if base.get(k) != v})
        obj = " ".join(f"{k.split(':')[1]}={v:.2f}" for k, v in (t.objective or {}).items())
        number, who = str(t.number), t.proposer
        if is_measurement(t):
            of = measured_trial(t)
            number, who = f"↳ {t.number}", f"{t.proposer} of #{of}" if of is not None else t.proposer
        elif front and t.number in front.numbers:
            number = f"{t.number} ◆"
        table.add_row(number, shown_status(t), score_text(t.score, paired.get(t.id)), obj, changed,
                      f"{(t.timings or {}).get('total', 0):.1f}", who, style="dim" if is_measurement(t) else None)
    console.print(table)


@app.command()
def show(
    number: int = typer.Argument(..., help="Trial number within the run (0 = baseline)."),
    run: int | None = typer.Option(None, "--run", "-r"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Everything about one trial: knobs, launch command, gates, measurements, timings, log."""
    store = get_store(read_only=True)
    rid = run_id_of(store, run)
    t = store.get_trial_by_number(rid, number)
    if t is None:
        fail(f"run {rid} has no trial #{number}; list them with `infergoal trials`")
    from orchestrator.trial.paired import describe, latest_paired
    from orchestrator.trial.verdict import why_of

    gates = [_trial_dict(g) for g in store.gate_results(t.id)]
    meas = [_trial_dict(m) for m in store.measurements(t.id)]
    why, paired = why_of(store, rid, t.id), latest_paired(store, rid, t.id)
    hosts = [e.data for e in store.events(rid, kind="measure.host") if e.trial_id == t.id]
    ran = [e for e in store.events(rid, kind="trial.gpus") if e.trial_id == t.id]  # a GPU pool's trial
    if as_json:
        return emit({"trial": _trial_dict(t), "gates": gates, "measurements": meas, "why": why, "paired": paired, "host": hosts}
                    | ({"gpus": ran[-1].data} if ran else {}))
    from orchestrator.review.trials import knob_text, measurement_note, score_text, shown_status

    said = score_text(t.score, (paired or {}).get("score"), unit="x")
    console.print(f"[bold]run {rid} trial #{t.number}[/] — {shown_status(t)}" + (f", score {said}" if said else "") + measurement_note(t),
                  highlight=False)
    if why:
        console.print(f"  why: {why}", highlight=False)
    if paired:
        console.print(f"  paired A/B: {describe(paired)}, goal {'met' if paired['met'] else 'not met'}", highlight=False)
    for h in hosts:
        w = h["window"]
        console.print(f"  host during {h['scenario']} #{h['repeat']}: load {w['load1']:.2f}, others' runnable "
                      f"{w.get('foreign_load', float('nan')):.2f}/CPU, steal {w['steal']:.0%}, client CPU {w['client_cpu']:.0%}"
                      + (f", {h['attempts']} attempts" if h["attempts"] > 1 else "")
                      + (f", prompts drawn {h['prompts']['prompt_seed']}" if (h.get("prompts") or {}).get("prompt_seed") is not None else ""),
                      highlight=False)
    if ran:
        console.print(f"  ran on: {escape(ran[-1].message.split(' on ', 1)[-1])}", highlight=False)
    for k in ("proposer", "rationale", "commit", "launch_cmd", "log_path", "error"):
        if getattr(t, k):
            console.print(f"  {k}: {escape(str(getattr(t, k)))}", highlight=False)
    console.print(f"  knobs: {escape(knob_text(t.knobs))}", highlight=False)
    console.print("  timings: " + ", ".join(f"{k}={v:.2f}s" for k, v in (t.timings or {}).items()), highlight=False)
    for g in gates:
        console.print(f"  gate {g['gate']}: {g['status']} — {g['reason']}", highlight=False)
    if any(m["metric"] == "osl_pinned" and m["value"] == 0 for m in meas):  # an engine without ignore_eos (gates/api.py)
        eos = int(sum(m["value"] for m in meas if m["metric"] == "osl_eos_short"))
        console.print(f"  bench: output lengths bounded by max_tokens, not pinned (the engine has no ignore_eos); "
                      f"{eos} request(s) stopped at EOS", highlight=False)
    table = Table("scenario", "repeat", "metric", "value")
    keep = ("ttft_ms_p50", "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p50", "output_throughput", "request_throughput", "completed", "failed")
    for m in meas:
        if m["metric"] in keep:
            table.add_row(m["scenario"], str(m["repeat"]), m["metric"], f"{m['value']:.3f}")
    console.print(table)


@app.command()
def report(
    run: int | None = typer.Option(None, "--run", "-r"),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default .infergoal/runs/N/report)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report data as JSON (still writes the files)."),
    html: bool = typer.Option(False, "--html", help="Also write report.html: one self-contained page with plots, gates, why per trial."),
) -> None:
    """Write the run's markdown report with the trial table, the best launch command and plots."""
    from orchestrator.report import build_report_data, write_report

    store = get_store(read_only=True)
    rid = run_id_of(store, run)
    dest = out or get_workspace().run_dir(rid) / "report"
    try:
        path = write_report(store, rid, dest)
        if html:
            path = html_report(store, rid, path.parent, get_workspace().db_url)
    except OSError as e:
        fail(f"cannot write the report to {dest}: {e.strerror or e}; pass --out DIR on a writable disk", "failed")
    if as_json:
        return emit(build_report_data(store, rid).to_dict() | {"report": str(path)})
    console.print(f"report: {path}")


def _decide(number: int, run: int | None, status: str, who: str) -> None:
    from orchestrator.review.actions import DecisionError, decide

    store = get_store()
    rid = run_id_of(store, run)
    try:
        decide(store, rid, number, status, who)  # the one rule, shared with the shell's /approve
    except DecisionError as e:
        fail(str(e))
    console.print(f"trial #{number}: {status}")


@app.command("approve")
def approve_trial(number: int, run: int | None = typer.Option(None, "--run", "-r")) -> None:
    """Accept a trial that passed the gates with measurable accuracy drift (status needs_approval)."""
    _decide(number, run, "kept", whoami())


@app.command("reject")
def reject_trial(number: int, run: int | None = typer.Option(None, "--run", "-r")) -> None:
    """Reject a trial waiting for approval."""
    _decide(number, run, "rejected", whoami())


@app.command()
def steer(
    text: str = typer.Argument(..., help="What the code agent should know or do, e.g. \"leave the dtype alone\"."),
    run: int | None = typer.Option(None, "--run", "-r", help="Run id (default: the latest run)."),
) -> None:
    """Send the code agent of a run a message; it reaches the agent at its next turn."""
    store = get_store()
    rid = run_id_of(store, run)
    store.add_event(rid, "steer", text, data={"who": whoami()})
    console.print(f"run {rid}: message stored; the agent reads it at its next turn")


@app.command()
def diff(
    a: int = typer.Argument(..., help="Trial number (0 = the baseline)."),
    b: int = typer.Argument(..., help="Trial number to compare with."),
    run: int | None = typer.Option(None, "--run", "-r", help="Run id (default: the latest run)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run, both trials' commits and the diff as JSON."),
) -> None:
    """Show the engine code change between two trials' commits (git diff)."""
    import git

    store = get_store(read_only=True)
    rid = run_id_of(store, run)
    ta, tb = store.get_trial_by_number(rid, a), store.get_trial_by_number(rid, b)
    if ta is None or tb is None:
        fail(f"run {rid} has no trial #{a if ta is None else b}; list them with `infergoal trials`")
    try:
        text = git.Repo(store.get_run(rid).target["source"], search_parent_directories=True).git.diff(ta.commit, tb.commit)
    except (git.GitError, OSError) as e:
        fail(f"cannot diff the commits of #{a} and #{b}: {e}")
    if as_json:
        return emit({"run": rid, "a": a, "b": b, "commit_a": ta.commit, "commit_b": tb.commit, "diff": text})
    sys.stdout.write((text or f"(no code change between #{a} and #{b})") + "\n")


@app.command()
def init(path: Path = typer.Argument(Path("."), help="Folder to make a workspace of.")) -> None:
    """Create a workspace: infergoal.toml and a copy of the seed knowledge base."""
    from orchestrator.config.workspace import CONFIG_NAME, PACKAGE_ROOT

    path.mkdir(parents=True, exist_ok=True)
    cfg = path / CONFIG_NAME
    if cfg.exists():
        fail(f"{cfg} already exists; edit it or choose another folder")
    cfg.write_text((PACKAGE_ROOT / "examples" / "infergoal.toml").read_text())
    kb = path / "knowledge_base"
    if not kb.exists():
        shutil.copytree(PACKAGE_ROOT / "knowledge_base", kb)
    console.print(f"workspace ready in {path.resolve()}: edit {CONFIG_NAME}, then `infergoal goal \"...\"`")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def bench(ctx: typer.Context) -> None:
    """Run one bench scenario against any OpenAI-compatible server (all options: `infergoal bench --help`).

    The same tool as `python -m orchestrator.bench`: --url, --model, --scenario, --scale, --tokenizer,
    --api, --out (vLLM/AIPerf/JSONL exports), --json, and per-field scenario overrides.
    """
    from orchestrator.bench.__main__ import main as bench_main

    raise typer.Exit(bench_main(ctx.args))


@model_app.command("make")
def model_make(
    out: Path = typer.Argument(..., help="Folder to write the model into."),
    preset: str = typer.Option("tiny", "--preset", help="Size preset (tiny, small, ...)."),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Write a local Hugging Face-format model (tokenizer trained on local text, weights trained briefly)."""
    from orchestrator.models import forge

    if preset not in forge.PRESETS:  # bad input, refused before anything is written
        fail(f"unknown preset {preset!r}; choose one of {', '.join(sorted(forge.PRESETS))} (see `infergoal model make --help`)")
    with err.status(f"making {preset} model in {out} ..."):
        path = forge.make_model(out, preset=preset, seed=seed)
    console.print(f"model written to {path}")


@gates_app.command("verify")
def gates_verify() -> None:
    """Check every gate file against gates.lock."""
    from gates.lock import GateTampered, verify

    try:
        verify()
    except GateTampered as e:
        fail(str(e), "gates_tampered")
    console.print("gates.lock: all gate files match")


@gates_app.command("relock")
def gates_relock(who: str = typer.Option("", "--who", help="Who accepts the change (default: the OS user).")) -> None:
    """Accept changed gate files: rewrite gates.lock and record it in the audit log."""
    from gates.lock import relock

    who = who or whoami()
    changed = relock(who)
    store = get_store()
    store.add_event(None, "gates.relock", f"gates relocked by {who}", data={"who": who, "changed": changed})
    console.print(f"gates.lock rewritten by {who}; changed: {', '.join(changed) or 'nothing'}")

