"""The goal's bars as the search's constraints: once a paired confirmation missed an objective, TPE is told
each trial's shortfall under the bars (Optuna's constraint-aware TPE), so its proposals move to the knob
values that meet every bar, away from the highest score that missed one."""

import optuna
import pytest
from fake_target import FAKE_SERVER_DIR, target_head

from orchestrator.proposers.search import SearchProposer
from orchestrator.store import Store
from orchestrator.targets import load_target
from orchestrator.trial.goalbars import Bars, bars, raised, ratios


@pytest.fixture(autouse=True)
def _quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(target_head("fake", FAKE_SERVER_DIR) + '''launch = "true {{ batch }}"
[knobs.batch]
type = "int"
low = 1
high = 64
log = true
default = 1
''')
    return load_target(path)


# A batch's TPOT speedup falls as it grows and its throughput speedup rises: the score (their geometric mean)
# is highest at the largest batch, but TPOT's bar (3x) is met only up to batch 8.
def _speedups(batch):
    return {"decode:tpot_ms_p50": 4.0 / (1 + batch / 40), "throughput:output_throughput": 2.0 * batch ** 0.5}


def _history(tmp_path, target, batches):
    store = Store(f"sqlite:///{tmp_path / 'w.db'}")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    t = store.create_trial(run.id, 0, commit="", knobs=target.baseline_knobs(), rationale="", proposer="baseline")
    store.finish_trial(t.id, "kept", score=1.0)
    for n, b in enumerate(batches, start=1):
        s = _speedups(b)
        t = store.create_trial(run.id, n, commit="", knobs={"batch": b}, rationale="start-up proposal", proposer="search")
        store.finish_trial(t.id, "kept", score=(s["decode:tpot_ms_p50"] * s["throughput:output_throughput"]) ** 0.5)
    return store.list_trials(run.id)


BARS = Bars({"decode:tpot_ms_p50": 3.0, "throughput:output_throughput": 4.0}, noise=0.05,
            raised={"decode:tpot_ms_p50": (1.1, 9)})


def test_tpe_told_the_goals_bars_proposes_where_every_bar_is_met(tmp_path, target):
    history = _history(tmp_path, target, [2, 3, 5, 7, 16, 24, 32, 40, 48, 64])
    feasible = {t.number for t in history if t.number and BARS.clears(_speedups(t.knobs["batch"]))}
    assert feasible == {3, 4}, "batches 5 and 7 meet both bars; the highest scores (the largest batches) miss TPOT's"

    def proposed(goal):
        out = []
        for seed in range(12):
            p = SearchProposer(seed=seed, n_startup=4, walk=False, rank=1, startup="random")
            p.goal = goal
            out.append(p.propose(history, target).knobs["batch"])
        return out

    free = proposed({})
    steered = proposed({t.number: BARS.constraint(_speedups(t.knobs["batch"])) for t in history if t.number})
    near = sum(1 for b in steered if 4 <= b <= 10)
    assert near >= 8 and near > sum(1 for b in free if 4 <= b <= 10) + 3, (steered, free)


def test_a_screen_within_the_noise_of_a_bar_does_not_clear_it():
    b = bars([_objective("tpot", 0.5), _objective("throughput", 1.0)],
             {"decode:tpot_ms_p50": 20.0, "throughput:output_throughput": 100.0}, noise=0.05)
    assert b.required == pytest.approx({"decode:tpot_ms_p50": 2.0, "throughput:output_throughput": 2.0})
    got = ratios({"decode:tpot_ms_p50": 9.7, "throughput:output_throughput": 300.0},
                 {"decode:tpot_ms_p50": 20.0, "throughput:output_throughput": 100.0}, b_objectives())
    assert got["decode:tpot_ms_p50"] == pytest.approx(20 / 9.7)  # 2.06x: over 2x, under 2x + 5% noise
    assert not b.clears(got) and b.constraint(got) > 0
    assert b.clears({"decode:tpot_ms_p50": 2.2, "throughput:output_throughput": 2.11})
    assert b.margin({"decode:tpot_ms_p50": 2.2, "throughput:output_throughput": 2.11}) == pytest.approx(2.11 / 2.1)
    assert b.constraint({"decode:tpot_ms_p50": 2.2, "throughput:output_throughput": 2.11}) <= 0


def test_a_failed_paired_objective_raises_its_bar_by_the_screens_overstatement():
    paired = [{"trial": 8, "met": False, "score": 10.6, "screen": {"tpot": 4.26, "thr": 33.0},
               "objectives": {"tpot": {"verdict": "fail", "lo": 3.8, "pairs": [3.7, 4.1, 4.4]},
                              "thr": {"verdict": "pass", "lo": 30.0, "pairs": [31.0, 33.0, 34.0]}}},
              {"trial": 13, "met": False, "score": 0.0, "why": "the host is too busy to measure"}]
    assert raised(paired) == {"tpot": pytest.approx((4.26 / 3.7, 8))}, "the worst round; a missing confirmation says nothing"
    b = Bars({"tpot": 4.0, "thr": 19.0}, noise=0.05, raised=raised(paired))
    assert b.bar("tpot") == pytest.approx(4.0 * 4.26 / 3.7) and b.bar("thr") == pytest.approx(19.0 * 1.05)
    assert not b.clears({"tpot": 4.41, "thr": 33.0}), "a neighbour screening 4.41x is not confirmed again"
    assert b.clears({"tpot": 4.9, "thr": 21.5})
    assert raised([{**paired[0], "met": True}]) == {}


def _objective(metric, value):
    from orchestrator.config.goal import Objective
    return Objective(metric=metric, kind="relative", value=value)


def b_objectives():
    return [_objective("tpot", 0.5), _objective("throughput", 1.0)]


def test_of_the_trials_clearing_every_bar_the_largest_goal_margin_is_confirmed_first_not_the_highest_score():
    from types import SimpleNamespace

    from orchestrator.trial.goalbars import to_confirm
    b = Bars({"tpot": 4.0, "thr": 19.0}, noise=0.05)
    edge = SimpleNamespace(number=8, score=11.8)  # TPOT 4.26x: clears 4.2, the highest score (geomean 11.8x)
    roomy = SimpleNamespace(number=5, score=10.3)  # TPOT 4.9x, throughput 21.5x: both with room
    short = SimpleNamespace(number=9, score=12.5)  # throughput 19.5x: under 19x + noise
    screened = [(edge, {"tpot": 4.26, "thr": 33.0}), (roomy, {"tpot": 4.9, "thr": 21.5}), (short, {"tpot": 8.0, "thr": 19.5})]
    assert to_confirm(b, screened) is roomy
    assert to_confirm(b, screened[::2]) is edge
    assert to_confirm(b, screened[2:]) is None
