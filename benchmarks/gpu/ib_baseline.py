"""InferenceBench's naive server and our best server, on the full-size scenarios, in one command.

    python3 benchmarks/gpu/ib_baseline.py MODEL_DIR --out OUT/ib_baseline.json \\
        [--server 'fast=python3 examples/hfserve --model {model} --port {port} ...'] \\
        [--scenarios benchmarks/gpu/scenarios_ib.toml] [--naive-cap prefill=2,decode=2,throughput=4,general=4] \\
        [--no-naive] [--deadline-s 560] [--naive-budget-s 200] [--headline benchmarks/gpu/results/headline.json]

Each server (the ``--server`` ones in order, then IB's naive server, examples/ibnaive/server.py,
bf16, one request at a time) is started once, warmed with one short request at each prompt
length (so the first measured request pays no allocator or kernel-selection cost), run through
every scenario of the file with the project's bench (orchestrator/bench: token-id prompts,
outputs pinned with ignore_eos, counted by token id), and stopped. The JSON is rewritten after
every scenario, so a command cut short keeps what it measured.

How the naive server fits the budget: its time is set aside up front (``--naive-budget-s``, taken
off the end of ``--deadline-s``: our servers get the rest, the naive one its own window after them),
and its request count per scenario is planned to fit that window (:func:`plan_naive`) from its
measured speed (H200, 7B, bf16, 2026-12-02: TPOT 74-91 ms, TTFT 190 ms at 4096 tokens): each
scenario gets one request first, so all four (D included, which the run before ran out of time for)
are always measured, then one more each in turn (cheapest first) while the window holds, up to
``--naive-cap``. At 200 s (160 s of requests after 40 s of start-up) that is A 2, B 1, C 3, D 2:
~152 s. The counts, each scenario's planned seconds and
a 95% interval per metric (t interval over the requests; B's TPOT from one request's inter-token
gaps) go in the JSON beside the numbers, as InferenceBench's scenarios allow fewer requests when
they are stated. One request at a time makes C's throughput the same for a burst of 3 as of 64
(each request waits for the ones before it); D with 2 requests at c4 gives the naive server less
queueing than 16 would, which flatters it, so D's speedup is a lower bound. A and B are c1: their
per-request numbers do not depend on the count.

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

from orchestrator.bench.loadgen import run_scenario_sync  # noqa: E402
from orchestrator.bench.scenarios import Scenario, load_scenarios_file  # noqa: E402
from orchestrator.hosts import LocalHost  # noqa: E402

NAIVE = "ib_naive"
NAIVE_CMD = ("{python} examples/ibnaive/server.py --model {model} --port {port} --device {device}"
             " --dtype bfloat16 --served-model-name {name}")
BEST_CMD = ("{python} examples/hfserve --model {model} --port {port} --device {device}"
            " --served-model-name {name} --dtype bfloat16 --engine fast --cuda-graphs on --batching on"
            " --max-batch-size 16 --max-model-len 4608")
DEFAULT_CAP = "prefill=2,decode=2,throughput=4,general=4"
# The naive server's speed (H200, 7B shape, bf16; benchmarks/gpu/results/ib_baseline.json of
# 2026-12-02, rounded up): seconds per output token, per prompt token, per request.
NAIVE_S_PER_OUT, NAIVE_S_PER_IN, NAIVE_S_FIXED = 0.09, 5e-5, 0.2
NAIVE_START_S = 40.0  # model load (20 s measured) and the warm requests
NAIVE_MIN_S = NAIVE_START_S + 60.0  # the naive server's smallest useful window: one request per scenario
# Our server's window: 44 s to ready (42 CUDA graphs at 64 slots, H200 2026-12-02), warm-up and ~47 s of
# scenarios. On 2026-12-02 it got 70 s and every scenario was skipped; the naive window now yields to it.
OURS_MIN_S = 120.0
# Two-sided 95% t quantiles by degrees of freedom (beyond the table: the normal 1.96).
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
        15: 2.13, 20: 2.09, 30: 2.04}
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


def naive_request_s(sc: Scenario) -> float:
    """Seconds one request of ``sc`` takes on the naive server (one at a time, so requests add up)."""
    return NAIVE_S_FIXED + sc.prompt_tokens * NAIVE_S_PER_IN + sc.output_tokens * NAIVE_S_PER_OUT


def plan_naive(scenarios: dict[str, Scenario], budget_s: float, cap: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Request counts for the naive server within ``budget_s`` seconds of measuring.

    Every scenario gets one request, whatever the budget (a scenario left out makes the geometric
    mean undefined); then, round after round, cheapest request first, each gets one more while its
    planned seconds still fit and it is under ``cap`` (B's one 512-token request already gives 511
    inter-token gaps; C's and D's counts change what their scores see). Returns {name: {num_requests,
    est_s, request_s}} in the file's order.
    """
    per = {n: naive_request_s(sc) for n, sc in scenarios.items()}
    most = {n: min(sc.num_requests, cap.get(n, sc.num_requests)) for n, sc in scenarios.items()}
    count = {n: 1 for n in scenarios}
    used = sum(per.values())
    grew = True
    while grew:
        grew = False
        for n in sorted(scenarios, key=per.__getitem__):
            if count[n] < most[n] and used + per[n] <= budget_s:
                count[n] += 1
                used += per[n]
                grew = True
    return {n: {"num_requests": count[n], "est_s": round(count[n] * per[n], 1), "request_s": round(per[n], 2)}
            for n in scenarios}


def window_for_naive(deadline_s: float, naive_budget_s: float, ours_need_s: float) -> float:
    """The naive server's window: as asked, or shrunk so that our servers keep ``ours_need_s``.

    Refuses (SystemExit, one line) a deadline that cannot hold both: no GPU time is spent on a run
    whose speedups cannot be computed.
    """
    if deadline_s - naive_budget_s >= ours_need_s:
        return naive_budget_s
    shrunk = deadline_s - ours_need_s
    if shrunk < NAIVE_MIN_S:
        raise SystemExit(f"ib_baseline: --deadline-s {deadline_s:.0f} is too short: our server(s) need "
                         f"{ours_need_s:.0f} s and the naive server at least {NAIVE_MIN_S:.0f} s; give it "
                         f"{ours_need_s + NAIVE_MIN_S:.0f} s or more (run it without the steps before it)")
    print(f"naive window {naive_budget_s:.0f} s -> {shrunk:.0f} s so that our server(s) keep {ours_need_s:.0f} s",
          flush=True)
    return shrunk


def ci95(values: list[float]) -> dict[str, Any]:
    """Mean and two-sided 95% t interval of ``values`` (no interval from fewer than two)."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "lo": None, "hi": None}
    mean = sum(values) / n
    if n < 2:
        return {"n": 1, "mean": mean, "lo": None, "hi": None}
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    t = _T95.get(n - 1) or next((q for df, q in sorted(_T95.items()) if df >= n - 1), 1.96)
    half = t * sd / n ** 0.5
    return {"n": n, "mean": mean, "lo": mean - half, "hi": mean + half}


def request_cis(requests: list[Any]) -> dict[str, Any]:
    """95% intervals of TTFT, TPOT and request throughput from the per-request records.

    TPOT: over the requests' TPOTs, or with one request over its inter-token gaps. Request
    throughput: 1 / service time, a request's service time being the time from when the server
    could start it (sent, or the one before it finished) to its last token; exact for a server
    that takes one request at a time (the naive one), an upper bound on the interval otherwise.
    """
    ok = sorted((r for r in requests if r.success and r.t_first_token_ns and r.t_last_token_ns),
                key=lambda r: r.t_sent_ns)
    ttft = [(r.t_first_token_ns - r.t_sent_ns) / 1e6 for r in ok]
    # Per token, as the scenario's own TPOT metric counts it (the output's token count, not its chunks:
    # a text streamer's chunk can carry several tokens; counting chunks inflated the naive server's TPOT).
    tpot = [r.tpot_ns / 1e6 for r in ok if r.tpot_ns is not None]
    tpot_from = "requests"
    if len(tpot) == 1:
        one = next(r for r in ok if r.tpot_ns is not None)
        if len(one.chunk_ns) == one.osl:  # one chunk per token: the gaps are inter-token times
            tpot = [(b - a) / 1e6 for a, b in zip(one.chunk_ns, one.chunk_ns[1:], strict=False)]
            tpot_from = "inter-token gaps of one request"
        else:
            tpot_from = "one request (its chunks carry several tokens: no interval)"
    service, free = [], 0
    for r in ok:
        begin = max(r.t_sent_ns, free)
        service.append((r.t_last_token_ns - begin) / 1e9)
        free = r.t_last_token_ns
    s = ci95(service)
    rps = {"n": s["n"], "mean": 1 / s["mean"] if s["mean"] else None,
           "lo": 1 / s["hi"] if s["hi"] and s["hi"] > 0 else None, "hi": 1 / s["lo"] if s["lo"] and s["lo"] > 0 else None}
    return {"ttft_ms": ci95(ttft), "tpot_ms": ci95(tpot), "request_throughput": rps, "tpot_from": tpot_from}


def request_clock(requests: list[Any], origin_ns: int) -> dict[str, Any]:
    """Each request's send, first-token and last-token times, ms after the bench's start (``origin_s``, the client's
    ``perf_counter``: CLOCK_MONOTONIC on Linux, the clock a server's HFSERVE_STEP_LOG on this host writes), in
    request order; None where it never came. benchmarks/gpu/step_gaps.py --client sets them beside the server's log."""
    rs = sorted(requests, key=lambda r: r.index)
    ms = lambda t: None if not t else round((t - origin_ns) / 1e6, 2)  # noqa: E731
    return {"origin_s": origin_ns / 1e9, "sent_ms": [ms(r.t_sent_ns) for r in rs],
            "first_ms": [ms(r.t_first_token_ns) for r in rs], "last_ms": [ms(r.t_last_token_ns) for r in rs]}


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
            s["ci95"] = request_cis(res.requests)
            if "origin_ns" in res.meta:
                s["clock"] = request_clock(res.requests, res.meta["origin_ns"])
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
    ap.add_argument("--naive-budget-s", type=float, default=200.0,
                    help="seconds set aside at the end of --deadline-s for the naive server (load, warm-up, "
                         "every scenario); its request counts are planned to fit (plan_naive)")
    ap.add_argument("--ours-min-s", type=float, default=OURS_MIN_S,
                    help="seconds each of our servers needs (start, CUDA graphs, warm-up, every scenario): "
                         "the naive window shrinks to leave them this much, and a deadline too short for both "
                         "is refused before any server starts")
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
    naive_at = deadline  # our servers stop starting scenarios here; the naive one has its window after
    runs = [(label, cmd, scenarios) for label, cmd in servers]
    need = args.ours_min_s * len(servers)
    if not args.no_naive:
        args.naive_budget_s = window_for_naive(args.deadline_s, args.naive_budget_s, need)
        naive_at = deadline - args.naive_budget_s
        plan = plan_naive(scenarios, args.naive_budget_s - NAIVE_START_S, parse_cap(args.naive_cap))
        report["naive_plan"] = {"budget_s": args.naive_budget_s, "start_s": NAIVE_START_S, "scenarios": plan}
        cap = {n: p["num_requests"] for n, p in plan.items()}
        runs.append((NAIVE, NAIVE_CMD, capped(scenarios, cap)))
        print("naive plan: " + ", ".join(f"{n} {p['num_requests']} req ~{p['est_s']}s" for n, p in plan.items()),
              flush=True)
    for label, cmd, scs in runs:
        argv_ = command(cmd, fill)
        measure_server(label, argv_, scs, model=args.model, name=name, report=report, out=out,
                       deadline=deadline if label == NAIVE else naive_at, ready_s=args.ready_s, log_dir=log_dir)
    if args.headline:
        from headline import write_headline  # beside this file

        ours = [label for label, _ in servers]
        if ours and not args.no_naive:
            h = write_headline(out, args.sol, args.scenarios, args.headline, server=ours[0])
            print(json.dumps(h, indent=2))
    return report


if __name__ == "__main__":
    main()
