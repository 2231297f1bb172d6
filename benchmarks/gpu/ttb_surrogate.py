"""A surrogate of hfserve_gpu's knob space fitted from every stored GPU run of the 7B (failures included).

    python benchmarks/gpu/ttb_surrogate.py [--json out.json]     # prints each knob level's fitted effect

Read by `ttb_replay.py`, which replays the search on it. What it is fitted from: every search trial of
the run databases under benchmarks/gpu/results/ whose goal is TPOT + throughput on the 7B (the H200 runs
and the H100 cold run), its screening score (the first `trial.why` of the trial), its status and its
GPU-seconds (`timings.trial`).

- Score: log(score) = the run's own offset (each run's baseline measured its own TPOT and throughput) +
  the sum of the trial's knob effects, fitted by ridge least squares (the penalty with the least
  leave-one-out error: a level few trials carried stays near its default's effect). Effects: each engine; batching on per engine family; log2 of
  the batch per engine family, in two pieces (up to 16, then 16..64: the waves of a burst of 16 and of 64);
  every other knob level (the knob's default is 0). A level no stored trial carried is predicted as its
  default and *marked* (`Prediction.unmeasured`). Screened-out trials count (their short score is what
  was measured); a score stopped early is a bound and counts as one.
- Failures: a level every failed trial of its kind carried (server errors at the bench, a start-up crash)
  and no trial that served carried is a crash level (`Surrogate.crash_levels`); a knob set holding one
  fails. Invalid trials (the accuracy gate) are left out: the runs' own gate decided on noise there.
- GPU-seconds per trial: the median `timings.trial` per engine family and outcome (full bench, screened
  out, failed), per baseline / sentinel measurement, and before the first trial.
The scale of the replay's scores is the H100 cold run's (today's knob space and code): `offset`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sqlite3
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

from orchestrator.targets import load_target  # noqa: E402

__all__ = ["RESULTS", "Prediction", "Surrogate", "features", "fit", "load_trials"]

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = ROOT / "examples" / "targets" / "hfserve_gpu.toml"
# The ridge penalty is the one of these with the least leave-one-out error (`_loo`).
RIDGES = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
# The run whose offset sets the replay's scale: today's space and code, cold.
SCALE_RUN = "h100_ttb_cold_7b_seed1_2026-12-06.db"


def family(engine: str) -> str:
    return {"fast-graphs": "graphs", "fast-eager": "eager"}.get(engine, "hf")


def features(knobs: dict[str, Any], defaults: dict[str, Any]) -> dict[str, float]:
    """The knob set's features (name -> value); a knob at its default adds none."""
    eng = knobs.get("engine", "hf-generate")
    fam = family(eng)
    out: dict[str, float] = {}
    if eng != "hf-generate":
        out[f"engine={eng}"] = 1.0
    if knobs.get("batching") == "on":
        out[f"batching=on|{fam}"] = 1.0
        lb = math.log2(max(int(knobs.get("max_batch_size", 8)), 1))
        out[f"log2 batch<=16|{fam}"] = min(lb, 4.0)
        out[f"log2 batch>16|{fam}"] = max(lb - 4.0, 0.0)
    for k, v in knobs.items():
        if k in ("engine", "batching", "max_batch_size") or v == defaults.get(k):
            continue
        out[f"{k}={v}"] = 1.0
    return out


@dataclass(frozen=True)
class StoredTrial:
    run: str
    number: int
    status: str
    knobs: dict[str, Any]
    score: float | None
    seconds: float | None
    error: str


def load_trials(results: Path = RESULTS, only: str | None = None, card: str = "") -> list[StoredTrial]:
    """Every search trial (and baseline / sentinel, for their GPU-seconds) of the 7B TPOT + throughput runs
    (`only`: of that one database, whatever its model; `card`: of the runs on that card alone, `h100` or `h200`)."""
    out = []
    tmp = Path(tempfile.mkdtemp())
    for db in sorted(results.glob(only or f"{card}*.db")):
        # read from a copy: opening a WAL database, even read-only, leaves -wal / -shm files beside it
        shutil.copyfile(db, tmp / "run.db")
        con = sqlite3.connect(tmp / "run.db")
        try:
            goal_json, target_json = con.execute("select goal_json, target_json from runs order by id limit 1").fetchone()
            metrics = sorted(o["metric"] for o in json.loads(goal_json).get("objectives", []))
            model = json.loads(target_json or "{}").get("model")
            if metrics != ["throughput", "tpot"] or (model != "forge:7b-peaked" and only is None):
                continue
            why = {}
            for tid, data in con.execute("select trial_id, data_json from events where kind='trial.why' order by id"):
                why.setdefault(tid, json.loads(data).get("score"))
            for tid, number, status, proposer, knobs, timings, error in con.execute(
                    "select id, number, status, proposer, knobs_json, timings_json, error from trials order by number"):
                t = json.loads(timings) if timings else {}
                role = proposer if proposer in ("baseline", "sentinel") or number == 0 else "search"
                if proposer not in ("search", "baseline", "sentinel") and number != 0:
                    continue
                out.append(StoredTrial(db.name, number, status if role == "search" else role, json.loads(knobs or "{}"),
                                       why.get(tid), t.get("trial"), error or ""))
        finally:
            con.close()
    shutil.rmtree(tmp)
    return out


@dataclass(frozen=True)
class Prediction:
    score: float
    fails: bool
    unmeasured: tuple[str, ...]


@dataclass
class Surrogate:
    weights: dict[str, float]
    offsets: dict[str, float]
    offset: float
    measured: set[str]
    crash_levels: set[str]
    seconds: dict[str, float]
    defaults: dict[str, Any]
    residual_sd: float
    ridge: float
    rows: int = 0
    runs: list[str] = field(default_factory=list)
    weight_sd: dict[str, float] = field(default_factory=dict)
    """Each weight's posterior sd (the fit's residual sd through the ridge normal equations)."""

    def perturbed(self, rng: np.random.Generator) -> Surrogate:
        """The same surrogate with each fitted weight redrawn from its posterior (`weight_sd`): another space the
        stored trials fit as well, for a gain that must not hold only for this one fit."""
        w = {n: float(rng.normal(v, self.weight_sd.get(n, 0.0))) for n, v in self.weights.items()}
        return dataclasses.replace(self, weights=w)

    def predict(self, knobs: dict[str, Any]) -> Prediction:
        f = features(knobs, self.defaults)
        log_s = self.offset + sum(self.weights.get(n, 0.0) * x for n, x in f.items())
        levels = {f"{k}={v}" for k, v in knobs.items()}
        return Prediction(math.exp(log_s), bool(levels & self.crash_levels),
                          tuple(sorted(n for n in f if n not in self.measured)))

    def cost(self, knobs: dict[str, Any], outcome: str) -> float:
        """GPU-seconds of a trial: outcome `full`, `screened` or `failed`."""
        if outcome == "failed":
            return self.seconds["failed"]
        fam = family(knobs.get("engine", "hf-generate"))
        return self.seconds.get(f"{outcome}|{fam}", self.seconds[outcome])

    def best_known(self, target: Any, results: Path = RESULTS) -> tuple[float, dict[str, Any]]:
        """The highest predicted score among the knob sets the stored runs measured (the best known
        setting, on the surrogate's scale): what "within 5% of the best" is measured against."""
        scored = [target.validate_knobs(t.knobs) for t in load_trials(results)
                  if t.status in ("kept", "discarded") and t.score and t.knobs.get("engine")]
        return max(((self.predict(k).score, k) for k in scored), key=lambda x: x[0])

    def best(self, target: Any) -> tuple[float, dict[str, Any]]:
        """The highest predicted score in the target's space outside the crash levels (coordinate ascent
        from every engine x batching x batch; the model is additive, so one pass per knob settles it)."""
        best: tuple[float, dict[str, Any]] = (0.0, {})
        for eng in target.knobs["engine"].choices:
            for on in ("off", "on"):
                for b in ((2, 4, 8, 16, 32, 64) if on == "on" else (8,)):
                    k = target.validate_knobs({"engine": eng, "batching": on} | ({"max_batch_size": b} if on == "on" else {}))
                    for _ in range(2):
                        for name, spec in target.knobs.items():
                            if name in ("engine", "batching", "max_batch_size") or spec.type != "categorical":
                                continue
                            trial = []
                            for c in spec.choices:
                                try:
                                    kk = target.validate_knobs(k | {name: c})
                                except ValueError:
                                    continue
                                p = self.predict(kk)
                                if not p.fails:
                                    trial.append((p.score, kk))
                            if trial:
                                k = max(trial, key=lambda x: x[0])[1]
                    p = self.predict(k)
                    if not p.fails and p.score > best[0]:
                        best = (p.score, k)
        return best


def _solve(x: np.ndarray, y: np.ndarray, n_runs: int, ridge: float) -> np.ndarray:
    reg = np.diag([1e-6] * n_runs + [ridge] * (x.shape[1] - n_runs))  # the runs' offsets are not shrunk
    return np.linalg.solve(x.T @ x + reg, x.T @ y)


def _loo(x: np.ndarray, y: np.ndarray, n_runs: int, ridge: float) -> float:
    """Mean squared leave-one-out error of the fit (log score)."""
    err = [float(y[i] - x[i] @ _solve(np.delete(x, i, 0), np.delete(y, i), n_runs, ridge)) for i in range(len(y))]
    return float(np.mean(np.square(err)))


def fit(results: Path = RESULTS, target: Any = None, card: str = "") -> Surrogate:
    """The surrogate fitted on every stored 7B run (`card`: on that card's runs alone, `h100` or `h200`)."""
    target = target or load_target(TARGET)
    defaults = {k: v.default for k, v in target.knobs.items()}
    trials = load_trials(results, card=card)
    ok = [t for t in trials if t.status in ("kept", "discarded") and t.score and t.knobs.get("engine")]
    runs = sorted({t.run for t in ok})
    rows = [features(t.knobs, defaults) for t in ok]
    names = sorted({n for r in rows for n in r})
    x = np.zeros((len(ok), len(runs) + len(names)))
    for i, (t, r) in enumerate(zip(ok, rows, strict=True)):
        x[i, runs.index(t.run)] = 1.0
        for n, v in r.items():
            x[i, len(runs) + names.index(n)] = v
    y = np.log([t.score for t in ok])
    ridge = min(RIDGES, key=lambda lam: _loo(x, y, len(runs), lam))
    w = _solve(x, y, len(runs), ridge)
    resid = y - x @ w
    reg = np.diag([1e-6] * len(runs) + [ridge] * len(names))
    sd = float(np.std(resid)) * np.sqrt(np.diag(np.linalg.inv(x.T @ x + reg)))
    offsets = dict(zip(runs, w[: len(runs)].tolist(), strict=True))
    weights = dict(zip(names, w[len(runs):].tolist(), strict=True))
    # crash levels: carried by every failed trial that crashed or got server errors, and by no trial that served
    served = {f"{k}={v}" for t in ok for k, v in t.knobs.items()}
    crashed = [t for t in trials if t.status == "failed" and ("server_error" in t.error or "start-up failure (crash" in t.error)]
    crash = set.intersection(*[{f"{k}={v}" for k, v in t.knobs.items()} for t in crashed]) - served if crashed else set()
    secs: dict[str, list[float]] = {}
    for t in trials:
        if t.seconds is None:
            continue
        if t.status in ("baseline", "sentinel"):
            key = [t.status]
        elif t.status == "failed":
            key = ["failed"]
        elif t.status in ("kept", "discarded"):
            out = "screened" if t.error.startswith("screened out at") else "full"
            key = [out, f"{out}|{family(t.knobs.get('engine', 'hf-generate'))}"]
        else:
            continue
        for k in key:
            secs.setdefault(k, []).append(t.seconds)
    seconds = {k: statistics.median(v) for k, v in secs.items()}
    seconds["before_first"] = 21.0  # the store, the model check and the first deploy's start (time_to_best.py's split)
    return Surrogate(weights, offsets, offsets.get(SCALE_RUN, statistics.mean(offsets.values())), set(names), crash,
                     seconds, defaults, float(np.std(resid)), ridge, len(ok), runs,
                     dict(zip(names, sd[len(runs):].tolist(), strict=True)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    target = load_target(TARGET)
    s = fit(target=target)
    best, knobs = s.best(target)
    print(f"fitted on {s.rows} scored trials of {len(s.runs)} runs; residual sd {s.residual_sd:.3f} (log score), ridge {s.ridge:g}")
    print(f"crash levels: {sorted(s.crash_levels)}")
    print("GPU-s per trial: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(s.seconds.items())))
    for n, w in sorted(s.weights.items(), key=lambda x: -abs(x[1])):
        print(f"  {n:32s} x{math.exp(w):6.2f}")
    print(f"best predicted: {best:.2f}x at {' '.join(f'{k}={v}' for k, v in knobs.items())}")
    known, kk = s.best_known(target)
    print(f"best known (measured) setting, predicted: {known:.2f}x at {' '.join(f'{k}={v}' for k, v in kk.items())}")
    if args.json:
        args.json.write_text(json.dumps({"weights": s.weights, "offsets": s.offsets, "crash_levels": sorted(s.crash_levels),
                                         "seconds": s.seconds, "best": best, "best_knobs": knobs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
