"""``python -m orchestrator.bench --url URL --model NAME --scenario decode`` (also ``infergoal bench``).

``--slo "maximize throughput with p90 TTFT under 300 ms"`` runs the SLO request-rate search instead
(`bench/rate.py`) on the scenario's shape (default: the `slo` scenario) and prints every step.

``--json``: stdout holds exactly one JSON document (the metrics; with ``--slo`` also the steps) and
nothing else; every line for a person (the steps, the summary, the files written) goes to stderr."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from .loadgen import run_scenario_sync
from .rate import RatePolicy
from .results import write_exports
from .scenarios import Scenario, builtin_scenarios, load_trace

_SHOWN = ("completed", "failed", "duration_s", "request_throughput", "output_throughput",
          "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_p50",
          "itl_ms_mean", "itl_ms_p99", "e2e_ms_mean", "queue_ms_p99", "achieved_rate",
          "loop_lag_ms_p99", "osl_mismatch")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchestrator.bench", description=__doc__)
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--scenario", default="decode",
                   help=f"builtin name ({', '.join(builtin_scenarios())}) or a JSON file of Scenario fields")
    p.add_argument("--scale", type=float, default=1.0, help="scale factor (1.0 = tiny CPU model)")
    p.add_argument("--tokenizer", default=None, help="tokenizer dir: exact prompt lengths as token ids")
    p.add_argument("--api", choices=("completions", "chat"), default="completions")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout (s)")
    p.add_argument("--out", default=None, help="directory for vLLM/AIPerf/JSONL exports")
    # Overrides of single scenario fields.
    for f, t in (("num-requests", int), ("concurrency", int), ("prompt-tokens", int),
                 ("output-tokens", int), ("rate", float), ("burstiness", float),
                 ("warmup-requests", int), ("seed", int), ("prefix-tokens", int)):
        p.add_argument(f"--{f}", type=t, default=None)
    p.add_argument("--prompt-seed", type=int, default=None,
                   help="a draw of prompts of its own (same lengths, other tokens); default: the scenario's fixed set")
    p.add_argument("--arrival", choices=("closed", "poisson", "constant", "gamma", "trace"), default=None)
    p.add_argument("--trace", default=None, help="Mooncake-style JSONL trace (implies --arrival trace)")
    p.add_argument("--json", action="store_true", help="print the full metrics dict as JSON")
    p.add_argument("--slo", default=None, help='an SLO goal, e.g. "maximize throughput with p90 TTFT under 300 ms": '
                   "search the highest request rate meeting it")
    p.add_argument("--precision", type=float, default=RatePolicy.precision, help="--slo: relative precision of the rate")
    p.add_argument("--min-seconds", type=float, default=RatePolicy.min_seconds, help="--slo: shortest step (s)")
    p.add_argument("--min-requests", type=int, default=RatePolicy.min_requests, help="--slo: fewest requests per step")
    p.add_argument("--confirmations", type=int, default=RatePolicy.confirmations,
                   help="--slo: most confirmation tries down (twice as long) settling the answer, a doubled stride's "
                        "pass bisected back up (confirmations - 2 steps more at most); 0: none")
    return p


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    if args.scenario.endswith(".json"):
        with open(args.scenario) as fh:
            sc = Scenario(**json.load(fh))
        if args.scale != 1.0:
            sc = sc.scaled(args.scale)
    else:
        table = builtin_scenarios(args.scale)
        if args.scenario not in table:
            raise SystemExit(f"unknown scenario {args.scenario!r}; choose from {sorted(table)}")
        sc = table[args.scenario]
    upd = {k: getattr(args, k) for k in ("num_requests", "concurrency", "prompt_tokens", "output_tokens",
                                         "rate", "burstiness", "warmup_requests", "seed", "prefix_tokens",
                                         "prompt_seed", "arrival") if getattr(args, k) is not None}
    if args.trace:
        upd.update(trace_path=args.trace, arrival="trace")
        if args.num_requests is None:  # replay the whole trace unless told otherwise
            upd["num_requests"] = len(load_trace(args.trace))
    return sc.model_copy(update=upd) if upd else sc


def _say(args: argparse.Namespace, line: str) -> None:
    """A line for a person: stdout, or stderr when stdout is the one JSON document (`--json`)."""
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def slo_from_args(args: argparse.Namespace) -> int:
    """The SLO rate search: one line per step, then the rate; 0 when some rate met the SLO."""
    from orchestrator.config.goal import GoalError, parse_goal

    from .slo import slo_measure

    try:
        goal = parse_goal(args.slo)
    except GoalError as e:
        raise SystemExit(str(e)) from None
    if goal.slo is None:
        raise SystemExit(f"--slo takes an SLO goal (maximize/minimize ... with limits), not {args.slo!r}")
    for flag, value, ok, want in (("--precision", args.precision, args.precision > 0, "> 0"),
                                  ("--min-seconds", args.min_seconds, args.min_seconds > 0, "> 0"),
                                  ("--min-requests", args.min_requests, args.min_requests >= 1, ">= 1"),
                                  ("--confirmations", args.confirmations, args.confirmations >= 0, ">= 0")):
        if not ok:
            raise SystemExit(f"{flag} must be {want}, not {value}")
    if not reachable(args.url):
        return BAD_INPUT
    if args.scenario == "decode":  # the plain default: the SLO scenario's shape instead
        args.scenario = "slo"
    sc = scenario_from_args(args)
    policy = RatePolicy(precision=args.precision, min_seconds=args.min_seconds, min_requests=args.min_requests,
                        confirmations=args.confirmations)

    def bench_one(s: Scenario):  # noqa: ANN202
        return run_scenario_sync(args.url, args.model, s, tokenizer=args.tokenizer, api=args.api, timeout_s=args.timeout)

    def show(st) -> None:  # noqa: ANN001
        _say(args, f"  {st.rate:10.3f} req/s  {'pass' if st.passed else 'FAIL'}{'' if st.trusted else ' (untrusted)'}  {st.why}")

    _say(args, f"SLO search: {goal.slo.describe()}; ISL {sc.prompt_tokens}, OSL {sc.output_tokens}, from {sc.rate} req/s")
    res = slo_measure(goal.slo, sc, bench_one, policy, on_step=show)
    if args.json:
        print(json.dumps({k: res.metrics[k] for k in sorted(res.metrics)} | {"steps": res.meta["rate_search"]}, indent=2))
    if res.meta.get("slo_error"):
        _say(args, res.meta["slo_error"])
        return 1
    _say(args, f"rate {res.metrics['slo_rate']:.3f} req/s, goodput {res.metrics['slo_goodput']:.3f} req/s, "
          f"output {res.metrics['output_throughput']:.1f} tok/s"
          + (" (client-bound: a lower bound)" if res.metrics.get("slo_client_bound") else ""))
    return 0


BAD_INPUT = 2
"""The exit status of a request refused before anything ran (as `infergoal`'s `bad_input`)."""


def unreachable(url: str, timeout_s: float = 5.0) -> str | None:
    """Why the server at `url` cannot be reached (`connection refused`), or None when a TCP
    connection to it opens: a benchmark of a server that is not there is a mistake to say in one
    line, not a table of zeros."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        return f"not a URL ({e})"
    if parts.scheme not in ("http", "https") or not host:
        return "not an http:// or https:// URL"
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return (e.strerror or str(e) or type(e).__name__).lower()
    return None


def reachable(url: str) -> bool:
    """Whether the server at `url` answers a connection; when not, says so in one line on stderr."""
    why = unreachable(url)
    if why is not None:
        print(f"error: cannot reach {url}: {why}; start the server, or check --url (host, port, and the /v1 path)",
              file=sys.stderr)
    return why is None


def run_from_args(args: argparse.Namespace) -> int:
    """Run the scenario described by parsed args; print a summary; 0 if every request succeeded,
    1 if some failed, `BAD_INPUT` when the server cannot be reached or every request failed."""
    if args.slo:
        return slo_from_args(args)
    if not reachable(args.url):
        return BAD_INPUT
    sc = scenario_from_args(args)
    res = run_scenario_sync(args.url, args.model, sc, tokenizer=args.tokenizer, api=args.api,
                            timeout_s=args.timeout)
    if res.failures and not res.metrics.get("completed"):
        said = ", ".join(f"{k}: {v}" for k, v in sorted(res.failures.items()))
        print(f"error: every request to {args.url} failed ({said}); check --url, --model and --api, "
              "and the server's log", file=sys.stderr)
        return BAD_INPUT
    if args.json:
        print(json.dumps(res.to_dict(with_requests=False)["metrics"], indent=2))
    else:
        print(f"scenario {sc.name}: {sc.num_requests} req, ISL {sc.prompt_tokens}, OSL {sc.output_tokens}, "
              f"{sc.arrival} c={sc.concurrency} rate={sc.rate}")
        for k in _SHOWN:
            print(f"  {k:22s} {res.metrics.get(k, 0.0):12.3f}")
        if res.failures:
            print("  failures:", res.failures)
    if args.out:
        for name, path in write_exports(res, args.out).items():
            _say(args, f"  wrote {name}: {path}")
    return 0 if res.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
