"""How much noise fresh prompts add to a paired ratio: fixed vs fresh prompts, side by side in one run.

    PYTHONPATH=. python benchmarks/fresh_prompts_noise.py --rounds 12 --json fresh_noise.json [--scale 0.25]
        [--scenario throughput] [--base-knobs '{"threads": 1}']
        [--knobs '{"batching": "on", "max_batch_size": 6, "attn": "sdpa", "threads": 1}'] [--fresh-servers]

The CPU demo target (examples/targets/hfserve.toml, the forge's tiny model): paired rounds, each a
half on the baseline's knobs then one on the candidate's, measuring one goal scenario. By default the
two servers stay up for the whole run (what differs between the two ways below is then the prompts
alone, not launches); `--fresh-servers` launches each half anew, as the loop's paired rounds do. The
engine has no prefix cache, so a fixed set asked again in one launch gains nothing. The rounds alternate between two ways of choosing prompts: `fixed` (every half of every
round asks the scenario's one seeded set, as the bench did before each measurement drew its own) and
`fresh` (both halves of a round ask one new draw, `Scenario.prompt_seed`; the next round another). Per
way: the rounds' ratios (candidate / baseline, the scenario's primary metric as a speedup), their
geometric mean, spread (max / min), the standard deviation of their logs, and the 90% bootstrap interval
`gates.performance.bootstrap_interval` gives them (the one a claim rests on).
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from gates.performance import bootstrap_interval  # noqa: E402
from orchestrator.bench import builtin_scenarios, run_scenario_sync  # noqa: E402
from orchestrator.bench.prompts import fresh_seed  # noqa: E402
from orchestrator.targets import load_target  # noqa: E402

TARGET = ROOT / "examples" / "targets" / "hfserve.toml"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server of the target with `knobs`, up from `start()` until `stop()`."""

    def __init__(self, target, knobs: dict, model: str) -> None:
        self.target, self.knobs, self.model, self.proc, self.url = target, knobs, model, None, ""

    def start(self) -> Server:
        port = _port()
        argv = self.target.render(self.target.validate_knobs(self.knobs), port=port, model=self.model,
                                  source=str(self.target.source), python=sys.executable)
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=self.target.source)  # the engine runs in its tree, as a trial's does
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2).read()
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"server did not start: {argv}") from None
                time.sleep(0.2)

    def measure(self, scenario) -> float:
        res = run_scenario_sync(self.url, self.target.served_model_name, scenario, tokenizer=self.model, timeout_s=300)
        if not res.ok:
            raise RuntimeError(f"{scenario.name}: {res.failures}")
        return float(res.metrics[scenario.primary_metric])

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None


def half(server: Server, scenario, fresh_server: bool) -> float:
    """One half of a round: `scenario` measured once on `server` (launched for it alone with `fresh_server`)."""
    if fresh_server:
        server.start()
    try:
        return server.measure(scenario)
    finally:
        if fresh_server:
            server.stop()


def summary(ratios: list[float]) -> dict:
    logs = [math.log(r) for r in ratios]
    lo, hi = bootstrap_interval(ratios, confidence=0.9)
    return {"ratios": [round(r, 4) for r in ratios], "geomean": round(math.exp(statistics.fmean(logs)), 4),
            "spread": round(max(ratios) / min(ratios), 4), "log_sd": round(statistics.stdev(logs), 4) if len(logs) > 1 else 0.0,
            "interval90": [round(lo, 4), round(hi, 4)], "interval_width": round(hi / lo, 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12, help="rounds per way of choosing prompts")
    ap.add_argument("--scale", type=float, default=0.25, help="bench.scale of the scenario")
    ap.add_argument("--fresh-servers", action="store_true", help="launch each half anew (as the loop's paired rounds)")
    ap.add_argument("--scenario", default="throughput")
    ap.add_argument("--base-knobs", type=json.loads, default={"threads": 1},
                    help="the baseline's knobs over the target's defaults (one torch thread: on a shared 2-core host "
                         "any other runnable task stalls every OpenMP region, docs/results.md)")
    ap.add_argument("--knobs", type=json.loads, default={"batching": "on", "max_batch_size": 6, "attn": "sdpa", "threads": 1},
                    help="the candidate's knobs over the baseline's (default: the demo's winner)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--model", default=None, help="model folder (default: the forge's tiny model, made once)")
    args = ap.parse_args()
    target = load_target(TARGET)
    if args.model is None:
        from orchestrator.models.forge import default_model  # torch: only where the model is made
    model = args.model or str(default_model())
    scenario = builtin_scenarios(args.scale)[args.scenario]
    higher = scenario.direction == "higher"
    base = {**target.baseline_knobs(), **args.base_knobs}
    ratios: dict[str, list[float]] = {"fixed": [], "fresh": []}
    t0 = time.monotonic()
    servers = [Server(target, base, model), Server(target, {**base, **args.knobs}, model)]
    if not args.fresh_servers:
        for s in servers:
            s.start()
    try:
        rounds(args, scenario, servers, higher, ratios)
    finally:
        for s in servers:
            s.stop()
    out = {"scenario": args.scenario, "scale": args.scale, "base_knobs": args.base_knobs, "knobs": args.knobs, "rounds": args.rounds,
           "fresh_servers": args.fresh_servers, "wall_s": round(time.monotonic() - t0, 1),
           **{way: summary(r) for way, r in ratios.items()}}
    out["log_sd_fresh_over_fixed"] = round(out["fresh"]["log_sd"] / max(out["fixed"]["log_sd"], 1e-9), 3)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


def rounds(args, scenario, servers: list[Server], higher: bool, ratios: dict[str, list[float]]) -> None:
    for rnd in range(args.rounds):
        for way in ("fixed", "fresh") if rnd % 2 == 0 else ("fresh", "fixed"):  # alternate who goes first
            sc = scenario if way == "fixed" else scenario.model_copy(update={"prompt_seed": fresh_seed()})
            a, b = (half(s, sc, args.fresh_servers) for s in servers)
            ratios[way].append(b / a if higher else a / b)
            print(f"round {rnd + 1} {way}: baseline {a:.2f}, candidate {b:.2f}, ratio {ratios[way][-1]:.3f}",
                  file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
