"""Time to best over many seeds: the real search replayed on a surrogate of the GPU space, before and after.

    python benchmarks/gpu/ttb_replay.py [--seeds 30] [--trials 30] [--warm-kb KB_DIR] [--noise SD] [--keep-gain G]
                                       [--goal best-known|none] [--json out.json]

A prediction, not a measurement. The real `SearchProposer` proposes on examples/targets/hfserve_gpu.toml
as `infergoal goal` runs it (seeded 0..N-1); each proposal is scored by `ttb_surrogate.py`'s fit of
every stored 7B GPU trial's measured values (H200 and H100 runs, today's sharing their card's offset; failures mark
crash levels: a knob set holding one fails with server errors) times a log-normal per-trial noise: by default the launch noise the
stored runs measured (`ttb_surrogate.launch_noise`: a knob set's score between its launches within a run,
log sd 0.027), `--noise` another (the robustness table also replays 0.08, how far the baseline's throughput
moved between runs). The loop's parts that set the clock are modelled as the controller runs them: the
baseline, the short-pass screen (a score under the best kept less a 12% margin ends on its short bench:
Optuna's ThresholdPruner, from the first search trial), the keep rule (`--keep-gain` over the best kept:
by default the loop's while its baseline was measured once, `verdict.ASSUMED_NOISE`, 5%), sentinels,
and the goal the real runs had (`--goal best-known`, the default: each objective 8% short of the best known;
a trial whose screen clears its bars gets paired rounds, which keep it and end the run when they meet it, as
the loop keeps a trial under its keep line whose paired A/B meets the goal; `--goal none`: the keep rule
alone); each trial costs the fitted GPU-seconds of its engine family and outcome, a paired round a
baseline re-measure and a full trial.

Time to best: GPU-seconds from the run's start to the first kept search trial whose score is within
5% of the surrogate's best (`time_to_best.py`'s rule: a trial kept by its paired rounds counts when it was
measured), cold (no knowledge base) and warm (what a warm run of the loop reads from the shipped seed and another
model's knowledge base, `--warm-kb`: `KnowledgeBase.priors` and `prior_observations` for the 7B on the H100, the
card of the surrogate's scale, so the warm starts are translated to the 7B as the loop translates them). A run that
does not reach it in `--trials` counts as infinite.

Variants (same seeds): `before`: the search and sentinels as they were (the covering start-up stakes
every untried level a draw has, a crash is told to TPE as a failure of its whole knob set, the
baseline re-measured every 4 search trials); `after`: at most `MAX_UNTRIED` untried levels per
start-up trial, crashes attributed (`orchestrator.targets.attribution`), TPE's draws ranked by the run's
per-knob cost model (`orchestrator.proposers.costmodel`) and its model steps between them
(`orchestrator.proposers.modelstep`), and a count-based sentinel only while sentinels stay within
`SENTINEL_SHARE` of the run's GPU time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

HERE = Path(__file__).resolve().parent

from ttb_surrogate import ROOT, TARGET, Surrogate, fit, launch_noise, scale_fingerprint  # noqa: E402  (beside this script)

if str(ROOT) not in sys.path:  # the GPU tool's goal constants (benchmarks.gpu.tool), from the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu.tool.ttb import BEST_GOAL_SLACK  # noqa: E402
from gates.thresholds import section  # noqa: E402
from orchestrator.knowledge.kb import KnowledgeBase  # noqa: E402
from orchestrator.proposers.search import SearchProposer  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.targets import load_target  # noqa: E402
from orchestrator.trial.verdict import ASSUMED_NOISE  # noqa: E402

__all__ = ["VARIANTS", "Variant", "WarmPlan", "main", "one_run", "table", "warm_plan"]

BETWEEN_RUNS_NOISE = 0.08  # the robustness table's per-trial noise: the baseline's throughput between runs
GOAL_SLACK = BEST_GOAL_SLACK  # `--goal best-known`'s bars: each objective this much short of the best known
PAIRED_ROUNDS = int(section(None, "performance")["paired_rounds"])  # a confirmation's first rounds, as the loop runs it
GOALS = ("best-known", "none")
SCREEN_MARGIN = 0.12
KEEP_GAIN = ASSUMED_NOISE
WITHIN = 0.05
SENTINEL_EVERY = 4
SENTINEL_SHARE = 0.08
WARM_KB = HERE / "results" / "kb_2b_explore_h100"
SEED_KB = ROOT / "knowledge_base"
WORKLOAD = "decode+throughput@1"  # the GPU runs' workload key (their scenarios at scale 1)


@dataclass(frozen=True)
class Variant:
    name: str
    max_untried: int | None
    attribute: bool
    sentinel_share: float | None  # None: every SENTINEL_EVERY trials whatever they cost
    rank: int  # TPE draws ranked by the run's cost model (1: TPE's first draw)


VARIANTS = (Variant("before", None, False, None, 1), Variant("after", 3, True, SENTINEL_SHARE, 8))


@dataclass(frozen=True)
class WarmPlan:
    """What a warm run of the loop hands its search from the knowledge base (`orchestrator.runs`)."""

    knobs: list[dict[str, Any]]  # the warm starts, translated to this setting, in the order the loop tries them
    entries: list[str]  # the entry each comes from
    priors: list[dict[str, Any]]  # `KnowledgeBase.prior_observations`


def warm_plan(kb_dir: Path = WARM_KB, target: Any = None) -> WarmPlan:
    """The warm plan a 7B run on the H100 (the scale run's fingerprint) reads from the shipped seed and `kb_dir`."""
    target = target or load_target(TARGET)
    kb = KnowledgeBase([SEED_KB, kb_dir], write_dir=Path(tempfile.mkdtemp()))
    here = {"engine": target.engine, "model": "forge:7b-peaked", "hardware": scale_fingerprint(), "workload": WORKLOAD}
    plan = kb.priors(**here)
    return WarmPlan([target.validate_knobs(p["knobs"]) for p in plan], [p["entry"] for p in plan],
                    kb.prior_observations(**here))


def one_run(seed: int, variant: Variant, sur: Surrogate, target: Any, best: float, trials: int, tmp: Path,
            warm: WarmPlan | None = None, *, noise: float, keep_gain: float = KEEP_GAIN,
            goal: str = "best-known") -> dict[str, Any]:
    """One replayed run: when (GPU-s, trial) it first kept a trial within 5% of `best`, and its sentinel share.

    `goal="best-known"`: the run has the goal the real best-known runs had (each objective `GOAL_SLACK` short of
    the best known, on the score's scale); a trial whose score clears it by the bars' margin (the assumed 5%
    noise, raised by a failed confirmation as `goalbars.raised` raises it) gets `PAIRED_ROUNDS` paired rounds
    (each a baseline launch and a candidate launch, the candidate at its surrogate score times the noise), met
    when every round clears the goal (absolute objectives: each pair's candidate meets it); met keeps the trial
    (at its own decision time) and ends the run. `goal="none"`: the keep rule alone."""
    rng = random.Random(seed)
    store = Store(f"sqlite:///{tmp / f'{variant.name}{seed}{int(bool(warm))}.db'}")
    proposer = SearchProposer(seed=seed, warm_start=warm.knobs if warm else (), warm_from=warm.entries if warm else (),
                              priors=warm.priors if warm else (), max_untried=variant.max_untried,
                              attribute=variant.attribute, rank=variant.rank)
    run = store.create_run("r", "g", {}, "d", {}, {}, "local", "search")
    t0 = store.create_trial(run.id, 0, commit="", knobs=target.baseline_knobs(), rationale="", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0)
    clock = sur.seconds["before_first"] + sur.seconds["baseline"]
    sentinel_s, since, kept_best = 0.0, 0, 1.0
    out: dict[str, Any] = {"seed": seed, "ttb_s": math.inf, "trial": None, "failed": 0, "paired": 0}
    goal_bar, margin = (1 - GOAL_SLACK) * best, ASSUMED_NOISE
    for i in range(1, trials + 1):
        if since >= SENTINEL_EVERY and (variant.sentinel_share is None
                                        or sentinel_s + sur.seconds["sentinel"]
                                        <= variant.sentinel_share * (clock - sur.seconds["before_first"] + sur.seconds["sentinel"])):
            clock += sur.seconds["sentinel"]
            sentinel_s += sur.seconds["sentinel"]
            since = 0
        c = proposer.propose(store.list_trials(run.id), target)
        if c is None:
            break
        c = dataclasses.replace(c, knobs=target.validate_knobs(c.knobs))  # as the loop records it (defaults filled)
        since += 1
        t = store.create_trial(run.id, i, commit="", knobs=c.knobs, rationale=c.rationale, proposer="search")
        p = sur.predict(c.knobs)
        if p.fails:
            clock += sur.cost(c.knobs, "failed")
            store.finish_trial(t.id, "failed", error="16 of 16 requests failed in throughput@0.25 (server_error: 16)")
            out["failed"] += 1
            continue
        score = p.score * math.exp(rng.gauss(0, noise))
        bar = proposer.stop_bar(store.list_trials(run.id), SCREEN_MARGIN, startup=0)
        if bar is not None and score < bar:
            clock += sur.cost(c.knobs, "screened")
            store.finish_trial(t.id, "discarded", score=score, error="screened out at 25% fidelity: under the bar")
            continue
        clock += sur.cost(c.knobs, "full")
        kept = score >= kept_best * (1 + keep_gain)
        store.finish_trial(t.id, "kept" if kept else "discarded", score=score)
        out["best"] = max(out.get("best", 0.0), score)
        if kept:
            kept_best = score
            if score >= (1 - WITHIN) * best:
                out.update(ttb_s=clock, trial=i)
                break
        if goal == "best-known" and score >= goal_bar * (1 + margin):  # the screen clears the goal's bars: paired A/B
            decided = clock
            rounds = [p.score * math.exp(rng.gauss(0, noise)) for _ in range(PAIRED_ROUNDS)]
            clock += PAIRED_ROUNDS * (sur.seconds["sentinel"] + sur.cost(c.knobs, "full"))
            out["paired"] += 1
            if min(rounds) >= goal_bar:  # goal met: the trial is kept, decided when it was measured
                if score >= (1 - WITHIN) * best:
                    out.update(ttb_s=decided, trial=i)
                out["goal_met_s"] = clock
                break
            margin = max(margin, score / min(rounds) - 1)
    out["sentinel_share"] = sentinel_s / clock
    return out


def _p90(secs: list[float]) -> float:
    secs = sorted(secs)
    return secs[min(len(secs) - 1, math.ceil(0.9 * len(secs)) - 1)]


def _ci(secs: list[float], stat: Any, draws: int = 2000) -> list[float]:
    """A 90% bootstrap interval of `stat` over the seeds (resampled with replacement, seeded): how far another
    30 seeds could move the figure."""
    rng = random.Random(0)
    vals = sorted(stat([rng.choice(secs) for _ in secs]) for _ in range(draws))
    return [vals[int(0.05 * draws)], vals[int(0.95 * draws) - 1]]


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    secs = sorted(r["ttb_s"] for r in rows)
    return {"seeds": len(rows), "median_s": statistics.median(secs), "p90_s": _p90(secs),
            "median_ci": _ci(secs, statistics.median), "p90_ci": _ci(secs, _p90),
            "reached": sum(math.isfinite(s) for s in secs),
            "sentinel_share_median": statistics.median(r["sentinel_share"] for r in rows),
            "crashed_trials": sum(r["failed"] for r in rows),
            "best_median": statistics.median(r.get("best", 0.0) for r in rows),
            "paired_confirmations": sum(r.get("paired", 0) for r in rows),
            "goal_met": sum("goal_met_s" in r for r in rows)}


def _replay(sur: Surrogate, target: Any, seeds: int, trials: int, variants: tuple[Variant, ...], tmp: Path,
            warm: WarmPlan, noise: float, keep_gain: float, goal: str = "best-known") -> dict[str, Any]:
    best, best_knobs = sur.best_known(target)
    top, top_knobs = sur.best(target)
    res: dict[str, Any] = {"best": best, "best_knobs": best_knobs, "top_predicted": top, "top_knobs": top_knobs}
    for v in variants:
        for kind, w in (("cold", None), ("warm", warm)):
            rows = [one_run(s, v, sur, target, best, trials, tmp, w, noise=noise, keep_gain=keep_gain, goal=goal)
                    for s in range(seeds)]
            res[f"{v.name}_{kind}"] = {**_stats(rows), "runs": rows}
    return res


def others(sur: Surrogate, target: Any, draws: int) -> dict[str, Surrogate]:
    """The surrogates of the robustness table: the fit on the H100 runs alone and on the H200 runs alone (both with
    the main fit's GPU-seconds per trial: today's code's), the fit on each trial's score with an offset per run (the
    run's baseline divides it), the fit with a residual kernel (interactions), the fit that reads screened-out
    short-bench values as values, and `draws` redraws of every fitted weight from its
    posterior (`Surrogate.perturbed`, seeded 0..draws-1)."""
    out = {f"{card} runs only": dataclasses.replace(fit(target=target, card=card), seconds=sur.seconds) for card in ("h100", "h200")}
    out["scores, an offset per run"] = fit(target=target, values=False)
    out["with a residual kernel"] = fit(target=target, residual_kernel=True)
    out["screened scores as values"] = fit(target=target, screened=True)
    for i in range(draws):
        out[f"weights redrawn #{i}"] = sur.perturbed(np.random.default_rng(i))
    return out


NOISE_ROW = f"per-trial noise {BETWEEN_RUNS_NOISE:g} (between runs)"


def table(seeds: int, trials: int, variants: tuple[Variant, ...] = VARIANTS, draws: int = 0,
          warm_kb: Path = WARM_KB, noise: float | None = None, keep_gain: float = KEEP_GAIN,
          goal: str = "best-known") -> dict[str, Any]:
    """The before/after table on the surrogate, and (`draws` > 0) the same over `others`' surrogates and with the
    between-runs noise (`robustness`); the warm runs read `warm_kb` (`warm_plan`); `noise`: the per-trial
    noise (None: the stored runs' launch noise); `goal`: the runs' goal (`one_run`)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    target = load_target(TARGET)
    sur = fit(target=target)
    warm = warm_plan(warm_kb, target)
    tmp = Path(tempfile.mkdtemp())
    if noise is None:
        ln = launch_noise()
        noise, basis = ln.sd, (f"launch noise of the stored runs: {ln.sets} knob sets launched again in {len(ln.runs)} "
                               f"runs, {ln.df} degrees of freedom")
    else:
        basis = "given (--noise)"
    res: dict[str, Any] = {**_replay(sur, target, seeds, trials, variants, tmp, warm, noise, keep_gain, goal),
                           "warm": warm.knobs, "warm_entries": warm.entries, "warm_priors": len(warm.priors),
                           "warm_from": _rel(warm_kb), "seeds": seeds, "trials": trials, "noise": noise,
                           "noise_basis": basis, "keep_gain": keep_gain, "goal": goal}
    if draws:
        res["robustness"] = {name: _replay(other, target, seeds, trials, variants, tmp, warm, noise, keep_gain, goal)
                             for name, other in others(sur, target, draws).items()}
        res["robustness"][NOISE_ROW] = _replay(sur, target, seeds, trials, variants, tmp, warm, BETWEEN_RUNS_NOISE,
                                               keep_gain, goal)
    return res


def _finite(x: Any) -> Any:
    """`x` with every infinite number (a run that never reached the best) as null, for JSON."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _infinite(res: dict[str, Any]) -> dict[str, Any]:
    """A saved table with its nulls (never reached) back as infinite."""
    for v in [*res.values(), *(x for r in res.get("robustness", {}).values() for x in r.values())]:
        if isinstance(v, dict) and "runs" in v:
            for stat in ("median_s", "p90_s"):
                v[stat] = math.inf if v[stat] is None else v[stat]
            for ci in ("median_ci", "p90_ci"):
                if ci in v:
                    v[ci] = [math.inf if x is None else x for x in v[ci]]
    return res


def _fmt(x: float) -> str:
    return f"{x:.0f}" if math.isfinite(x) else "not reached"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--json", type=Path, help="the whole table with every run (the evidence file)")
    ap.add_argument("--draws", type=int, default=3, help="the robustness table's redraws of the fitted weights "
                    "(beside the H100-only and H200-only fits; 0: no robustness table)")
    ap.add_argument("--headline", type=Path, help="write time_to_best_cold_s_median / _p90 (after) into this headline.json")
    ap.add_argument("--warm-kb", type=Path, default=WARM_KB,
                    help="the knowledge base the warm runs read beside the shipped seed (default: the 2B's explore run's)")
    ap.add_argument("--noise", type=float, help="the per-trial noise, log sd (default: the stored runs' launch noise)")
    ap.add_argument("--keep-gain", type=float, default=KEEP_GAIN,
                    help=f"the gain over the best kept a trial needs to be kept (default {KEEP_GAIN:g}: the loop's while "
                         "its baseline was measured once)")
    ap.add_argument("--goal", choices=GOALS, default="best-known",
                    help="the runs' goal: best-known (as the real best-known runs: each objective 8%% short of the best "
                         "known; a trial whose screen clears it gets paired rounds) or none (the keep rule alone)")
    ap.add_argument("--from", dest="saved", type=Path, help="print (and --headline) a table saved by --json instead of replaying")
    args = ap.parse_args(argv)
    if args.saved:
        res = _infinite(json.loads(args.saved.read_text()))
        args.seeds, args.trials, args.json = res["seeds"], res["trials"], args.json or args.saved
    else:
        if not args.warm_kb.is_dir():
            print(f"ttb_replay: --warm-kb {args.warm_kb}: no such knowledge-base folder (a run's kb/, or its "
                  "NAME.kb.tgz unpacked)", file=sys.stderr)
            return 2
        if args.noise is not None and not 0 <= args.noise < 1:
            print(f"ttb_replay: --noise {args.noise:g}: a log standard deviation from 0 to 1", file=sys.stderr)
            return 2
        if not 0 <= args.keep_gain < 1:
            print(f"ttb_replay: --keep-gain {args.keep_gain:g}: a fraction from 0 to 1 (0.05: 5% over the best kept)",
                  file=sys.stderr)
            return 2
        res = table(args.seeds, args.trials, draws=args.draws, warm_kb=args.warm_kb, noise=args.noise,
                    keep_gain=args.keep_gain, goal=args.goal)
    print(f"best known setting on the surrogate {res['best']:.2f}x ({' '.join(f'{k}={v}' for k, v in res['best_knobs'].items())}); "
          f"within 5% >= {0.95 * res['best']:.2f}x (the surrogate's top, never measured: {res['top_predicted']:.2f}x); {args.seeds} seeds, at most {args.trials} trials")
    if "noise" in res:
        print(f"per-trial noise: log sd {res['noise']:.4f} ({res['noise_basis']}); kept at {res['keep_gain']:.0%} over the best kept; "
              + ("goal: none (the keep rule alone)" if res.get("goal") == "none" else
                 f"goal: best-known (each objective {GOAL_SLACK:.0%} short of it; {PAIRED_ROUNDS} paired rounds decide)"))
    warm = res["warm"]
    print(f"warm runs read {res.get('warm_from', _rel(WARM_KB))} and the shipped seed: {len(warm)} warm start(s)"
          + (f", {res['warm_priors']} prior observation(s)" if res.get("warm_priors") else "") + "; first: "
          + " ".join(f"{k}={v}" for k, v in (warm[0] if warm else {}).items()))
    print(f"{'variant':8} {'start':5} {'median GPU-s':>13} {'p90 GPU-s':>12} {'reached':>8} {'sentinel share':>15} {'crashed trials':>15} {'best (median)':>14}")
    for v in VARIANTS:
        for kind in ("cold", "warm"):
            s = res[f"{v.name}_{kind}"]
            print(f"{v.name:8} {kind:5} {_fmt(s['median_s']):>13} {_fmt(s['p90_s']):>12} {s['reached']:>5}/{s['seeds']:<2} "
                  f"{s['sentinel_share_median']:>14.1%} {s['crashed_trials']:>15} {s['best_median']:>13.2f}x")
    for kind in ("cold", "warm"):
        s = res[f"after_{kind}"]
        if "median_ci" in s:
            print(f"after {kind}: 90% bootstrap interval over the seeds: median {_fmt(s['median_ci'][0])}-{_fmt(s['median_ci'][1])}, "
                  f"p90 {_fmt(s['p90_ci'][0])}-{_fmt(s['p90_ci'][1])} GPU-s")
    if res.get("robustness"):
        print("\nrobustness: the same replay on other surrogates the stored trials fit (median / p90 GPU-s, seeds reached)")
        print(f"{'surrogate':22} {'best known':>10} " + " ".join(f"{v.name + ' ' + kind:>22}" for v in VARIANTS for kind in ("cold", "warm")))
        for name, r in res["robustness"].items():
            cells = [f"{_fmt(r[k]['median_s'])} / {_fmt(r[k]['p90_s'])} ({r[k]['reached']})"
                     for k in (f"{v.name}_{kind}" for v in VARIANTS for kind in ("cold", "warm"))]
            print(f"{name:22} {r['best']:>9.2f}x " + " ".join(f"{c:>22}" for c in cells))
    if args.json and not args.saved:
        args.json.write_text(json.dumps(_finite(res), indent=1) + "\n")
    if args.headline:
        source = _rel(args.json) if args.json else None
        update_headline(args.headline, res, source, f"python benchmarks/gpu/ttb_replay.py --seeds {res['seeds']} "
                                                    f"--trials {res['trials']}"
                                                    + (" --goal none" if res.get("goal") == "none" else "")
                                                    + (f" --json {source}" if source else ""))
    return 0


def _round(x: float) -> float | None:
    return round(x, 1) if math.isfinite(x) else None


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(HERE.parents[1]))
    except ValueError:
        return str(p)


def update_headline(path: Path, res: dict[str, Any], source: str | None, command: str) -> None:
    """`time_to_best_cold_s_median` and `time_to_best_cold_s_p90` (the search as it is: `after`), each with the
    `before` figure beside it; other keys kept."""
    head = json.loads(path.read_text()) if path.exists() else {}
    for stat in ("median", "p90"):
        after, before = res["after_cold"], res["before_cold"]
        entry: dict[str, Any] = {
            "value": _round(after[f"{stat}_s"]), "before": _round(before[f"{stat}_s"]), "seeds": after["seeds"],
            "interval_90": [_round(x) for x in after.get(f"{stat}_ci", [])] or None,
            "reached": after["reached"], "reached_before": before["reached"], "trials": res["trials"],
            "warm_median": _round(res["after_warm"]["median_s"]), "warm_from": res.get("warm_from"),
            "basis": "predicted, not measured: the real search replayed on a surrogate fitted from every stored 7B GPU "
                     "trial's measured values (ttb_surrogate.py); GPU-seconds to a kept trial within 5% of the best known setting"
                     + (f"; per-trial noise log sd {res['noise']:.3f} ({res['noise_basis']}), kept at {res['keep_gain']:.0%} "
                        "over the best kept" if "noise" in res else "")
                     + ("; the keep rule alone (no goal)" if res.get("goal") == "none" else
                        f"; the real runs' best-known goal (each objective {GOAL_SLACK:.0%} short of the best known): a trial "
                        f"whose screen clears it gets {PAIRED_ROUNDS} paired rounds, which keep it when they meet it"
                        if res.get("goal") else ""),
            "warm_p90": _round(res["after_warm"]["p90_s"]),
            "source": source, "command": command}
        short = f"fewer than {'half' if stat == 'median' else '90%'} of the seeds reached it within {res['trials']} trials"
        if entry["value"] is None:
            entry["why"] = f"{short} ({after['reached']} of {after['seeds']})"
        if entry["before"] is None:
            entry["why_before"] = f"{short} ({before['reached']} of {before['seeds']})"
        head[f"time_to_best_cold_s_{stat}"] = entry
    path.write_text(json.dumps(head, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
