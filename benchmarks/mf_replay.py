"""Multi-fidelity screening replayed on the measured tables: does the short bench lose the best, and what does it save?

    python benchmarks/mf_replay.py --seeds 20 --budget 20 --fraction 0.25 [--table small] [--keep 50] [--startup 4,0] [--json out.json]

Per seed, two runs of the loop's real decisions on one measured table (`benchmarks/data/`,
`kb_replay.Table`: a knob set's value is its best quiet block over the median quiet baseline block):
- full: every candidate measured in full (the table value), as `benchmarks/kb_replay.py` replays it;
- screened: the product's mechanism (`orchestrator.trial.fidelity`, `bench.screen_fraction`): each
  candidate first gets a short bench; the real `SearchProposer.should_stop_early` (Optuna's
  ThresholdPruner: the best kept score less `fidelity.margin` of the baseline's noise as the
  table measured it, `baseline_noise`) decides, on the stored history; screened out, it is stored `discarded`
  with its short score and the product's reason, never kept; otherwise its table value, as in full.
Both use a real SQLite `Store` and the real `SearchProposer` (TPE, seeded, rebuilt from the store
each step); the keep rule is the controller's (beat the best by 3%).

Models (stated, not measured end to end):
- short-bench score = table value x exp(s_k x sqrt(1 / f) x z), z ~ N(0, 1): s_k is the knob set's own
  measured spread (stdev of the log of its quiet candidate blocks, the table's repeats; the table's
  median spread where a knob set has fewer than 2 quiet blocks), taken as the noise of one full
  bench (conservative: a table block holds 8 requests, the full bench 48); f is the fraction of
  requests the short pass really runs (`fidelity.short_scenario`: whole waves of the concurrency);
  `--short-bias` multiplies every short score (a short pass slower or faster than the full one);
- bench time = requests x output tokens / the knob set's throughput (table value x the baseline's
  tok/s), for the product's throughput scenario at scale 1 (48 requests + 8 warm-up, c=8): full
  = warm-up + N; screened out = warm-up + short; passed = warm-up + N (the full bench continues the
  short pass: its first requests are the short pass's). `--restart` replays the cost before that
  (passed = warm-up + short + N: the full bench started over, the short pass its warm-up). A knob
  set that failed costs no bench time in either run. (The short pass being the full bench's first
  requests makes a passed candidate's full score correlated with its short score; the replay's full
  score is the table value in both, so only the cost changes.)
`--cut` replays the screen's early stop on throughput (`fidelity.Screen.plan`): a screened-out candidate's short
pass ends once all its tokens over the time elapsed fall under the bar's throughput (bar x the baseline's
tok/s: the table's single throughput objective), at `short requests x tokens / (bar x baseline tok/s)`
seconds, and its stored score is that bound, ~the bar, not its short score (TPE is told it as pruned:
`optspace.told`); the decision is the same (the short score is under the bar either way), later
proposals may differ.
`--keep P` replays Optuna's PercentilePruner (top P% of the run's trials) instead of the bar.
`--startup N[,M...]`: full measurements (the baseline counted) before the pruner judges; the product's
screen states the baseline's noise and passes `fidelity.KNOWN_NOISE_STARTUP` (0, the default here), 4 was
the proposer's `SCREEN_STARTUP` before; several values replay one full run and one screened run each.
Reported: seeds whose final best (the table value of the run's best trial) equals the full run's,
and the search's bench time saved (the baseline, the same in both, is not counted).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

import optuna  # noqa: E402
from kb_replay import DATA, MIN_GAIN, MODELS, Table, load_rows  # noqa: E402
from kb_table import behaviour_key, grid_target, quiet_blocks  # noqa: E402

from orchestrator.bench.scenarios import builtin_scenarios  # noqa: E402
from orchestrator.proposers.search import SCREEN_STARTUP, SearchProposer  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.trial.fidelity import (  # noqa: E402
    KNOWN_NOISE_STARTUP,
    SCREENED,
    STOP_SLACK,
    STOPPED_EARLY,
    margin,
    short_scenario,
)

TABLES = {"small": "B", "mid": "C", "wide": "D"}


class PercentileScreen(SearchProposer):
    """The alternative replayed beside the product's bar (`--pruner percentile`): Optuna's
    PercentilePruner over the run's stored trials (fully measured: COMPLETE with their score at step
    0; screened out: PRUNED), keeping the top `keep` percent (50: the MedianPruner)."""

    stop_bar = None  # its bar is not a fixed score: no short pass of it is stopped early (`--cut` needs the product's)

    def __init__(self, *a: Any, keep: float = 50.0, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.keep = keep

    def should_stop_early(self, history: Any, value: float, margin: float, startup: int | None = None) -> str | None:
        from orchestrator.trial.fidelity import is_screened

        n_startup = SCREEN_STARTUP if startup is None else startup
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=self.seed),
                                    pruner=optuna.pruners.PercentilePruner(self.keep, n_startup_trials=n_startup))
        for t in history:
            if t.status in ("kept", "discarded") and t.score:
                pruned = is_screened(t)
                study.add_trial(optuna.trial.create_trial(
                    state=optuna.trial.TrialState.PRUNED if pruned else optuna.trial.TrialState.COMPLETE,
                    value=None if pruned else float(t.score), intermediate_values={0: float(t.score)}))
        trial = study.ask()
        trial.report(float(value), 0)
        return f"the top {self.keep:g}% (PercentilePruner)" if trial.should_prune() else None


def spreads(rows: list[dict[str, Any]], model: str, workload: str = "throughput") -> tuple[dict[str, float], float]:
    """Behaviour key -> the stdev of the log of its quiet candidate blocks (>= 2 of them), and the median over keys."""
    blocks: dict[str, list[float]] = {}
    for r in rows:
        if r["model"] == model and r["workload"] == workload and not r.get("error"):
            blocks.setdefault(r["key"], []).extend(v for v in quiet_blocks(r, "cand") if v > 0)
    out = {k: statistics.stdev(math.log(v) for v in vs) for k, vs in blocks.items() if len(vs) >= 2}
    return out, statistics.median(out.values()) if out else 0.05


def baseline_noise(rows: list[dict[str, Any]], model: str, cand_spread: float, workload: str = "throughput") -> float:
    """The noise the product's margin starts from (`verdict.noise_of`: the range of the baseline's repeats
    over their mean): the median over the table's rows with two or more quiet baseline blocks; a table
    without any gets 1.13 x the candidates' median spread (the expected range of two draws, in sigmas)."""
    ranges = [(max(b) - min(b)) / statistics.fmean(b) for r in rows if r["model"] == model and r["workload"] == workload
              for b in [quiet_blocks(r, "base")] if len(b) >= 2]
    return statistics.median(ranges) if ranges else 1.13 * cand_spread


class Bench:
    """The replayed bench: a knob set's full and short scores and their bench seconds."""

    def __init__(self, table: Table, spread: dict[str, float], median_spread: float, fraction: float, bias: float = 1.0,
                 noise: float | None = None) -> None:
        sc = builtin_scenarios(1.0)["throughput"]
        short = short_scenario(sc, fraction)
        self.table, self.spread, self.median_spread, self.bias = table, spread, median_spread, bias
        self.noise = median_spread if noise is None else noise
        self.n, self.warm, self.n_short, self.tokens = sc.num_requests, sc.warmup_requests, short.measured_requests, sc.output_tokens
        self.f = self.n_short / self.n  # what the short pass really runs

    def value(self, knobs: dict[str, Any]) -> float | None:
        return self.table.ratio(knobs)

    def short(self, knobs: dict[str, Any], rng: random.Random) -> float:
        s = self.spread.get(behaviour_key(knobs, "throughput"), self.median_spread)
        return self.value(knobs) * self.bias * math.exp(s * math.sqrt(1 / self.f) * rng.gauss(0, 1))

    def seconds(self, knobs: dict[str, Any], requests: int) -> float:
        r = self.value(knobs)
        return 0.0 if r is None else requests * self.tokens / (r * self.table.base_ref)


def replay(bench: Bench, target: Any, store: Store, *, seed: int, budget: int, screen: bool, keep: float | None,
           margin_: float | None = None, startup: int = KNOWN_NOISE_STARTUP, restart: bool = False,
           cut: bool = False) -> dict[str, Any]:
    """One run: TPE proposals, each measured in full or screened first; returns its best and bench time."""
    run = store.create_run(name=f"{'screen' if screen else 'full'}-s{seed}", goal_text="replay", goal_json={}, goal_hash="mf",
                           target_json={}, config_json={}, host="replay", proposer="search")
    t0 = store.create_trial(run.id, 0, commit="base", knobs=target.baseline_knobs(), rationale="baseline", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0, objective={"score": 1.0})
    proposer = SearchProposer(seed=seed) if keep is None else PercentileScreen(seed=seed, keep=keep)
    # The baseline's noise as sentinels would measure it (`baseline_noise`), or `--margin`.
    m = margin(bench.noise, bench.f) if margin_ is None else margin_
    rng = random.Random(seed)  # the short benches' noise: one stream per seed
    best, best_knobs, bench_s, screened, missed = 1.0, target.baseline_knobs(), 0.0, 0, []
    for n in range(1, budget + 1):
        history = store.list_trials(run.id)
        cand = proposer.propose(history, target)
        if cand is None:
            break
        t = store.create_trial(run.id, n, commit="base", knobs=cand.knobs, rationale=cand.rationale, proposer=cand.proposer)
        r = bench.value(cand.knobs)
        if r is None:
            store.finish_trial(t.id, "failed", error="the server did not start or failed the bench")
            continue
        if screen:
            s = bench.short(cand.knobs, rng)
            why = proposer.should_stop_early(history, s, m, startup=startup)  # the product's decision, on the stored history
            bench_s += bench.seconds(cand.knobs, bench.warm + bench.n_short)
            if why:
                screened += 1
                if r > best * (1 + MIN_GAIN):
                    missed.append(round(r, 4))  # full fidelity would have kept it here
                bar = proposer.stop_bar(history, m, startup=startup) if cut else None
                if bar is not None:  # stopped once out of reach: the bound is stored, the pass ends at the floor's time
                    s = bar * (1 - STOP_SLACK)
                    stop_s = bench.n_short * bench.tokens / (bar * bench.table.base_ref)
                    bench_s -= bench.seconds(cand.knobs, bench.n_short) - min(bench.seconds(cand.knobs, bench.n_short), stop_s)
                store.finish_trial(t.id, "discarded", score=s, objective={"score": s},
                                   error=f"{SCREENED} {bench.f:.0%} fidelity: short-bench score {s:.3f}x vs {why}"
                                   + (f"; throughput {STOPPED_EARLY} {stop_s:.3g} s" if bar is not None else ""))
                continue
            bench_s += bench.seconds(cand.knobs, bench.n - (0 if restart else bench.n_short))  # the rest (or all again)
        else:
            bench_s += bench.seconds(cand.knobs, bench.warm + bench.n)
        kept = r > best * (1 + MIN_GAIN)
        store.finish_trial(t.id, "kept" if kept else "discarded", score=r, objective={"score": r})
        if kept:
            best, best_knobs = r, cand.knobs
            store.set_best_trial(run.id, t.id)
    return {"seed": seed, "best": round(bench.value(best_knobs), 4), "bench_s": round(bench_s, 2), "screened": screened,
            "trials": n, "missed_keeps": missed}


def run(table_name: str = "small", *, seeds: int = 20, budget: int = 20, fraction: float = 0.25, keep: float | None = None,
        bias: float = 1.0, fix: dict[str, Any] | None = None, rows: list[dict[str, Any]] | None = None,
        margin_: float | None = None, startups: tuple[int, ...] = (KNOWN_NOISE_STARTUP,), restart: bool = False,
        cut: bool = False) -> dict[str, Any]:
    """The replay of one table; `summary` and `runs` for the first of `startups`, `by_startup` for each."""
    model = MODELS[TABLES[table_name]]
    rows = rows if rows is not None else load_rows(DATA / f"kb_table_{table_name}_throughput.jsonl")
    table = Table(rows, model, "throughput")
    spread, med = spreads(rows, model)
    bench = Bench(table, spread, med, fraction, bias, noise=baseline_noise(rows, model, med))
    target = grid_target(fixed=fix or {})
    tmp = Path(tempfile.mkdtemp(prefix="mf_replay_"))
    store = Store(f"sqlite:///{tmp / 'replay.db'}")
    by: dict[int, list[dict[str, Any]]] = {st: [] for st in startups}
    for s in range(seeds):
        # Seeds 1000 apart, as in kb_replay (SearchProposer seeds each step with seed + len(history)).
        full = replay(bench, target, store, seed=1000 * s, budget=budget, screen=False, keep=keep)
        for st in startups:
            scr = replay(bench, target, store, seed=1000 * s, budget=budget, screen=True, keep=keep, margin_=margin_, startup=st,
                         restart=restart, cut=cut)
            by[st].append({"seed": s, "full": full, "screened": scr})
    runs = by[startups[0]]
    return {"startup": startups[0], "by_startup": {st: summarise(rs) for st, rs in by.items()},"table": table_name, "model": model, "fraction": fraction, "short_requests": bench.n_short, "of": bench.n,
            "full_bench": "restarted" if restart else "continued", "cut": cut,
            "pruner": "threshold (the product)" if keep is None else f"percentile, keep top {keep:g}%",
            "baseline_noise": round(bench.noise, 4), "margin": round(margin(bench.noise, bench.f) if margin_ is None else margin_, 4), "bias": bias, "budget": budget, "median_spread": round(med, 4),
            "summary": summarise(runs), "runs": runs, "db": str(tmp / "replay.db")}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    same = [r for r in runs if abs(r["screened"]["best"] - r["full"]["best"]) < 1e-9]
    saved = [1 - r["screened"]["bench_s"] / r["full"]["bench_s"] for r in runs if r["full"]["bench_s"]]
    full_s, scr_s = sum(r["full"]["bench_s"] for r in runs), sum(r["screened"]["bench_s"] for r in runs)
    return {"seeds": len(runs), "same_best": len(same), "same_best_frac": round(len(same) / len(runs), 3),
            "screened_best_not_lower": sum(r["screened"]["best"] >= r["full"]["best"] - 1e-9 for r in runs),
            "within_3pct_of_full_best": sum(r["screened"]["best"] >= 0.97 * r["full"]["best"] for r in runs),
            "bench_saved_total": round(1 - scr_s / full_s, 3) if full_s else 0.0,
            "bench_saved_median": round(statistics.median(saved), 3) if saved else 0.0,
            "screened_out_median": statistics.median(r["screened"]["screened"] for r in runs),
            "missed_keeps": sum(len(r["screened"]["missed_keeps"]) for r in runs),
            "worst_seed": min(runs, key=lambda r: r["screened"]["best"] / r["full"]["best"])["seed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", default="small", choices=sorted(TABLES), help="whose throughput table: small (B), mid (C), wide (D)")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget", type=int, default=20, help="search trials per run (the same in both runs)")
    ap.add_argument("--fraction", type=float, default=0.25, help="bench.screen_fraction")
    ap.add_argument("--keep", type=float, default=None, help="replay Optuna's PercentilePruner keeping this top percent "
                    "instead of the product's bar under the best (50: the MedianPruner)")
    ap.add_argument("--margin", type=float, help="the bar's noise margin (default: the product's `fidelity.margin` "
                    "of the table's median spread)")
    ap.add_argument("--short-bias", type=float, default=1.0, help="every short score x this (1: unbiased)")
    ap.add_argument("--startup", default=str(KNOWN_NOISE_STARTUP), help="full measurements before the pruner judges, "
                    "comma-separated for several (4: the start-up before 2026-12-02; 0: the product's, the noise stated)")
    ap.add_argument("--restart", action="store_true", help="a passed candidate's full bench starts over (the cost before "
                    "the full bench continued the short pass)")
    ap.add_argument("--cut", action="store_true", help="a screened-out short pass stops once out of reach (the product's "
                    "early stop): the bound is stored, the pass ends early")
    ap.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE", help="pin a knob (a smaller space)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    fix = {k: (int(v) if v.isdigit() else v) for k, v in (f.split("=", 1) for f in args.fix)}
    out = run(args.table, seeds=args.seeds, budget=args.budget, fraction=args.fraction, keep=args.keep, bias=args.short_bias, fix=fix,
              margin_=args.margin, startups=tuple(int(x) for x in args.startup.split(",")), restart=args.restart, cut=args.cut)
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
