"""Replay the loop's real proposer and knowledge-base reuse against measured tables, over many seeds.

    python benchmarks/kb_replay.py --fix dtype=float32 --fix kv_cache=dynamic --seeds 20 --goal 2.5 \
        [--model-a-dir DIR] [--json out.json]          (docs/results.md has the commands)

What is measured and what is replayed:
- measured, on the real hfserve server with the real bench (`benchmarks/kb_table.py`): model B's
  (`forge:small`) table of the space; and the knob sets model A's (`forge:tiny`) two cold runs ask
  for (throughput; another workload, prefill by default), measured live when missing and
  `--model-a-dir` is given. All in `benchmarks/data/`;
- replayed: everything the loop decides. Each replayed run has a real SQLite store (`Store`), the
  real `SearchProposer` (Optuna TPE, seeded, rebuilt from the stored history each step) with the
  warm start and priors from the real `KnowledgeBase` (`priors`, `prior_observations`); A's runs are
  distilled into a knowledge base by the real `KnowledgeBase.write_back`. A trial's score is the
  table's value for its knob set instead of a fresh server (no sentinels, no confirmation relaunch).

Arms on model B (same seeds): cold (empty KB), warm (A's throughput KB), warm-enqueue-only (A's
winner enqueued, no search prior: the mechanism before priors), misled-workload (A's KB from the
other workload), misled-forced (that run's winner relabelled as A's throughput setting, so the
similarity cannot filter it), misled-adversarial (constructed: B's worst knob set as the winner,
A's scores mirrored), and random (the same proposer with every trial a random start-up trial).
With a second source model C (`forge:mid`, another shape: full multi-head attention, 8 narrower
layers), optimised cold like A: warm-c (C's knowledge base alone) and warm-ac (A's run and C's run
distilled into one knowledge base, the state after two models). With --probe-winner N the source
runs end like `infergoal goal --probe-winner N`: their winner's one-knob neighbours are measured
and distilled as probes, and warm-ac's search then tries the one-knob swaps they rank.
Reported: trials to the goal (a miss counts budget + 1), the best score within `--best-within`
trials, and trials until within 5% of the space's best.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from kb_table import (  # noqa: E402
    BATCH_GRID,
    PRIMARY,
    TARGET,
    Measurer,
    behaviour_key,
    flat,
    grid_target,
    knob_grid,
    quiet_blocks,
    trusted,
)

from orchestrator.knowledge.fingerprint import workload_key  # noqa: E402
from orchestrator.knowledge.kb import KnowledgeBase  # noqa: E402
from orchestrator.proposers.search import SearchProposer  # noqa: E402
from orchestrator.store import Store  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
PROBES = 0  # --probe-winner N: source runs end with up to N probes of their winner
WALK = True  # --walk: the search's walk from the best trial (off: TPE only after the start-up)
STARTUP = "cover"  # --startup: the replayed runs' start-up design (the random arm is uniform random throughout;
# the source runs A and C keep TPE's random start-up: their knob sets are the measured tables' rows)
MIN_GAIN = 0.03  # the controller's default: a candidate is kept when it beats the best by 3%
HOST = {"machine": "x86_64", "cpu_count": 2, "gpus": []}  # the 2-core dev host the tables were measured on
MODELS = {"A": "forge:tiny", "B": "forge:small", "C": "forge:mid", "D": "forge:wide"}
QUIET_MAX_S = 10.0  # A's knob sets are measured while its run waits: wait briefly for a quiet host


class Table:
    """Per behaviour key: the best quiet candidate block over the median quiet baseline block of the table.

    Quiet: other processes used at most FOREIGN_MAX cores during the block (`kb_table`). A knob set
    with no quiet candidate block keeps its best block and is listed in `untrusted`."""

    def __init__(self, rows: list[dict[str, Any]], model: str, workload: str) -> None:
        sign = PRIMARY[workload][1]
        best = max if sign > 0 else min
        rows = [r for r in rows if r["model"] == model and r["workload"] == workload]
        base = [v for r in rows for v in quiet_blocks(r, "base")]
        # no quiet baseline block yet (a live table's first rows): the least disturbed one
        self.base_ref = statistics.median(base) if base else best([v for r in rows for v in r.get("base") or []], default=None)
        chosen: dict[str, tuple[bool, float | None]] = {}
        for r in rows:
            ok = trusted(r)
            if chosen.get(r["key"], (False,))[0] and not ok:
                continue  # a trusted measurement is not replaced by a busy-host one
            if r.get("error"):  # the server did not start or did not answer: the loop scores it as failed
                chosen[r["key"]] = (True, None)
                continue
            vals = quiet_blocks(r, "cand") or r["cand"]
            chosen[r["key"]] = (ok, (best(vals) / self.base_ref) ** sign)
        self.ratios: dict[str, float | None] = {k: v for k, (_, v) in chosen.items()}
        self.untrusted = sorted(k for k, (ok, _) in chosen.items() if not ok)  # see `space_untrusted`
        self.workload = workload
        self.ratios.setdefault(behaviour_key(grid_target().baseline_knobs(), workload), 1.0)

    def ratio(self, knobs: dict[str, Any]) -> float | None:
        return self.ratios[behaviour_key(knobs, self.workload)]

    @property
    def best(self) -> float:
        return max(v for v in self.ratios.values() if v is not None)

    def space(self, target: Any) -> list[float | None]:
        """The ratio of every knob set of `target`'s space (raises KeyError for one not measured)."""
        return [self.ratio(k) for k in knob_grid(target)]


def numeric_batch(target: Any, ratio: Any) -> tuple[Any, Any]:
    """(`target` with max_batch_size an int knob on a log scale over the grid's range, as the shipped
    target declares it; a scorer that reads a batch off the grid at the nearest grid value, log scale)."""
    from orchestrator.targets import load_target

    shipped = load_target(TARGET).knobs["max_batch_size"]
    knobs = dict(target.knobs)
    mine = target.knobs["max_batch_size"]
    knobs["max_batch_size"] = shipped.model_copy(update={"when": mine.when, "prior": mine.prior,
                                                         "low": min(BATCH_GRID), "high": max(BATCH_GRID)})

    def snapped(k: dict[str, Any]) -> float | None:
        if "max_batch_size" in k:
            b = int(k["max_batch_size"])
            k = dict(k) | {"max_batch_size": min(BATCH_GRID, key=lambda g: abs(math.log(g) - math.log(b)))}
        return ratio(k)

    return target.model_copy(update={"knobs": knobs}), snapped


def load_rows(*paths: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in paths if p.is_file() for line in p.read_text().splitlines() if line.strip()]


def replay_run(score: Any, target: Any, store: Store, *, label: str, seed: int, budget: int, goal_x: float,
               warm: list[dict[str, Any]] = (), priors: list[dict[str, Any]] = (), random_search: bool = False,
               stop_at_goal: bool = False, known: tuple[int, float] | None = None, startup: str = "random",
               walk: bool | None = None) -> dict[str, Any]:
    """One run of the loop's decisions against `score(knobs) -> ratio | None` (None: failed).

    `known` (best_within, the space's best): stop once everything `summarise` reports is known (the
    goal hit, a score within 5% of the space's best, and at least best_within trials). Later trials
    change none of the reported numbers; stopping there only saves replay time."""
    run = store.create_run(name=label, goal_text=f"improve throughput by {goal_x}x within {budget} trials",
                           goal_json={}, goal_hash=label, target_json={}, config_json={}, host="replay", proposer="search")
    t0 = store.create_trial(run.id, 0, commit="base", knobs=target.baseline_knobs(), rationale="baseline", proposer="baseline")
    store.finish_trial(t0.id, "kept", score=1.0, objective={"score": 1.0})
    proposer = SearchProposer(seed=seed, warm_start=warm, priors=priors, n_startup=budget + 1 if random_search else 4,
                              startup="random" if random_search else startup,
                              walk=(WALK if walk is None else walk) and not random_search)
    best, scores, hit = 1.0, [], None
    for n in range(1, budget + 1):
        cand = proposer.propose(store.list_trials(run.id), target)
        if cand is None:
            break
        t = store.create_trial(run.id, n, commit="base", knobs=cand.knobs, rationale=cand.rationale, proposer=cand.proposer)
        r = score(cand.knobs)
        if r is None:
            store.finish_trial(t.id, "failed", error="the server did not start or failed the bench")
        else:
            kept = r > best * (1 + MIN_GAIN) or (r >= goal_x and best < goal_x)
            store.finish_trial(t.id, "kept" if kept else "discarded", score=r, objective={"score": r})
            if kept:
                best = r
                store.set_best_trial(run.id, t.id)
        scores.append(r)
        if hit is None and r is not None and r >= goal_x:
            hit = n
            if stop_at_goal:
                break
        if known and hit and n >= known[0] and within(scores, known[1]):
            break
    store.set_run_status(run.id, "finished", stop_reason=f"GoalMet: #{hit}" if hit else "BudgetExhausted")
    return {"label": label, "seed": seed, "run_id": run.id, "trials_to_goal": hit or budget + 1, "goal_met": hit is not None,
            "best": round(max([s for s in scores if s is not None], default=1.0), 4), "scores": scores,
            "warm": [dict(k) for k in warm], "priors": len(priors)}


def probe_winner(score: Any, target: Any, store: Store, run_id: int, limit: int) -> int:
    """After a source run: its winner's one-knob neighbours (the product's `neighbours`, at most
    `limit`), recorded as the controller's `probe` trials: never kept, kept out of the search's
    observations by the write-back, and used by the next model's search to rank swaps. Returns how many."""
    from orchestrator.core.candidate import knob_key
    from orchestrator.core.roles import PROBE
    from orchestrator.proposers.optspace import neighbours
    from orchestrator.targets import load_target

    trials = store.list_trials(run_id)
    best = store.get_trial(store.get_run(run_id).best_trial_id)
    if best is None or best.number == 0:
        return 0
    seen, n, added = {knob_key(t.knobs) for t in trials}, max(t.number for t in trials), 0
    # The shipped target's neighbours (its max_batch_size is an int knob on a log scale: x2 and /2),
    # as the product computes them, inside the replayed space.
    shipped = load_target(TARGET)
    if not any(k.when for k in target.knobs.values()):  # a replay of the flat space: every knob active there too
        shipped = flat(shipped, target.knobs)
    for name, value, k in neighbours(shipped, dict(best.knobs)):
        if added >= limit or knob_key(k) in seen or any(k[x] not in target.knobs[x].choices for x in k):
            continue
        seen.add(knob_key(k))
        n += 1
        t = store.create_trial(run_id, n, commit="base", knobs=k, rationale=f"probe: the winner with {name}={value!r}",
                               proposer=PROBE)
        r = score(k)
        if r is None:
            store.finish_trial(t.id, "failed", error="the server did not start or failed the bench")
        else:
            store.finish_trial(t.id, "discarded", score=r, objective={"score": r})
        added += 1
    return added


def within(scores: list[float | None], target_value: float) -> int | None:
    """Trials until a score within 5% of `target_value` (1-based), None if never."""
    return next((i for i, s in enumerate(scores, 1) if s is not None and s >= 0.95 * target_value), None)


def _live(table_path: Path, model: str, model_dir: str | None, workload: str) -> Any:
    """score(knobs) from the table; a knob set not in it is measured now (real server) and appended."""
    measurer = Measurer(table_path, model, model_dir, workload, quiet_max_s=QUIET_MAX_S) if model_dir else None

    def score(knobs: dict[str, Any]) -> float | None:
        key = behaviour_key(knobs, workload)
        table = Table(load_rows(table_path), model, workload)
        if key not in table.ratios:
            if measurer is None:
                raise SystemExit(f"{table_path} lacks {key}; pass --model-a-dir to measure it (real server)")
            measurer.candidate(knobs)
            table = Table(load_rows(table_path), model, workload)
        return table.ratio(knobs)

    score.close = measurer.close if measurer else (lambda: None)  # type: ignore[attr-defined]
    return score


def run_a(workload: str, goal_x: float, budget: int, model_dir: str | None, target: Any, store: Store, kb_dir: Path,
          seed: int = 0, source: str = "A") -> dict[str, Any]:
    """A source model (A, or C) optimised cold (stops at its goal like the loop), distilled into
    `kb_dir` by the real write-back (which also sees the entries already there, as a shared
    knowledge base would)."""
    model = MODELS[source]
    score = _live(DATA / f"kb_table_{model.split(':', 1)[1]}_{workload}.jsonl", model, model_dir, workload)
    res = replay_run(score, target, store, label=f"{source}-{workload}", seed=seed, budget=budget, goal_x=goal_x, stop_at_goal=True)
    if PROBES:
        res["probes"] = probe_winner(score, target, store, res["run_id"], PROBES)
    score.close()
    distill_into(kb_dir, store, res["run_id"], model, workload)
    return res


def distill_into(kb_dir: Path, store: Store, run_id: int, model: str, workload: str) -> None:
    """The run distilled into `kb_dir` by the real write-back (which sees the entries already there)."""
    kb = KnowledgeBase([kb_dir], write_dir=kb_dir)
    kb.write_back(store, run_id, engine="hfserve", model=model, hardware=HOST, workload=workload_key([workload], 1.0))


def forced_kb(src: Path, dst: Path, applies_from: Path) -> Path:
    """`src`'s winners relabelled with `applies_from`'s workload (throughput): the similarity cannot
    tell they are from another workload, so they are enqueued. The worst case for a wrong prior
    that is real (measured), not constructed. Each keeps its own model and host."""
    from orchestrator.knowledge.entries import parse_entry, render

    workload = next(parse_entry(f).applies_to["workload"] for f in (applies_from / "findings").glob("*.md")
                    if parse_entry(f).meta.get("knobs"))
    (dst / "findings").mkdir(parents=True)
    for f in (src / "findings").glob("*.md"):
        e = parse_entry(f)
        if e.meta.get("knobs"):
            (dst / "findings" / f.name).write_text(render({**e.meta, "applies_to": {**e.applies_to, "workload": workload}}, e.body))
    return dst


def adversarial_kb(src: Path, dst: Path, worst: dict[str, Any]) -> Path:
    """A's throughput knowledge base turned against B (constructed, not measured): the winner's knobs
    replaced by B's worst measured knob set, and the observations' scores mirrored (best <-> worst).
    Same setting, so the similarity lets it through: it prices a wrong prior that nothing filters."""
    from orchestrator.knowledge.entries import parse_entry, render

    (dst / "findings").mkdir(parents=True)
    for f in (src / "findings").glob("*.md"):
        e = parse_entry(f)
        if e.meta.get("knobs"):
            obs = e.meta.get("observations") or []
            hi, lo = max(o["score"] for o in obs), min(o["score"] for o in obs)
            meta = {**e.meta, "knobs": worst, "observations": [{**o, "score": round(hi + lo - o["score"], 4)} for o in obs]}
            (dst / "findings" / f.name).write_text(render(meta, e.body))
    return dst


def summarise(rows: list[dict[str, Any]], best_within: int, table_best: float) -> dict[str, Any]:
    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 3)

    return {"runs": len(rows), "median_trials_to_goal": med([r["trials_to_goal"] for r in rows]),
            "goal_met": sum(r["goal_met"] for r in rows),
            f"median_best_in_{best_within}": med([max([s for s in r["scores"][:best_within] if s is not None], default=1.0) for r in rows]),
            "median_trials_to_5pct": med([within(r["scores"], table_best) or len(r["scores"]) + 1 for r in rows]),
            "reached_5pct": sum(within(r["scores"], table_best) is not None for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget", type=int, default=60, help="trials per replayed run on B")
    ap.add_argument("--best-within", type=int, default=20, help="the fixed budget for 'best score'")
    ap.add_argument("--goal", type=float, default=3.0, help="B's goal: improve throughput by this factor")
    ap.add_argument("--goal-a", type=float, default=3.0, help="A's throughput goal")
    ap.add_argument("--other-workload", default="prefill", choices=["decode", "prefill"],
                    help="the workload of A's second run, whose knowledge base is the misleading prior")
    ap.add_argument("--goal-a-other", type=float, default=1.3, help="A's goal on that workload (TPOT or TTFT, by this factor)")
    ap.add_argument("--budget-a", type=int, default=20)
    ap.add_argument("--seed-a", type=int, default=0, help="the seed of A's runs (another seed: another run of A, "
                    "another knowledge base; its knob sets are measured live with --model-a-dir)")
    ap.add_argument("--model-a-dir", help="forge:tiny's directory: measure A's missing knob sets live (real server)")
    ap.add_argument("--seed-c", type=int, default=0, help="the seed of model C's run (the second source model, "
                    "forge:mid: arms warm-c and warm-ac)")
    ap.add_argument("--goal-c", type=float, default=10.0, help="C's throughput goal (10: out of reach, C runs its budget)")
    ap.add_argument("--model-c-dir", help="forge:mid's directory: measure C's missing knob sets live (real server)")
    ap.add_argument("--arms", nargs="+", default=["cold", "warm", "warm-enqueue-only", "misled-workload", "misled-forced",
                                                  "misled-adversarial", "random"],
                    help="also: warm-c (C's knowledge base), warm-ac (A's and C's runs distilled into one knowledge base; "
                    "with --probe-winner, its search tries the swaps the probes rank), misled-ac-workload (A's and C's "
                    "runs on the other workload distilled into one knowledge base), misled-ac-forced (both relabelled as "
                    "their throughput settings, so the similarity cannot filter them)")
    ap.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                    help="pin a knob (a smaller space, e.g. when only part of the table could be measured)")
    ap.add_argument("--conditional", action="store_true",
                    help="the shipped target's space: the knobs server.py ignores are inactive (`when`): decode_loop and "
                    "kv_cache with batching on, max_batch_size with it off (default: every knob active)")
    ap.add_argument("--probe-winner", type=int, default=0, metavar="N", help="each source run ends by measuring up to N "
                    "one-knob neighbours of its winner, like `infergoal goal --probe-winner N` (0: off)")
    ap.add_argument("--target", default="B", choices=["B", "C", "D"], help="the model replayed on: B (forge:small); "
                    "C (forge:mid), with B as the second source model instead (the -c arms use B's run); D (forge:wide, "
                    "held out: measured after the swaps were designed on A, B and C)")
    ap.add_argument("--numeric-batch", action="store_true",
                    help="the search sees max_batch_size as the shipped target declares it (int, log scale, 1..32) "
                         "instead of the table's categorical grid; a batch off the grid is scored at the nearest grid "
                         "value on the log scale (the table measured only the grid). Cold arm only: exercises the walk")
    ap.add_argument("--walk", default="on", choices=["on", "off"],
                    help="the search's walk from the best trial (SearchProposer(walk=...)); off: before 2026-12-02 evening")
    ap.add_argument("--startup", default="cover", choices=["cover", "random"],
                    help="the search's start-up design (SearchProposer(startup=...)); random: TPE's own, before 2026-12-02")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    global PROBES, STARTUP, WALK
    PROBES, STARTUP, WALK = args.probe_winner, args.startup, args.walk == "on"
    fixed = {k: (int(v) if v.isdigit() else v) for k, v in (f.split("=", 1) for f in args.fix)}
    target = grid_target(fixed=fixed, conditional=args.conditional)
    tmp = Path(tempfile.mkdtemp(prefix="kb_replay_"))
    store = Store(f"sqlite:///{tmp / 'replay.db'}")
    # --target C: rotated (B becomes the second source); --target D: a model none of this was designed on
    tgt, second = args.target, ("B" if args.target == "C" else "C")
    table_b = Table(load_rows(DATA / f"kb_table_{MODELS[tgt].split(':', 1)[1]}_throughput.jsonl"), MODELS[tgt], "throughput")
    try:  # before anything is measured for A: B's table must cover the space
        space = [v for v in table_b.space(target) if v is not None]
    except KeyError as e:
        raise SystemExit(f"the table of model {tgt} lacks {e}; measure it with benchmarks/kb_table.py (or --fix a smaller space)") from None
    best = max(space)
    a_thr = run_a("throughput", args.goal_a, args.budget_a, args.model_a_dir, target, store, tmp / "kb_a", seed=args.seed_a)
    misled = any(a.startswith("misled") for a in args.arms)  # only they need A's other-workload run
    a_dec = run_a(args.other_workload, args.goal_a_other, args.budget_a, args.model_a_dir, target, store, tmp / "kb_a_other",
                  seed=args.seed_a) if misled else None
    forced = forced_kb(tmp / "kb_a_other", tmp / "kb_forced", tmp / "kb_a") if misled else None
    grid = knob_grid(target)
    # B's worst measured knob set other than the baseline's own (the proposer never repeats that one)
    worst = min((k for k in grid if table_b.ratio(k) is not None and k != target.baseline_knobs()), key=lambda k: table_b.ratio(k))
    adversarial = adversarial_kb(tmp / "kb_a", tmp / "kb_adversarial", worst) if misled else None
    ac_other = {"misled-ac-workload", "misled-ac-forced"} & set(args.arms)  # two sources, both from the other workload
    if ac_other:
        c_dec = run_a(args.other_workload, args.goal_a_other, args.budget_a, args.model_c_dir, target, store,
                      tmp / "kb_ac_other", seed=args.seed_c, source=second)
        shutil.copytree(tmp / "kb_a_other", tmp / "kb_ac_other", dirs_exist_ok=True)  # then A's run beside C's
        forced_kb(tmp / "kb_ac_other", tmp / "kb_ac_forced", tmp / "kb_a")
    two = {"warm-c", "warm-ac"} & set(args.arms)  # a second source model: C optimised cold, alone and after A
    c_thr = run_a("throughput", args.goal_c, args.budget_a, args.model_c_dir, target, store, tmp / "kb_c", seed=args.seed_c,
                  source=second) if two else None
    if "warm-ac" in args.arms:  # one knowledge base that saw A's run, then C's (C's write-back sees A's entries)
        shutil.copytree(tmp / "kb_a", tmp / "kb_ac")
        distill_into(tmp / "kb_ac", store, c_thr["run_id"], MODELS[second], "throughput")
    kbs = {"cold": None, "warm": tmp / "kb_a", "warm-enqueue-only": tmp / "kb_a", "misled-workload": tmp / "kb_a_other",
           "misled-forced": forced, "misled-adversarial": adversarial, "random": None, "warm-c": tmp / "kb_c",
           "warm-ac": tmp / "kb_ac", "misled-ac-workload": tmp / "kb_ac_other", "misled-ac-forced": tmp / "kb_ac_forced"}
    here = {"engine": "hfserve", "model": MODELS[tgt], "hardware": HOST, "workload": workload_key(["throughput"], 1.0)}
    plans, priors = {}, {}
    for arm in args.arms:
        d = kbs[arm]
        kb = KnowledgeBase([d], write_dir=tmp / f"w-{arm}") if d else None
        plans[arm] = kb.priors(**here) if kb else []
        # "warm-enqueue-only": the mechanism before search priors (A's winner enqueued, nothing else)
        priors[arm] = kb.prior_observations(**here) if kb and arm != "warm-enqueue-only" else []
    out: dict[str, Any] = {"A": {"throughput": a_thr, args.other_workload: a_dec},
                           "C": {"throughput": c_thr, args.other_workload: c_dec if ac_other else None},
                           "priors": plans, "fixed": fixed,
                           "untrusted": table_b.untrusted, "goal": args.goal, "runs": {},
                           "db": str(tmp / "replay.db")}  # every replayed run, trial by trial
    score, search_target = table_b.ratio, target
    if args.numeric_batch:
        if set(args.arms) != {"cold"}:
            raise SystemExit("--numeric-batch replays the cold arm only (--arms cold)")
        search_target, score = numeric_batch(target, table_b.ratio)
    for arm in args.arms:
        warm = [p["knobs"] for p in plans[arm]]
        # Seeds 1000 apart: SearchProposer seeds each step with seed + len(history), so seeds 0, 1, 2
        # would replay one random stream shifted by a step (runs s and s+1 share most proposals).
        out["runs"][arm] = [replay_run(score, search_target, store, label=f"{tgt}-{arm}-s{s}", seed=1000 * s, budget=args.budget,
                                       goal_x=args.goal, warm=warm, priors=priors[arm], random_search=arm == "random", startup=STARTUP,
                                       known=(args.best_within, best))
                            for s in range(args.seeds)]
    in_space = {behaviour_key(k, "throughput") for k in knob_grid(target)}
    out["untrusted"] = [k for k in table_b.untrusted if k in in_space]
    out["space"] = {"knob_sets": len(space), "best": round(best, 4), "meet_goal": sum(v >= args.goal for v in space),
                    "within_5pct": sum(v >= 0.95 * best for v in space)}
    out["summary"] = {arm: summarise(rows, args.best_within, best) for arm, rows in out["runs"].items()}
    print(json.dumps({k: out[k] for k in ("space", "untrusted", "goal", "summary")}, indent=1))
    print(json.dumps({arm: [(p["entry"], p["similarity"], p["weight"], p["knobs"]) for p in ps] for arm, ps in plans.items()}, indent=1))
    print(json.dumps({arm: len(ps) for arm, ps in priors.items()}))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
