"""The step kinds of an experiment: serve, gate, profile, floors, script (ttb: ttb.py).

Each takes the command's context (runner.Ctx), the manifest and the step's parameters (manifest.SPEC), runs the
benchmark scripts beside this package, and leaves their results in $OUT (JSON) and their logs in $OUT/logs.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from benchmarks.gpu.tool.manifest import GPU, ROOT, Manifest, Step, servers
from benchmarks.gpu.tool.runner import Ctx

REL = GPU.relative_to(ROOT)
SHOWN = ("ready", "prefill", "decode", "throughput", "general", "rror", "failed")


def _script(name: str) -> str:
    return str(REL / name)


def serve(ctx: Ctx, m: Manifest, s: Step) -> int:
    """Variants side by side in one ib_baseline.py run (InferenceBench's scenarios A-D of ``scenarios``, or
    ``only`` those), within the command's limit less ``reserve_s``; then each step-logged server's decode gaps and
    the summary. Each server's log comes back in logs.tgz."""
    out = ctx.out / s["out"]
    stem = Path(s["out"]).stem
    argv = [_script("ib_baseline.py"), ctx.model(), "--out", str(out)]
    if not s["naive"]:
        argv.append("--no-naive")
    if s["only"]:
        argv += ["--only", s["only"]]
    if s["scenarios"] != "scenarios_ib.toml":
        argv += ["--scenarios", str(REL / s["scenarios"])]
    left = ctx.left(s["reserve_s"])
    deadline = s["deadline_s"] or left - 25
    argv += ["--deadline-s", str(deadline), "--ours-min-s", str(s["min_s"])]
    for label, var in servers(s):
        env = {}
        if label in s["step_log"]:
            env["HFSERVE_STEP_LOG"] = str(ctx.out / "logs" / f"steps_{label}.log")
        if label in s["profile"]:
            env["HFSERVE_PROFILE"] = str(ctx.out / "logs" / f"profile_{label}.txt")
        argv += ["--server", f"{label}={m.command(m.variant(var), before=label in s['before'], env=env)}"]
    labels = ", ".join(f"{lab}{' (.before)' if lab in s['before'] else ''}" for lab, _ in servers(s))
    ctx.log(f"serve {s['only'] or 'all of ' + s['scenarios']}: {labels} ({left}s)")
    if not ctx.dry:
        (ctx.out / "logs").mkdir(parents=True, exist_ok=True)
    log = ctx.out / "logs" / f"{stem}.log"
    rc = ctx.py(argv[0], *argv[1:], timeout=left, log=log)
    ctx.tail(log, 30, SHOWN)
    _keep_server_logs(ctx, out, stem)
    for label in s["step_log"]:
        steps = ctx.out / "logs" / f"steps_{label}.log"
        print(f"steps {label}:", flush=True)
        ctx.py(_script("step_gaps.py"), str(steps), "--min-batch", str(s["gaps_min_batch"]))
        if s["client_gaps"]:
            ctx.py(_script("step_gaps.py"), str(steps), "--client", f"{out}:{label}")
    ctx.py(_script("ab_summary.py"), str(out))
    return rc


def _keep_server_logs(ctx: Ctx, out: Path, stem: str) -> None:
    """The servers' logs of this run (the folder its JSON names) into $OUT/logs/STEM/."""
    if ctx.dry or not out.exists():
        return
    src = Path(json.loads(out.read_text()).get("logs", ""))
    if src.is_dir():
        shutil.copytree(src, ctx.out / "logs" / stem, dirs_exist_ok=True)


def gate(ctx: Ctx, m: Manifest, s: Step) -> int:
    """The accuracy gate on the GPU (gate_demo.py) for a variant's flags at the gate's batch: the honest server, and
    with ``honest_only = false`` a copy with its last layer dropped (which must fail); ``rejudge`` names another
    gate step's label: the loop's verdict of this one against it (gate_rejudge.py)."""
    var = m.variant(s["variant"])
    label = s["label"] or var.name
    left = ctx.left(s["reserve_s"])
    timeout = min(left, s["timeout_s"]) if s["timeout_s"] else left
    if not ctx.dry and timeout < 45:
        ctx.log(f"no time left for the gate on {label} ({left}s)")
        return 124
    out = ctx.out / f"gate_{label}.json"
    flags = re.sub(r"--max-batch-size \d+", f"--max-batch-size {ctx.gate_batch()}", var.flags)
    ctx.log(f"accuracy gate {label}: {flags} ({timeout}s)")
    argv = [_script("gate_demo.py"), ctx.model(), "--out", str(out), "--flags", flags]
    if s["honest_only"]:
        argv.append("--honest-only")
    rc = ctx.py(*argv, timeout=timeout, env=var.env, log=ctx.out / "logs" / f"gate_{label}.log")
    ctx.tail(ctx.out / "logs" / f"gate_{label}.log", 12)
    if not ctx.dry and out.exists():
        for key, r in json.loads(out.read_text()).items():
            if isinstance(r, dict) and "status" in r:
                mm = r.get("metrics") or {}
                shown = {k: round(mm[k], 6) for k in ("kl_mean", "mean_abs_dlogprob", "ppl_log_ratio",
                                                      "gen_nll_excess") if k in mm}
                print(f"gate {label} {key}: {r['status']} {shown}", flush=True)
    if s["rejudge"]:
        ctx.py(_script("gate_rejudge.py"), str(out), "--baseline", str(ctx.out / f"gate_{s['rejudge']}.json"))
    return rc


def profile(ctx: Ctx, m: Manifest, s: Step) -> int:
    """Each engine step's A-C parts under torch.profiler (profile_best.py --steps engine_steps.json; ``only``: those
    engine steps), the table and the %-of-floor plot; with ``db``: the best trial of that run database instead."""
    if s["db"]:
        argv = ["--db", s["db"], "--out", str(ctx.out / "profile.json")]
    else:
        argv = ["--steps", str(REL / "engine_steps.json"), "--out", str(ctx.out / "profile_steps.json"),
                "--md", str(ctx.out / "profile_steps.md"), "--plot", str(ctx.out / "profile_steps.svg")]
        if s["only"]:
            argv += ["--only", s["only"]]
    ctx.log(f"profile {'the best trial of ' + s['db'] if s['db'] else 'engine steps ' + (s['only'] or 'all')}")
    log = ctx.out / "logs" / "profile.log"
    rc = ctx.py(_script("profile_best.py"), ctx.model(), *argv, timeout=min(s["timeout_s"], ctx.left(5)), log=log)
    ctx.tail(log, 30)
    return rc


def floors(ctx: Ctx, m: Manifest, s: Step) -> int:
    """This card's speed-of-light floors (sol.py: copy bandwidth, bf16 matrix rate) for ``scenarios``, for the 7B's
    shape, or the forged model's config with ``model_config``."""
    argv = ["--scenarios", str(REL / s["scenarios"]), "--out", str(ctx.out / "sol.json")]
    if s["model_config"]:
        argv += ["--config", str(Path(ctx.model()) / "config.json")]
    ctx.log("this card's floors (sol.py)")
    log = ctx.out / "logs" / "sol.log"
    rc = ctx.py(_script("sol.py"), *argv, timeout=s["timeout_s"], log=log)
    ctx.tail(log, 25)
    return rc


def script(ctx: Ctx, m: Manifest, s: Step) -> int:
    """Any other benchmark script: ``args`` with {out} ($OUT), {model} (the forged model) and {root} filled."""
    fill: dict[str, Any] = {"out": ctx.out, "root": ROOT}
    args = [str(a) for a in s["args"]]
    if any("{model}" in a for a in args):
        fill["model"] = ctx.model()
    args = [a.format(**fill) for a in args]
    name = Path(s["script"]).stem
    ctx.log(f"{name} {' '.join(args)[:120]}")
    log = ctx.out / "logs" / f"{name}.log"
    rc = ctx.py(s["script"], *args, timeout=min(s["timeout_s"], max(ctx.left(5), 1)), env=s["env"], log=log)
    ctx.tail(log, s["tail"])
    return rc
