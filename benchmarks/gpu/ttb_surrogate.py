"""A surrogate of hfserve_gpu's knob space fitted from every stored GPU run of the 7B (failures included).

    python benchmarks/gpu/ttb_surrogate.py [--json out.json]     # prints each knob level's fitted effect

Read by `ttb_replay.py`, which replays the search on it. What it is fitted from: every search trial of
the run databases under benchmarks/gpu/results/ whose goal is TPOT + throughput on the 7B (H200 and H100 runs),
its measured objective values, its screening score (the first `trial.why` of the trial), its status and its
GPU-seconds (`timings.trial`).

- Response: each trial's measured value, log sqrt(throughput / TPOT p50) (`StoredTrial.value`: its score's
  numerator; the score divides it by the run's baseline, whose own value ranged a factor of 2.4 over the stored runs) =
  an offset + the sum of the trial's knob effects, fitted by ridge least squares (the penalty with the least
  leave-one-out error over the trials whose offset keeps two others: a level few trials carried stays near its
  default's effect). Offsets (`_group`): one per card for the runs of today's space and code (`todays_runs`: one
  engine on one card measures a knob set alike in every run, as `time_to_best.py` and best_known.json assume), one
  per run for the earlier runs (their engine code moved between runs). Effects: each engine; batching on per
  engine family; log2 of the batch per engine family, in two pieces (up to 16, then 16..64: the waves of a burst
  of 16 and of 64); every other knob level (the knob's default is 0). A level no stored trial carried is predicted
  as its default and *marked* (`Prediction.unmeasured`).
- Why values, not scores: time to best is judged on a trial's closeness to its card's best known setting (measured
  values). Predicting that closeness for each trial of today's runs from the fit made without it, the values fit
  errs RMS 0.140 (log), the fit on scores with an offset per run 0.271 (`closeness_error`): that fit cannot place a
  run whose trials share few levels with the others (it put the H100's seed-1 #23, 70% of the best known, measured,
  above every setting the cards measured within 5% of their best) and learns nothing from a one-trial run. It stays
  in the replay's robustness table (`fit(values=False)`).
- Full-bench trials only (`_scored`): a screened-out trial's short-bench values are a bound, not a value.
  Read as values they make the full-bench trials' leave-one-out error worse (RMS 0.249 in log against 0.138);
  that fit (`fit(screened=True)`) stays in the replay's robustness table.
- Interactions (`fit(residual_kernel=True)`, in the robustness table): the additive fit's residuals
  smoothed over the knob space by a Gaussian process (`Residuals`: a Laplacian kernel on the L1 distance
  between feature vectors; variance, length and noise with the least leave-one-out error). It lowers the
  leave-one-out error only to 0.132: 79 full-bench trials do not resolve interactions beyond the noise.
  The first lines of the output and `--json` give the three errors.
- Failures: a level every failed trial of its kind carried (server errors at the bench, a start-up crash)
  and no trial that served carried is a crash level (`Surrogate.crash_levels`); a knob set holding one
  fails. Invalid trials (the accuracy gate) are left out: the runs' own gate decided on noise there.
- GPU-seconds per trial: the median `timings.trial` per engine family and outcome (full bench, screened
  out, failed), per baseline / sentinel measurement, and before the first trial, over the runs of today's
  space and code (`todays_runs`; every run's where none of them measured one: eager and hf trials screened out).
- Launch noise (`launch_noise`): how far one knob set's score moves between launches within a run (its
  search trial and the paired rounds that launched it again against the same run's baseline), pooled over
  the runs: the replay's per-trial noise.
The scale of the replay's scores is the H100's: its offset less the median measured value of its runs' baselines
(`offset`), so a score reads as the loop's ratio to an H100 run's baseline.
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

from orchestrator.targets import load_target  # noqa: E402

__all__ = ["RESULTS", "LaunchNoise", "Prediction", "Surrogate", "features", "fit", "launch_noise", "load_trials",
           "scale_fingerprint"]

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = ROOT / "examples" / "targets" / "hfserve_gpu.toml"
# The ridge penalty is the one of these with the least leave-one-out error (`_loo`).
RIDGES = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
# A run of the card whose offset sets the replay's scale (its card's, on measured values; its own, on scores) and whose
# host a warm replay reads its knowledge base as.
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
    value: float | None = None
    """log of the geometric mean of its measured objectives, throughput / TPOT (`_log_value`); None without them."""


# The knobs of engine steps 10-14: a run whose trials carry one searched today's space with today's engine code.
TODAYS_KNOBS = frozenset({"decode_attn", "mm_glu", "mm_norm", "pdl", "gc_freeze", "prefill_rounds", "kv_cache_dtype"})


def todays_runs(trials: list[StoredTrial]) -> set[str]:
    """The runs of today's space and code (a trial of theirs carries a knob of `TODAYS_KNOBS`)."""
    return {t.run for t in trials if TODAYS_KNOBS & set(t.knobs)}


def _log_value(objective_json: str | None) -> float | None:
    """log sqrt(throughput / TPOT p50) of a trial's measured objectives: the score's numerator, the same on a card
    whatever its run's baseline measured."""
    o = json.loads(objective_json or "{}")
    if not o.get(TPOT) or not o.get(THROUGHPUT):
        return None
    return 0.5 * (math.log(o[THROUGHPUT]) - math.log(o[TPOT]))


def scale_fingerprint(results: Path = RESULTS) -> dict[str, Any]:
    """The host fingerprint (`run.start`) of the run whose offset sets the replay's scale: the H100 a warm replay
    reads its knowledge base as."""
    for _, con in _runs(results, SCALE_RUN):
        row = con.execute("select data_json from events where kind = 'run.start' order by id limit 1").fetchone()
        return dict(json.loads(row[0])["fingerprint"])
    raise FileNotFoundError(f"{results / SCALE_RUN}: the scale run's database is missing")


def _runs(results: Path, only: str | None = None, card: str = "") -> Iterator[tuple[str, sqlite3.Connection]]:
    """(database name, connection) of each 7B TPOT + throughput run under `results` (`only`: that one database,
    whatever its model; `card`: the runs on that card alone, `h100` or `h200`), each read from a copy: opening a WAL
    database, even read-only, leaves -wal / -shm files beside it."""
    tmp = Path(tempfile.mkdtemp())
    try:
        for db in sorted(results.glob(only or f"{card}*.db")):
            shutil.copyfile(db, tmp / "run.db")
            con = sqlite3.connect(tmp / "run.db")
            try:
                goal_json, target_json = con.execute("select goal_json, target_json from runs order by id limit 1").fetchone()
                metrics = sorted(o["metric"] for o in json.loads(goal_json).get("objectives", []))
                model = json.loads(target_json or "{}").get("model")
                if metrics == ["throughput", "tpot"] and (model == "forge:7b-peaked" or only is not None):
                    yield db.name, con
            finally:
                con.close()
    finally:
        shutil.rmtree(tmp)


def load_trials(results: Path = RESULTS, only: str | None = None, card: str = "") -> list[StoredTrial]:
    """Every search trial (and baseline / sentinel, for their GPU-seconds) of the 7B TPOT + throughput runs
    (`only`: of that one database, whatever its model; `card`: of the runs on that card alone, `h100` or `h200`)."""
    out = []
    for name, con in _runs(results, only, card):
        why = {}
        for tid, data in con.execute("select trial_id, data_json from events where kind='trial.why' order by id"):
            why.setdefault(tid, json.loads(data).get("score"))
        for tid, number, status, proposer, knobs, timings, error, objective in con.execute(
                "select id, number, status, proposer, knobs_json, timings_json, error, objective_json from trials "
                "order by number"):
            t = json.loads(timings) if timings else {}
            role = proposer if proposer in ("baseline", "sentinel") or number == 0 else "search"
            if proposer not in ("search", "baseline", "sentinel") and number != 0:
                continue
            out.append(StoredTrial(name, number, status if role == "search" else role, json.loads(knobs or "{}"),
                                   why.get(tid), t.get("trial"), error or "", _log_value(objective)))
    return out


@dataclass(frozen=True)
class LaunchNoise:
    sd: float  # pooled standard deviation of log(score) between launches of one knob set within a run
    sets: int  # knob sets launched more than once
    df: int  # degrees of freedom (launches less one per knob set)
    runs: tuple[str, ...]


TPOT, THROUGHPUT = "decode:tpot_ms_p50", "throughput:output_throughput"


def launch_noise(results: Path = RESULTS, card: str = "") -> LaunchNoise:
    """How much one knob set's score moves from launch to launch within a 7B run: its search trial's measured
    TPOT p50 and throughput and those of every later launch of the same knob set in the run (the paired rounds'
    candidate halves, retries), as log(score) against the run's one baseline (half the log of throughput over
    TPOT: the geometric mean of the two speedups, up to the run's constant); the standard deviation within each
    knob set, pooled over knob sets and runs. The baseline's own spread is not in it: within a run every trial
    divides by the same baseline measurement, so it moves the run's offset, not one trial against another."""
    num, df, sets, runs = 0.0, 0, 0, []
    for name, con in _runs(results, card=card):
        groups: dict[str, list[float]] = {}
        for number, knobs, obj in con.execute("select number, knobs_json, objective_json from trials order by number"):
            value = _log_value(obj)
            if number == 0 or value is None:
                continue
            groups.setdefault(json.dumps(json.loads(knobs), sort_keys=True), []).append(value)
        baseline = json.dumps(json.loads(con.execute("select knobs_json from trials where number = 0").fetchone()[0]),
                              sort_keys=True)
        for key, v in groups.items():
            if key != baseline and len(v) > 1:
                num += statistics.variance(v) * (len(v) - 1)
                df += len(v) - 1
                sets += 1
                if name not in runs:
                    runs.append(name)
    return LaunchNoise(math.sqrt(num / df) if df else math.nan, sets, df, tuple(runs))


# The residual kernel's grid (`Residuals.fit`): signal variance, length (L1 feature distance), noise variance (log, the fit's response).
GP_GRID = ((0.005, 0.01, 0.02, 0.04, 0.08), (0.5, 1.0, 2.0, 4.0), (0.004, 0.0064, 0.01, 0.02))


def _l1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The L1 distance between each row of `a` and each row of `b` (feature vectors)."""
    return np.abs(a[:, None, :] - b[None, :, :]).sum(axis=2)


@dataclass
class Residuals:
    """A Gaussian process over the additive fit's residuals (log, the fit's response): the interactions it cannot hold."""

    names: list[str]
    x: np.ndarray  # the measured trials' feature vectors, columns `names`
    alpha: np.ndarray  # (K + noise I)^-1 residuals
    var: float
    length: float
    noise: float

    def __call__(self, f: dict[str, float]) -> float:
        if not len(self.alpha) or self.var == 0.0:
            return 0.0
        v = np.array([f.get(n, 0.0) for n in self.names])  # a level no trial measured adds no distance
        return float(self.var * np.exp(-np.abs(self.x - v).sum(axis=1) / self.length) @ self.alpha)

    @staticmethod
    def kernel(x: np.ndarray, var: float, length: float) -> np.ndarray:
        return var * np.exp(-_l1(x, x) / length)

    @classmethod
    def fit(cls, names: list[str], x: np.ndarray, resid: np.ndarray, var: float, length: float, noise: float) -> Residuals:
        k = cls.kernel(x, var, length) + noise * np.eye(len(resid))
        return cls(names, x, np.linalg.solve(k, resid), var, length, noise)


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
    residuals: Residuals | None = None
    """The interactions (`Residuals`); None: the additive fit alone."""
    loo: dict[str, float] = field(default_factory=dict)
    """Leave-one-out RMS error (log, the fit's response): `additive`, and `with_residuals` where `residuals` is fitted."""
    screened: bool = False
    """Fitted with the screened-out trials' short-bench scores read as values (`_scored`)."""
    values: bool = True
    """Fitted on measured values, today's runs sharing their card's offset (`_group`); False: on each trial's score,
    one offset per run."""

    def perturbed(self, rng: np.random.Generator) -> Surrogate:
        """The same surrogate with each fitted weight redrawn from its posterior (`weight_sd`): another space the
        stored trials fit as well, for a gain that must not hold only for this one fit."""
        w = {n: float(rng.normal(v, self.weight_sd.get(n, 0.0))) for n, v in self.weights.items()}
        return dataclasses.replace(self, weights=w)

    def predict(self, knobs: dict[str, Any]) -> Prediction:
        f = features(knobs, self.defaults)
        log_s = self.offset + sum(self.weights.get(n, 0.0) * x for n, x in f.items())
        if self.residuals is not None:
            log_s += self.residuals(f)
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
        scored = [target.validate_knobs(t.knobs) for t in load_trials(results) if _scored(t, self.screened)]
        return max(((self.predict(k).score, k) for k in scored), key=lambda x: x[0])

    def best(self, target: Any, results: Path = RESULTS) -> tuple[float, dict[str, Any]]:
        """The highest predicted score in the target's space outside the crash levels (coordinate ascent
        from every engine x batching x batch and from every measured knob set, two passes per knob)."""
        best: tuple[float, dict[str, Any]] = (0.0, {})
        starts = [target.validate_knobs({"engine": eng, "batching": on} | ({"max_batch_size": b} if on == "on" else {}))
                  for eng in target.knobs["engine"].choices for on in ("off", "on")
                  for b in ((2, 4, 8, 16, 32, 64) if on == "on" else (8,))]
        if self.residuals is not None:
            starts += [target.validate_knobs(t.knobs) for t in load_trials(results) if _scored(t, self.screened)]
        for k in starts:
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


def _scored(t: StoredTrial, screened: bool = False) -> bool:
    """A search trial whose full bench scored it: what the fit reads (`screened`: a screened-out trial's short-bench
    values too, read as values: its full-bench trials' leave-one-out error is far worse with them, module docstring)."""
    return (t.status in ("kept", "discarded") and bool(t.score) and bool(t.knobs.get("engine"))
            and (screened or not t.error.startswith("screened out at")))


def _solve(x: np.ndarray, y: np.ndarray, n_runs: int, ridge: float) -> np.ndarray:
    reg = np.diag([1e-6] * n_runs + [ridge] * (x.shape[1] - n_runs))  # the runs' offsets are not shrunk
    return np.linalg.solve(x.T @ x + reg, x.T @ y)


def _held_out(x: np.ndarray, n_runs: int) -> list[int]:
    """The trials leave-one-out predicts: those whose offset (`_group`) keeps at least two other scored trials
    (without them nothing measured the offset, and the error says nothing about the knobs); all when none does."""
    per_run = x[:, :n_runs].sum(axis=0)
    out = [i for i in range(len(x)) if per_run[int(np.argmax(x[i, :n_runs]))] >= 3]
    return out or list(range(len(x)))


def _loo(x: np.ndarray, y: np.ndarray, n_runs: int, ridge: float, held: list[int] | None = None) -> float:
    """Mean squared leave-one-out error of the fit (log, the fit's response) over `held` (default `_held_out`)."""
    err = [float(y[i] - x[i] @ _solve(np.delete(x, i, 0), np.delete(y, i), n_runs, ridge))
           for i in (_held_out(x, n_runs) if held is None else held)]
    return float(np.mean(np.square(err)))


def _group(t: StoredTrial, now: set[str], values: bool) -> str:
    """The offset a trial shares: its card's for a run of today's space and code read on measured values (one engine
    and one card measure alike whatever the run's baseline), else its run's (a ratio to that run's baseline, or
    earlier engine code)."""
    return f"{t.run.split('_')[0]} today" if values and t.run in now else t.run


def _design(ok: list[StoredTrial], defaults: dict[str, Any], values: bool = False,
            now: set[str] = frozenset()) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """The fit's design matrix (one column per offset, `_group`, then per feature), the responses (log measured
    value with `values`, else log score), the offsets' names and the feature names."""
    runs = sorted({_group(t, now, values) for t in ok})
    rows = [features(t.knobs, defaults) for t in ok]
    names = sorted({n for r in rows for n in r})
    x = np.zeros((len(ok), len(runs) + len(names)))
    for i, (t, r) in enumerate(zip(ok, rows, strict=True)):
        x[i, runs.index(_group(t, now, values))] = 1.0
        for n, v in r.items():
            x[i, len(runs) + names.index(n)] = v
    y = np.array([t.value for t in ok]) if values else np.log([t.score for t in ok])
    return x, y, runs, names


def fit(results: Path = RESULTS, target: Any = None, card: str = "", residual_kernel: bool = False,
        screened: bool = False, values: bool = True) -> Surrogate:
    """The surrogate fitted on every stored 7B run (`card`: on that card's runs alone, `h100` or `h200`;
    `residual_kernel`: with the interactions `Residuals` holds; `screened`: reading screened-out scores as values;
    `values`: on measured values with one offset per card for today's runs, else on scores with one per run)."""
    target = target or load_target(TARGET)
    defaults = {k: v.default for k, v in target.knobs.items()}
    trials = load_trials(results, card=card)
    now = todays_runs(trials)
    ok = [t for t in trials if _scored(t, screened) and (t.value is not None or not values)]
    x, y, groups, names = _design(ok, defaults, values, now)
    loo = {lam: _loo(x, y, len(groups), lam) for lam in RIDGES}
    ridge = min(RIDGES, key=loo.__getitem__)
    w = _solve(x, y, len(groups), ridge)
    resid = y - x @ w
    reg = np.diag([1e-6] * len(groups) + [ridge] * len(names))
    sd = float(np.std(resid)) * np.sqrt(np.diag(np.linalg.inv(x.T @ x + reg)))
    errors = {"additive": math.sqrt(loo[ridge])}
    residuals = None
    if residual_kernel:
        (var, length, noise), errors["with_residuals"] = _residual_kernel(x, y, len(groups), ridge)
        residuals = Residuals.fit(names, x[:, len(groups):], resid, var, length, noise)
    offsets = dict(zip(groups, w[: len(groups)].tolist(), strict=True))
    weights = dict(zip(names, w[len(groups):].tolist(), strict=True))
    # crash levels: carried by every failed trial that crashed or got server errors, and by no trial that served
    served = {f"{k}={v}" for t in ok for k, v in t.knobs.items()}
    crashed = [t for t in trials if t.status == "failed" and ("server_error" in t.error or "start-up failure (crash" in t.error)]
    crash = set.intersection(*[{f"{k}={v}" for k, v in t.knobs.items()} for t in crashed]) - served if crashed else set()
    secs: dict[str, list[tuple[float, str]]] = {}
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
            secs.setdefault(k, []).append((t.seconds, t.run))
    seconds = {}
    for k, v in secs.items():  # today's code's runs where they measured the key, every run's where they did not
        own = [x for x, run in v if run in now]
        seconds[k] = statistics.median(own or [x for x, _ in v])
    seconds["before_first"] = 21.0  # the store, the model check and the first deploy's start (time_to_best.py's split)
    scale = next((_group(t, now, values) for t in ok if t.run == SCALE_RUN),  # the H100's; a card-only fit: its own
                 next((g for g in groups if g.endswith(" today")), None))
    if values and scale:  # the scores' scale: the card's offset less its runs' baselines' measured value (median)
        base = statistics.median(statistics.median(t.value - math.log(t.score) for t in ok if t.run == r)
                                 for r in {t.run for t in ok if _group(t, now, values) == scale})
        offset = offsets[scale] - base
    else:
        offset = offsets.get(SCALE_RUN, statistics.mean(offsets.values()))
    return Surrogate(weights, offsets, offset, set(names), crash,
                     seconds, defaults, float(np.std(resid)), ridge, len(ok), sorted({t.run for t in ok}),
                     dict(zip(names, sd[len(groups):].tolist(), strict=True)), residuals, errors, screened, values)


def _residual_kernel(x: np.ndarray, y: np.ndarray, n_runs: int, ridge: float) -> tuple[tuple[float, float, float], float]:
    """The residual kernel's (variance, length, noise) from `GP_GRID` with the least leave-one-out error over
    `_held_out` (each trial predicted by the additive fit and the kernel both made without it), and that error (RMS)."""
    dist = _l1(x[:, n_runs:], x[:, n_runs:])
    grid = [(v, ell, nz) for v in GP_GRID[0] for ell in GP_GRID[1] for nz in GP_GRID[2]]
    err: dict[tuple[float, float, float], list[float]] = {g: [] for g in grid}
    for i in _held_out(x, n_runs):
        rest = np.arange(len(y)) != i
        w = _solve(x[rest], y[rest], n_runs, ridge)
        e = float(y[i] - x[i] @ w)
        r = y[rest] - x[rest] @ w
        for v, ell, nz in grid:
            k = v * np.exp(-dist[np.ix_(rest, rest)] / ell) + nz * np.eye(len(r))
            err[(v, ell, nz)].append(e - float(v * np.exp(-dist[i, rest] / ell) @ np.linalg.solve(k, r)))
    best = min(grid, key=lambda g: float(np.mean(np.square(err[g]))))
    return best, float(np.sqrt(np.mean(np.square(err[best]))))


BEST_KNOWN = Path(__file__).resolve().parent / "best_known.json"


def closeness_error(results: Path = RESULTS, target: Any = None, values: bool = True,
                    best_known: Path = BEST_KNOWN) -> tuple[float, int]:
    """How well the fit predicts what time to best is judged on: each scored trial of today's runs, its closeness to
    its card's best known 7B setting (best_known.json: the geometric mean of its measured objectives against the
    best's) predicted by the fit made without it, against the measured one. (RMS error in log, trials.)"""
    target = target or load_target(TARGET)
    defaults = {k: v.default for k, v in target.knobs.items()}
    trials = load_trials(results)
    now = todays_runs(trials)
    ok = [t for t in trials if _scored(t) and t.value is not None]
    x, y, groups, names = _design(ok, defaults, values, now)
    n = len(groups)
    entries = [e for e in json.loads(best_known.read_text())["entries"] if e["preset"] == "7b-peaked"]
    best: dict[str, tuple[StoredTrial, np.ndarray]] = {}
    for e in entries:
        db, number = Path(e["evidence"]["db"]).name, int(e["evidence"]["trial"])
        i = next(i for i, t in enumerate(ok) if (t.run, t.number) == (db, number))
        best[db.split("_")[0]] = (ok[i], x[i, n:])
    err = []
    for i, t in enumerate(ok):
        card = t.run.split("_")[0]
        if t.run not in now or card not in best:
            continue
        w = _solve(np.delete(x, i, 0), np.delete(y, i), n, RIDGES[2])
        b, bx = best[card]
        err.append(float((x[i, n:] - bx) @ w[n:]) - (t.value - b.value))
    return math.sqrt(float(np.mean(np.square(err)))), len(err)


def full_bench_loo(results: Path = RESULTS, target: Any = None, screened: bool = False, ridge: float = 0.3) -> float:
    """Leave-one-out RMS error (log measured value) on the full-bench trials `_held_out` picks, the fit made from the
    rest of them (`screened`: and from every screened-out trial's short-bench values, read as values)."""
    target = target or load_target(TARGET)
    defaults = {k: v.default for k, v in target.knobs.items()}
    trials = load_trials(results)
    ok = [t for t in trials if _scored(t, screened) and t.value is not None]
    full = np.array([not t.error.startswith("screened out at") for t in ok])
    x, y, runs, names = _design(ok, defaults, True, todays_runs(trials))
    held = [int(np.flatnonzero(full)[j]) for j in _held_out(x[full], len(runs))]
    return math.sqrt(_loo(x, y, len(runs), ridge, held))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    target = load_target(TARGET)
    s = fit(target=target)
    best, knobs = s.best(target)
    print(f"fitted on {s.rows} scored trials of {len(s.runs)} runs ({len(s.offsets)} offsets); residual sd {s.residual_sd:.3f} "
          f"(log measured value), ridge {s.ridge:g}")
    r = fit(target=target, residual_kernel=True)
    k = r.residuals
    with_short = full_bench_loo(target=target, screened=True, ridge=s.ridge)
    print(f"leave-one-out RMS error (log measured value) on the full-bench trials: {s.loo['additive']:.3f}; with a residual kernel "
          f"{r.loo['with_residuals']:.3f} (variance {k.var:g}, length {k.length:g}, noise {k.noise:g}); fitted with the "
          f"screened-out short-bench scores as values {with_short:.3f}")
    close, close_ratio = closeness_error(target=target), closeness_error(target=target, values=False)
    print(f"closeness to the card's best known setting (what time to best is judged on), leave-one-out RMS error (log) "
          f"over {close[1]} trials of today's runs: {close[0]:.3f}; fitted on scores with an offset per run {close_ratio[0]:.3f}")
    print(f"crash levels: {sorted(s.crash_levels)}")
    ln = launch_noise()
    print(f"launch noise: log sd {ln.sd:.4f} of a knob set's score between launches within a run ({ln.sets} knob sets "
          f"launched again in {len(ln.runs)} runs, {ln.df} degrees of freedom)")
    print("GPU-s per trial: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(s.seconds.items())))
    for n, w in sorted(s.weights.items(), key=lambda x: -abs(x[1])):
        print(f"  {n:32s} x{math.exp(w):6.2f}")
    print(f"best predicted: {best:.2f}x at {' '.join(f'{k}={v}' for k, v in knobs.items())}")
    known, kk = s.best_known(target)
    print(f"best known (measured) setting, predicted: {known:.2f}x at {' '.join(f'{k}={v}' for k, v in kk.items())}")
    if args.json:
        args.json.write_text(json.dumps({"weights": s.weights, "offsets": s.offsets, "crash_levels": sorted(s.crash_levels),
                                         "seconds": s.seconds, "best": best, "best_knobs": knobs,
                                         "launch_noise": dataclasses.asdict(ln),
                                         "loo_rms": {"additive": s.loo["additive"], "with_residual_kernel": r.loo["with_residuals"],
                                                     "with_screened_scores": with_short},
                                         "closeness_loo_rms": {"values": close[0], "scores_per_run": close_ratio[0],
                                                               "trials": close[1]},
                                         "residual_kernel": {"variance": k.var, "length": k.length, "noise": k.noise}},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
