"""The GPU tool: every GPU experiment by name, from the repository root of a (bare) GPU machine.

    python3 -m benchmarks.gpu.tool list                       # the experiments of benchmarks/gpu/experiments.toml
    python3 -m benchmarks.gpu.tool show NAME                  # its steps and the variants' server flags
    python3 -m benchmarks.gpu.tool run NAME [--limit S]       # run it (--dry-run: print the commands only)
    python3 -m benchmarks.gpu.tool serve lp s14 [--only decode] [--scenarios scenarios_c.toml]   # A-D side by side
    python3 -m benchmarks.gpu.tool gate s13 [--dropped]       # the accuracy gate on one variant's flags
    python3 -m benchmarks.gpu.tool profile [--only 4,5]       # each engine step under torch.profiler
    python3 -m benchmarks.gpu.tool floors                     # this card's speed-of-light floors
    python3 -m benchmarks.gpu.tool ttb --preset 7b-peaked --goal goal_4x.toml --cold --seed 0 [--limit 570]
    python3 -m benchmarks.gpu.tool check                      # the manifest holds together (exit 2 if not)

Results go to $OUT (default /tmp/out): at most 8 files, the logs packed into logs.tgz. Carry .whl
(benchmarks/gpu/wheels.py) on a bare machine; ``--limit`` is the command's own wall limit (default: the
experiment's ``limit_s``), kept inside the device's 600 s per command. A time-to-best run continues when
the same command runs again: on the same machine from its workspace (--ws-root), on a fresh one from the last
call's $OUT files put in .gpu-state/ (--state) and carried with the tree; a run continues only on the card it
started on (`infergoal resume` refuses other GPUs).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu.tool import manifest as mf
from benchmarks.gpu.tool import steps, ttb
from benchmarks.gpu.tool.runner import Ctx, Failed

KIND = {"serve": steps.serve, "gate": steps.gate, "profile": steps.profile, "floors": steps.floors,
        "script": steps.script}


def _common(ap: argparse.ArgumentParser, limit: int | None = 560) -> None:
    ap.add_argument("--limit", type=int, default=limit, help="this command's wall limit in seconds")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"), help="where results go (default $OUT)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter the benchmarks run in")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu.tool", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", default=str(mf.MANIFEST))
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the experiments")
    sub.add_parser("check", help="validate the manifest")
    p = sub.add_parser("show", help="one experiment's steps")
    p.add_argument("name")
    p = sub.add_parser("run", help="run a named experiment")
    p.add_argument("name")
    _common(p, None)
    p = sub.add_parser("serve", help="variants side by side over InferenceBench's scenarios A-D")
    p.add_argument("servers", nargs="+", metavar="[LABEL=]VARIANT")
    p.add_argument("--only", default="", help="scenario names, comma-separated (default: all)")
    p.add_argument("--scenarios", default="scenarios_ib.toml", help="a scenarios file in benchmarks/gpu/")
    p.add_argument("--min-s", type=int, default=60, help="seconds each server needs at least")
    p.add_argument("--step-log", action="store_true", help="log every server's decode steps (step_gaps.py)")
    p.add_argument("--naive", action="store_true", help="also InferenceBench's naive server")
    p.add_argument("--out-name", default="ib_ab.json")
    _common(p)
    p = sub.add_parser("gate", help="the accuracy gate on the GPU for one variant")
    p.add_argument("variant")
    p.add_argument("--dropped", action="store_true", help="also a copy missing its last layer (must fail)")
    _common(p)
    p = sub.add_parser("profile", help="each engine step's parts under torch.profiler")
    p.add_argument("--only", default="", help="engine step numbers, comma-separated")
    p.add_argument("--db", default="", help="profile this run database's best trial instead")
    _common(p, 300)
    p = sub.add_parser("floors", help="this card's speed-of-light floors (sol.py)")
    p.add_argument("--scenarios", default="scenarios_ib.toml")
    _common(p, 120)
    p = sub.add_parser("ttb", help="time to best: a goal run of the loop, resumable, then time_to_best.py")
    p.add_argument("--preset", default="7b-peaked", help="forge preset (orchestrator/models/forge.py)")
    p.add_argument("--goal", default="goal_4x.toml",
                   help="a goal file in benchmarks/gpu/, or best-known: TPOT and throughput bars made from "
                        "best_known.json's entry for this machine's GPU and the preset (8%% short of it)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cold", dest="kind", action="store_const", const="cold", help="no knowledge at all (default)")
    g.add_argument("--warm", dest="kind", action="store_const", const="warm", help="the seed and --kb-from's kb")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trials", type=int, default=0, help="the goal's trial budget (default: the goal file's)")
    p.add_argument("--wall", type=int, default=0, help="the goal's wall budget in seconds (default: the goal's)")
    p.add_argument("--name", default="", help="the run's name (default: from the parameters)")
    p.add_argument("--kb-from", default="", help="warm: a kb folder or kb.tgz to start from")
    p.add_argument("--host", choices=("local", "ssh"), default="local", help="ssh: through the carried sshd")
    p.add_argument("--scenarios", default="scenarios.toml")
    p.add_argument("--floors", default="results/sol.json", help="the ceilings under benchmarks/gpu/ ('': none); where they are another card's, this card's newest results/sol*.json")
    p.add_argument("--screen-fraction", type=float, default=0.25)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--target", default="examples/targets/hfserve_gpu.toml")
    p.add_argument("--best-known", default="best_known.json",
                   help="the best known setting's figures under benchmarks/gpu/ (time_to_best.py's (a) is against it)")
    p.add_argument("--paired-reserve", type=int, default=0,
                   help="set the goal's wall so the run ends this many seconds before the limit")
    p.set_defaults(kind="cold")
    _common(p, 570)
    for q in (sub.choices["run"], sub.choices["ttb"]):
        q.add_argument("--ws-root", default="/root", help="where the run's workspace lives")
        q.add_argument("--state", default=".gpu-state",
                       help="a carried folder with an earlier call's $OUT files: a fresh machine continues from it")
        q.add_argument("--extra-toml", default="", help="lines appended to the workspace's infergoal.toml")
    return ap


def _step(do: str, **params: Any) -> mf.Step:
    return mf.Step(do, {**mf.SPEC[do], **params})


def _ctx(a: argparse.Namespace, limit: int, preset: str = "7b-peaked") -> Ctx:
    return Ctx(out=Path(a.out), limit_s=limit, dry=a.dry_run, python=a.python, preset=preset)


def run_steps(ctx: Ctx, m: mf.Manifest, todo: list[mf.Step], a: argparse.Namespace) -> int:
    ctx.prepare()
    rc = 0
    try:
        for s in todo:
            if s.do == "ttb":
                r = ttb.ttb(ctx, dict(s.params), ws_root=Path(a.ws_root), state=Path(a.state),
                            extra_toml=a.extra_toml)
            else:
                if s.do != "floors":
                    ctx.preflight()
                r = KIND[s.do](ctx, m, s)
            rc = rc or r
    finally:
        kept = ctx.finish()
        if kept:
            print(f"$OUT ({ctx.out}): {' '.join(kept)}", flush=True)
        ctx.log("done")
    return rc


def show(m: mf.Manifest, name: str) -> None:
    e = m.experiment(name)
    print(f"{e.name} ({e.card or 'any card'}, {e.limit_s} s): {e.about}")
    for i, s in enumerate(e.steps, 1):
        shown = {k: v for k, v in s.params.items() if v != mf.SPEC[s.do][k] or mf.SPEC[s.do][k] is None}
        print(f"  {i}. {s.do} {shown}")
        names = [v for _, v in mf.servers(s)] if s.do == "serve" else [s["variant"]] if s.do == "gate" else []
        for v in dict.fromkeys(names):
            var = m.variant(v)
            env = ''.join(f'{k}={x} ' for k, x in var.env.items())
            print(f"       {v}: {env}{var.flags}")


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        m = mf.load(Path(a.manifest))
        if a.cmd == "check":
            print(f"{a.manifest}: {len(m.variants)} variants, {len(m.experiments)} experiments hold together")
            return 0
        if a.cmd == "list":
            width = max(map(len, m.experiments))
            for e in m.experiments.values():
                kinds = "+".join(dict.fromkeys(s.do for s in e.steps))
                print(f"{e.name:<{width}}  {kinds:<18} {e.card or 'any':<5} {e.about}")
            return 0
        if a.cmd == "show":
            show(m, a.name)
            return 0
        if a.cmd == "run":
            e = m.experiment(a.name)
            presets = [s["preset"] for s in e.steps if s.do == "ttb"]
            ctx = _ctx(a, a.limit or e.limit_s, presets[0] if presets else "7b-peaked")
            ctx.log(f"experiment {e.name}: {e.about}")
            return run_steps(ctx, m, list(e.steps), a)
        if a.cmd == "serve":
            for s in a.servers:
                m.variant(s.partition("=")[2] or s)
            labels = [s.partition("=")[0] for s in a.servers]
            todo = [_step("serve", servers=a.servers, only=a.only, scenarios=a.scenarios, min_s=a.min_s,
                          out=a.out_name, naive=a.naive, step_log=labels if a.step_log else [])]
            return run_steps(_ctx(a, a.limit), m, todo, a)
        if a.cmd == "gate":
            m.variant(a.variant)
            return run_steps(_ctx(a, a.limit), m, [_step("gate", variant=a.variant, honest_only=not a.dropped)], a)
        if a.cmd == "profile":
            return run_steps(_ctx(a, a.limit), m, [_step("profile", only=a.only, db=a.db, timeout_s=a.limit)], a)
        if a.cmd == "floors":
            return run_steps(_ctx(a, a.limit), m, [_step("floors", scenarios=a.scenarios)], a)
        if a.cmd == "ttb":
            p = dict(preset=a.preset, goal=a.goal, kind=a.kind, seed=a.seed, trials=a.trials, wall_s=a.wall,
                     name=a.name, kb_from=a.kb_from, host=a.host, scenarios=a.scenarios, floors=a.floors,
                     screen_fraction=a.screen_fraction, repeats=a.repeats, target=a.target,
                     paired_reserve_s=a.paired_reserve, best_known=a.best_known)
            if (miss := mf.missing_file(p)) is not None:
                key, value, under = miss
                raise mf.ManifestError(f"--{key} {value}: no such file under {under}")
            return run_steps(_ctx(a, a.limit, a.preset), m, [_step("ttb", **p)], a)
    except (mf.ManifestError, Failed) as exc:
        print(f"gpu tool: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
