"""InferenceBench's naive server and our best server, on the full-size scenarios, in one command.

    python3 benchmarks/gpu/ib_baseline.py MODEL_DIR --out OUT/ib_baseline.json \\
        [--server 'fast=python3 examples/hfserve/server.py --model {model} --port {port} ...'] \\
        [--scenarios benchmarks/gpu/scenarios_ib.toml] [--naive-cap prefill=2,decode=2,throughput=4,general=4] \\
        [--no-naive] [--deadline-s 560] [--headline benchmarks/gpu/results/headline.json]

Each server (the ``--server`` ones in order, then IB's naive server, examples/ibnaive/server.py,
bf16, one request at a time) is started once, warmed with one short request at each prompt
length (so the first measured request pays no allocator or kernel-selection cost), run through
every scenario of the file with the project's bench (orchestrator/bench: token-id prompts,
outputs pinned with ignore_eos, counted by token id), and stopped. The JSON is rewritten after
every scenario, so a command cut short keeps what it measured.

How the naive server fits the budget: it is measured once, with fewer requests of the same
shapes (``--naive-cap``) and no per-scenario warmup (the pre-warm above does that work). At
IB's ~65 ms/token: A 2 x 8.6 s, B 2 x 33 s, C 4 x 8.4 s, D 4 x 17 s, about 3.5 minutes with the
model load. One request at a time makes C's throughput the same for a burst of 4 as of 64 (each
request waits for the ones before it), so 4 suffice; D with 4 requests at c4 gives the naive
server less queueing than 16 would (mean TTFT 1.5 requests' time instead of ~3), which flatters
it, so D's speedup is a lower bound. A and B are c1: their per-request numbers do not depend
on the count.

With ``--headline`` it also writes the headline figures (benchmarks/gpu/headline.py).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, Path(__file__).resolve().parent):  # the project, and headline.py beside this file
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from orchestrator.bench.loadgen import run_scenario_sync  # noqa: E402
from orchestrator.bench.scenarios import Scenario, load_scenarios_file  # noqa: E402
from orchestrator.hosts import LocalHost  # noqa: E402

NAIVE = "ib_naive"
NAIVE_CMD = ("{python} examples/ibnaive/server.py --model {model} --port {port} --device {device}"
             " --dtype bfloat16 --served-model-name {name}")
BEST_CMD = ("{python} examples/hfserve/server.py --model {model} --port {port} --device {device}"
            " --served-model-name {name} --dtype bfloat16 --engine fast --cuda-graphs on --batching on"
            " --max-batch-size 16 --max-model-len 4608")
DEFAULT_CAP = "prefill=2,decode=2,throughput=4,general=4"
KEPT = ("completed", "failed", "duration_s", "request_throughput", "output_throughput",
        "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_p50", "tpot_ms_p99",
        "itl_ms_mean", "itl_ms_p50", "e2e_ms_mean", "osl_mismatch", "osl_short", "osl_usage_missing",
        "osl_uncounted", "isl_mismatch", "total_output_tokens")


def parse_cap(text: str) -> dict[str, int]:
    """``name=N,name=N`` -> {name: N} (an empty string: no cap)."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, n = part.partition("=")
        out[name.strip()] = int(n)
    return out


def capped(scenarios: dict[str, Scenario], cap: dict[str, int]) -> dict[str, Scenario]:
    """The naive server's scenarios: same shapes, at most ``cap[name]`` requests, no warmup."""
    out = {}
    for name, sc in scenarios.items():
        n = min(sc.num_requests, cap.get(name, sc.num_requests))
        out[name] = sc.model_copy(update={"num_requests": n, "warmup_requests": 0})
    return out


def parse_server(text: str) -> tuple[str, str]:
    """``label=command template`` (placeholders {python} {model} {port} {device} {name})."""
    label, sep, cmd = text.partition("=")
    if not sep or not label.strip() or not cmd.strip():
        raise argparse.ArgumentTypeError("--server wants LABEL=COMMAND")
    return label.strip(), cmd.strip()


def command(template: str, fill: dict[str, str]) -> list[str]:
    """The argv of a server command template; ``{port}`` stays until a port is picked."""
    argv = shlex.split(template)
    for key, val in fill.items():
        argv = [a.replace("{" + key + "}", val) for a in argv]
    return argv


def summary(res: Any) -> dict[str, Any]:
    sc = res.scenario
    return {"prompt_tokens": sc.prompt_tokens, "output_tokens": sc.output_tokens, "num_requests": sc.num_requests,
            "concurrency": sc.concurrency, "warmup_requests": sc.warmup_requests, "ok": res.ok,
            "failures": dict(res.failures), "metrics": {k: res.metrics.get(k) for k in KEPT if k in res.metrics}}


def warm(url: str, name: str, tokenizer: str, lengths: list[int], timeout_s: float) -> None:
    """One short request per prompt length, results dropped."""
    for i, p in enumerate(sorted(set(lengths))):
        sc = Scenario(name=f"warm{p}", prompt_tokens=p, output_tokens=2, num_requests=1, concurrency=1,
                      warmup_requests=0, seed=1000 + i)
        run_scenario_sync(url, name, sc, tokenizer=tokenizer, timeout_s=timeout_s)


def measure_server(label: str, argv: list[str], scenarios: dict[str, Scenario], *, model: str, name: str,
                   report: dict[str, Any], out: Path, deadline: float, ready_s: float, log_dir: Path) -> None:
    """Start one server, run every scenario, stop it; fills ``report["servers"][label]``."""
    host = LocalHost(log_dir)
    port = host.free_port()
    argv = [a.replace("{port}", str(port)) for a in argv]
    entry: dict[str, Any] = {"command": shlex.join(argv), "scenarios": {}}
    report["servers"][label] = entry
    t0 = time.monotonic()
    proc = host.start(argv, env={"PYTHONUNBUFFERED": "1"}, cwd=str(ROOT), log_path=log_dir / f"{label}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        host.wait_healthy(url + "/health", ready_s, proc)
        entry["ready_s"] = round(time.monotonic() - t0, 2)
        print(f"[{label}] ready in {entry['ready_s']}s", flush=True)
        warm(url, name, model, [sc.prompt_tokens for sc in scenarios.values()], timeout_s=120)
        for sname, sc in scenarios.items():
            left = deadline - time.monotonic()
            if left < 20:
                entry["scenarios"][sname] = {"skipped": f"deadline ({left:.0f}s left)"}
                continue
            t1 = time.monotonic()
            res = run_scenario_sync(url, name, sc, tokenizer=model, timeout_s=min(300.0, left))
            entry["scenarios"][sname] = s = summary(res)
            s["wall_s"] = round(time.monotonic() - t1, 1)
            m = s["metrics"]
            print(f"[{label}] {sname}: {sc.num_requests} req {sc.prompt_tokens}/{sc.output_tokens} c{sc.concurrency}"
                  f" ok={res.ok} ttft_p50={m.get('ttft_ms_p50', 0):.1f}ms tpot_p50={m.get('tpot_ms_p50', 0):.2f}ms"
                  f" req/s={m.get('request_throughput', 0):.3f} tok/s={m.get('output_throughput', 0):.1f}"
                  f" ({s['wall_s']}s)", flush=True)
            out.write_text(json.dumps(report, indent=2) + "\n")
    except Exception as exc:  # a server that does not come up (or dies): say so in the JSON, go on
        entry["error"] = repr(exc)[:500]
        print(f"[{label}] failed: {exc!r}", flush=True)
    finally:
        host.stop(proc)
        entry["wall_s"] = round(time.monotonic() - t0, 1)
        out.write_text(json.dumps(report, indent=2) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="model directory (Hugging Face format)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--scenarios", default=str(Path(__file__).with_name("scenarios_ib.toml")))
    ap.add_argument("--server", action="append", type=parse_server, default=None,
                    help=f"LABEL=COMMAND, repeatable (default: fast={BEST_CMD!r})")
    ap.add_argument("--best-extra", default="", help="flags appended to the default best-setting command "
                    "(e.g. '--kernels triton --max-batch-size 32'; a later flag overrides an earlier one)")
    ap.add_argument("--no-naive", action="store_true", help="skip IB's naive server")
    ap.add_argument("--naive-cap", default=DEFAULT_CAP, help="most requests per scenario for the naive server")
    ap.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--deadline-s", type=float, default=560.0, help="start no scenario after this many seconds")
    ap.add_argument("--ready-s", type=float, default=300.0, help="how long a server may take to come up")
    ap.add_argument("--headline", default="", help="also write the headline figures to this JSON")
    ap.add_argument("--sol", default=str(Path(__file__).parent / "results" / "sol.json"))
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.deadline_s
    scenarios = load_scenarios_file(args.scenarios)
    if args.only:
        keep = {s.strip() for s in args.only.split(",")}
        scenarios = {k: v for k, v in scenarios.items() if k in keep}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="ib-baseline-"))
    name = "model"
    fill = {"python": args.python, "model": args.model, "device": args.device, "name": name}
    servers = args.server if args.server is not None else [("fast", f"{BEST_CMD} {args.best_extra}".strip())]
    report: dict[str, Any] = {"model": args.model, "scenarios_file": args.scenarios, "naive_cap": args.naive_cap,
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "logs": str(log_dir),
                              "servers": {}}
    try:
        import torch

        if torch.cuda.is_available():
            report["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    runs = [(label, cmd, scenarios) for label, cmd in servers]
    if not args.no_naive:
        runs.append((NAIVE, NAIVE_CMD, capped(scenarios, parse_cap(args.naive_cap))))
    for label, cmd, scs in runs:
        argv_ = command(cmd, fill)
        measure_server(label, argv_, scs, model=args.model, name=name, report=report, out=out,
                       deadline=deadline, ready_s=args.ready_s, log_dir=log_dir)
    if args.headline:
        from headline import write_headline  # beside this file

        ours = [label for label, _ in servers]
        if ours and not args.no_naive:
            h = write_headline(out, args.sol, args.scenarios, args.headline, server=ours[0])
            print(json.dumps(h, indent=2))
    return report


if __name__ == "__main__":
    main()
