"""Time to best on the GPU: a goal run of the loop in a workspace of its own, then time_to_best.py over its database.

One command on a bare machine (from the repository root): the wheels in, the model forged (not on the clock),
a workspace ``WS_ROOT/NAME`` made (the target with ``model = "forge:PRESET"``, the goal with the trials and wall
given, infergoal.toml with the seed, the scenarios, the floors), then ``infergoal goal`` until the command's
limit less a margin (stopped by SIGINT: the run writes its best kept trial to the knowledge base), and the
database, the knowledge base and the figures to $OUT. The same command again continues the run: on the same
(warm) machine from its workspace, on a fresh one from ``--state`` (a folder carried with the tree holding an
earlier call's $OUT files: NAME.db, NAME.kb.tgz). A finished run is not started again.

``cold``: the run reads no knowledge at all (``kb_seed = false``, an empty kb). ``warm``: the shipped seed's
findings and the kb of ``--kb-from`` (a folder or a kb.tgz of an earlier run). The clock (time_to_best.py) counts
only the seconds a session of the run was live, so a run continued on another machine adds its own.

``--goal best-known``: the goal is made on the machine from best_known.json's entry for its GPU (nvidia-smi's name)
and the preset: TPOT p50 and throughput in absolute terms, each at the best known setting's value less
BEST_GOAL_SLACK. goal_best.toml's ratio bars are also met by settings 8-17% under the best (the naive baseline they
divide by moves ~25% between runs), so such a run can stop at GoalMet before the best; under these bars only a
setting near the best known meets the goal, and the paired GoalMet confirms one. A card or preset with no entry
runs goal_best.toml instead, said in one line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from benchmarks.gpu.tool.manifest import BEST_GOAL, GPU, ROOT
from benchmarks.gpu.tool.runner import Ctx, Failed

BEST_GOAL_FALLBACK = "goal_best.toml"
# Each bar: the best known value less 8%. The H200's best known setting's own paired rounds measured down to 5.5%
# under its screened throughput (1432 against 1515.8 tok/s), and GoalMet wants the bar met in every round.
BEST_GOAL_SLACK = 0.08
LOOP_MARGIN_S = 45  # after the loop: the database, the figures, $OUT
INT_GRACE_S = 25  # SIGINT, then SIGKILL this much later (a run stopped by SIGINT writes its kb finding first)


def run_name(p: dict[str, Any]) -> str:
    """The run's (and its workspace's) name: its parameters, so one command always finds its own run again."""
    if p["name"]:
        return p["name"]
    goal = Path(p["goal"]).stem.removeprefix("goal_").removeprefix("goal")
    return f"ttb-{p['kind']}-{p['preset']}{'-' + goal if goal else ''}-s{p['seed']}{'-ssh' if p['host'] == 'ssh' else ''}"


def run_state(db: Path) -> str:
    """``none`` (no run in the database), ``open`` (a run to resume), ``failed`` or ``finished``."""
    if not db.exists():
        return "none"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("select status from runs").fetchall()
    except sqlite3.Error:
        return "none"
    finally:
        con.close()
    if not rows:
        return "none"
    status = {r[0] for r in rows}
    return "open" if status - {"finished", "failed"} else "failed" if "failed" in status else "finished"


def _abs_source(text: str, folder: Path) -> str:
    """A target's relative ``source`` made absolute (it is relative to the target's own folder)."""
    return re.sub(r'^source = "([^/"][^"]*)"', lambda mm: f'source = "{(folder / mm.group(1)).resolve()}"', text,
                  flags=re.M)


def best_known_goal(best: dict[str, Any], card: str, preset: str, slack: float = BEST_GOAL_SLACK) -> str | None:
    """A goal file's text whose bars are the best known setting of ``card`` and ``preset`` (best_known.json's entry,
    its measured TPOT p50 and throughput) less ``slack``, in absolute terms; None where no entry has both values."""
    for e in best.get("entries", []):
        vals = e.get("objectives") or {}
        tpot, thr = vals.get("decode:tpot_ms_p50"), vals.get("throughput:output_throughput")
        if e.get("card") == card and e.get("preset") == preset and tpot and thr:
            t_bar, r_bar = round(tpot * (1 + slack), 2), round(thr * (1 - slack), 1)
            return (f'# Made by the GPU tool from best_known.json ({card}, {preset}: {tpot:g} ms, {thr:g} tok/s), '
                    f'each bar {slack:.0%} short of it.\n'
                    f'text = "TPOT p50 at most {t_bar} ms and throughput at least {r_bar} tok/s (the best known setting '
                    f'on this card less {slack:.0%}) within 20 trials, every kept trial inside the accuracy gate"\n\n'
                    f'[[objectives]]\nmetric = "tpot"\nstat = "p50"\nkind = "absolute"\nvalue = {t_bar}\n\n'
                    f'[[objectives]]\nmetric = "throughput"\nkind = "absolute"\nvalue = {r_bar}\n\n'
                    f'[[constraints]]\nkind = "accuracy"\nmode = "gated"\n\n'
                    f'[budget]\ntrials = 20\nwall = "6h"\nstall_trials = 30\n')
    return None


def goal_text(ctx: Ctx, p: dict[str, Any]) -> str:
    """The run's goal file text: ``p["goal"]`` under benchmarks/gpu/, or for ``best-known`` the goal made from the
    entry of this machine's GPU (goal_best.toml where there is none)."""
    if p["goal"] != BEST_GOAL:
        return (GPU / p["goal"]).read_text()
    card = ctx.gpu_name()
    text = best_known_goal(json.loads((GPU / (p["best_known"] or "best_known.json")).read_text()), card, p["preset"])
    if text is None:
        ctx.log(f"no best known setting for {card or 'this GPU'} / {p['preset']} in best_known.json: "
                f"the run's goal is {BEST_GOAL_FALLBACK}")
        return (GPU / BEST_GOAL_FALLBACK).read_text()
    ctx.log(f"goal from best_known.json for {card} / {p['preset']}: {text.splitlines()[1]}")
    return text


def workspace(ws: Path, p: dict[str, Any], *, host_line: str = "", extra_toml: str = "",
              floors: Path | None = None, goal: str | None = None) -> None:
    """The run's target, goal and infergoal.toml in ``ws`` (rewritten each call: the same parameters); ``floors``:
    the floors file the run reads (default: ``p["floors"]`` under benchmarks/gpu/); ``goal``: the goal file's text
    (default: ``p["goal"]``'s)."""
    (ws / ".infergoal").mkdir(parents=True, exist_ok=True)
    target = ROOT / p["target"]
    text = re.sub(r"^model = .*$", f'model = "forge:{p["preset"]}"', target.read_text(), count=1, flags=re.M)
    text = re.sub(r'^name = "(.*)"$', rf'name = "\1-{p["preset"]}"', text, count=1, flags=re.M)
    (ws / "target.toml").write_text(_abs_source(text, target.parent))
    goal = goal if goal is not None else (GPU / p["goal"]).read_text()
    if p["trials"]:  # the budget, and the goal's text where it names one (the run's records and findings quote it)
        goal = re.sub(r"^trials = .*$", f"trials = {p['trials']}", goal, flags=re.M)
        goal = re.sub(r'^(text = ".*?within )\d+ trials', rf"\g<1>{p['trials']} trials", goal, count=1, flags=re.M)
    if p["wall_s"]:
        goal = re.sub(r"^wall = .*$", f'wall = "{p["wall_s"]}s"', goal, flags=re.M)
    (ws / "goal.toml").write_text(goal)
    lines = [host_line, f'target = "{ws / "target.toml"}"', 'proposer = "search"', f"seed = {p['seed']}",
             'kb = "kb"', f"kb_seed = {'false' if p['kind'] == 'cold' else 'true'}", "[bench]",
             f"repeats = {p['repeats']}", f"baseline_repeats = {p['repeats']}", "timeout_s = 300",
             f"screen_fraction = {p['screen_fraction']}"]
    if p["scenarios"]:
        lines.append(f'scenarios = "{GPU / p["scenarios"]}"')
    if p["floors"]:
        lines.append(f'floors = "{floors or GPU / p["floors"]}"')
    (ws / "infergoal.toml").write_text("\n".join(x for x in lines if x) + "\n" + extra_toml)


def _unpack_kb(src: Path, dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        with tarfile.open(src) as t:
            t.extractall(dst.parent, filter="data")  # the archive holds kb/


def restore(ctx: Ctx, ws: Path, name: str, state: Path, kb_from: str, kind: str) -> None:
    """A fresh workspace gets the earlier call's database (``state/NAME.db``) and kb, or for a warm run the kb of
    ``kb_from``; a workspace with a database is left as it is (the same machine, still warm)."""
    db = ws / ".infergoal" / "infergoal.db"
    if db.exists():
        ctx.log(f"workspace {ws}: its database is here ({run_state(db)} run)")
        return
    if (state / f"{name}.db").exists():
        shutil.copy(state / f"{name}.db", db)
        ctx.log(f"database restored from {state / (name + '.db')} ({run_state(db)} run)")
        if (state / f"{name}.kb.tgz").exists():
            _unpack_kb(state / f"{name}.kb.tgz", ws / "kb")
        return
    if kind == "warm":
        src = Path(kb_from) if kb_from else None
        if src and not src.is_absolute():
            src = ROOT / src
        if src and src.exists():
            _unpack_kb(src, ws / "kb")
            ctx.log(f"kb from {src}")
        else:
            ctx.log("no kb to start from: the warm run reads the shipped seed's findings only")
    else:
        shutil.rmtree(ws / "kb", ignore_errors=True)


def ttb(ctx: Ctx, p: dict[str, Any], *, ws_root: Path, state: Path, extra_toml: str = "") -> int:
    """The time-to-best run (see the module's docstring); its exit status is the loop's."""
    name = run_name(p)
    ws = ws_root / name
    ctx.preflight()
    model = ctx.model()
    if not ctx.dry:
        info = Path(model) / "infergoal_model.json"
        if info.exists():  # how well the forge trained it (a flat model makes the accuracy gate meaningless)
            built = json.loads(info.read_text())
            print({k: built.get(k) for k in ("final_loss", "heldout_top1_prob", "build_seconds")}, flush=True)
    host_line, sshd = "", None
    if p["host"] == "ssh":
        host_line = f'host = "{SSH_HOST}"'
    after = LOOP_MARGIN_S + INT_GRACE_S + p["reserve_s"]  # the reserve: the experiment's steps after this one
    if p["paired_reserve_s"] and not p["wall_s"]:  # end on its own budget, the paired confirmation inside the limit
        p = {**p, "wall_s": max(60, ctx.left(after + p["paired_reserve_s"]))}
    floors = model_floors(ctx, ws, model, p) if p["floors"] else None
    if not ctx.dry:
        workspace(ws, p, host_line=host_line, extra_toml=extra_toml, floors=floors, goal=goal_text(ctx, p))
        restore(ctx, ws, name, state, p["kb_from"], p["kind"])
    db = ws / ".infergoal" / "infergoal.db"
    state_now = "none" if ctx.dry else run_state(db)
    rc = 0
    try:
        if p["host"] == "ssh" and not ctx.dry:
            sshd = ssh_up(ctx, ws, ws_root)
        if state_now == "finished":
            ctx.log(f"the run {name} finished: nothing to continue")
        elif state_now == "failed":
            ctx.log(f"the run {name} failed (its report and loop.log say why): nothing to continue; another "
                    "--seed or --name starts a new run")
            rc = 1
        else:
            cmd = ["goal", str(ws / "goal.toml"), "--name", name] if state_now == "none" else ["resume"]
            left = ctx.left(after)
            if not ctx.dry and left <= 60:
                raise Failed(f"no time left for the loop ({left}s): give a longer --limit")
            ctx.log(f"loop in {ws}: infergoal {' '.join(cmd)} for {left}s")
            rc = ctx.sh([ctx.python, "-m", "orchestrator.cli", *cmd], timeout=left, signal="INT", cwd=ws,
                        log=ctx.out / "loop.log")
            if rc == 124:  # stopped at this command's limit, as planned: not a failure of the command
                ctx.log("loop stopped at the limit; the same command again continues the run")
                rc = 0
            else:
                ctx.log(f"loop exit {rc}")
            ctx.tail(ctx.out / "loop.log", 25)
    finally:
        if sshd is not None:
            ssh_down(ctx, sshd, ws_root)
    ctx.sh([ctx.python, "-m", "orchestrator.cli", "trials"], cwd=ws, log=ctx.out / "trials.txt")
    ctx.tail(ctx.out / "trials.txt", 30)
    collect(ctx, ws, name, p["kind"], GPU / p["best_known"] if p["best_known"] else None)
    return rc


def _ceilings_card(path: Path) -> str:
    try:
        return str(json.loads(path.read_text())["ceilings"].get("gpu", ""))
    except (OSError, ValueError, KeyError, AttributeError):
        return ""


def card_ceilings(ctx: Ctx, given: str) -> Path:
    """The ceilings the floors are made from: ``given`` (under benchmarks/gpu/) where they were measured on this
    machine's card (or its card is unknown); else the newest ``results/sol*.json`` measured on this card (what
    `tool run floors` writes), said in one line; else ``given``, with a line saying whose ceilings they are."""
    path, card = GPU / given, ctx.gpu_name()
    theirs = _ceilings_card(path)
    if not card or not theirs or theirs == card:
        return path
    mine = [f for f in (GPU / "results").glob("sol*.json") if _ceilings_card(f) == card]
    if mine:
        newest = max(mine, key=lambda f: (re.findall(r"\d{4}-\d\d-\d\d\w?", f.name) or [""])[0])
        ctx.log(f"{given} holds the {theirs}'s ceilings: this {card}'s are {newest.relative_to(GPU)}")
        return newest
    ctx.log(f"{given} holds the {theirs}'s ceilings and no results/sol*.json holds this {card}'s: the floors are the "
            f"{theirs}'s (`tool run floors` on this card measures its own)")
    return path


def model_floors(ctx: Ctx, ws: Path, model: str, p: dict[str, Any]) -> Path | None:
    """``ws/floors.json``: the floors of this card's ceilings (copy bandwidth and matrix rate; ``card_ceilings``:
    ``p["floors"]``'s where they are this card's) for the forged model's own shape (sol.py --config --ceilings), so
    the speed-of-light check judges every preset's trials (it checks only a trial whose model has the recorded
    shape: the 7B's floors never judge the 3B). None, said in one line, when they cannot be made: the run then
    reads ``p["floors"]`` as given."""
    out = ws / "floors.json"
    if not ctx.dry:
        ws.mkdir(parents=True, exist_ok=True)
    ceilings = card_ceilings(ctx, p["floors"])
    argv = ["--config", str(Path(model) / "config.json"), "--ceilings", str(ceilings), "--out", str(out)]
    if p["scenarios"]:
        argv += ["--scenarios", str(GPU / p["scenarios"])]
    rc = ctx.py(str((GPU / "sol.py").relative_to(ROOT)), *argv, timeout=60, log=ctx.out / "logs" / "floors.log")
    if rc != 0 or not (ctx.dry or out.exists()):
        ctx.log(f"no floors for {p['preset']}'s shape (sol.py exit {rc}; logs/floors.log): the run reads {p['floors']}")
        return None
    shown = ceilings.relative_to(GPU) if ceilings.is_relative_to(GPU) else ceilings
    ctx.log(f"floors for {p['preset']}'s shape from {shown}'s ceilings -> {out}")
    return out


def collect(ctx: Ctx, ws: Path, name: str, kind: str, best_known: Path | None) -> None:
    """$OUT: NAME.db (a consistent copy), NAME.kb.tgz, time_to_best.json (only against a best known setting); in
    logs/ where each deploy's seconds went and the end of every server log with a traceback."""
    db = ws / ".infergoal" / "infergoal.db"
    out_db = ctx.out / f"{name}.db"
    if ctx.dry:
        print(f"$ copy {db} -> {out_db}; {ws / 'kb'} -> {ctx.out / (name + '.kb.tgz')}", flush=True)
    elif db.exists():
        src, dst = sqlite3.connect(db), sqlite3.connect(out_db)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
        if (ws / "kb").is_dir():
            with tarfile.open(ctx.out / f"{name}.kb.tgz", "w:gz") as t:
                t.add(ws / "kb", arcname="kb")
        logs = ctx.out / "logs"
        logs.mkdir(exist_ok=True)
        keys = ("hfserve: startup", "hfserve: engine", "hfserve: captured", "hfserve: loaded", "infergoal: standby")
        with (logs / "startup.txt").open("w") as st, (logs / "server_errors.txt").open("w") as er:
            for f in sorted((ws / ".infergoal" / "runs").glob("*/trial-*/server.log")):
                text = f.read_text(errors="replace")
                st.writelines(f"{f}:{ln}\n" for ln in text.splitlines() if any(k in ln for k in keys))
                if "Traceback" in text:
                    er.write(f"== {f}\n" + "\n".join(text.splitlines()[-40:]) + "\n")
    if best_known is None:
        ctx.log("no best known setting for this target: time_to_best.py not run")
    elif ctx.dry or out_db.exists():
        ctx.py(str((GPU / "time_to_best.py").relative_to(ROOT)), str(out_db), "--kind", kind,
               "--best-known", str(best_known.relative_to(ROOT)), "--headline", str(ctx.out / "time_to_best.json"))


# -- the loop's trials through SSH on this machine's loopback (benchmarks/gpu/ssh_host.sh: the carried sshd) ---
SSH_HOST = "gpu-ssh"


def ssh_up(ctx: Ctx, ws: Path, ws_root: Path) -> int:
    """Start the carried OpenSSH server (.sshd/, benchmarks/gpu/sshd_bundle.sh builds it) and register it in the
    workspace as host SSH_HOST; its pid."""
    pidfile = ws_root / "sshd.pid"
    script = ('log() { echo "$*"; }; . benchmarks/gpu/ssh_host.sh; ssh_host_up "$1" || exit 1; '
              'echo "$SSHD_PID" > "$2"')
    env = {"ROOT": str(ROOT), "WS_ROOT": str(ws_root), "PY": ctx.python, "OUT": str(ctx.out / "logs"),
           "WHEELS_SITE": "/tmp/site" if (ROOT / ".whl").is_dir() else "", "SSH_HOST_NAME": SSH_HOST}
    (ctx.out / "logs").mkdir(parents=True, exist_ok=True)
    rc = subprocess.run(["bash", "-c", script, "ssh_host", str(ws), str(pidfile)], cwd=ROOT,
                        env={**os.environ, **ctx.env, **env}).returncode
    if rc != 0 or not pidfile.exists():
        raise Failed("the SSH host did not come up (its log above)")
    return int(pidfile.read_text())


def ssh_down(ctx: Ctx, pid: int, ws_root: Path) -> None:
    """Stop the sshd and its sessions; its log and the leases it held to $OUT/logs."""
    subprocess.run(["pkill", "-TERM", "-P", str(pid)], check=False)
    subprocess.run(["kill", str(pid)], check=False)
    run = ws_root / "sshd-run"
    if (run / "sshd.log").exists():
        shutil.copy(run / "sshd.log", ctx.out / "logs" / "sshd.log")
    if (run / "leases").is_dir():
        (ctx.out / "logs" / "ssh_leases.txt").write_text("\n".join(sorted(p.name for p in (run / "leases").iterdir())))

