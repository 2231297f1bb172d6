"""benchmarks/gpu/ttb_plot.py on the stored H200 runs (no GPU): each run's best-so-far steps against the best
known setting, the GoalMet point where the run stopped, and a run with nothing to judge against left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
RESULTS = GPU / "results"

import time_to_best  # noqa: E402
import ttb_plot  # noqa: E402

BEST = json.loads((GPU / "best_known.json").read_text())


def test_a_runs_steps_rise_to_its_best_and_the_star_sits_where_the_goal_was_met() -> None:
    c = ttb_plot.curve(time_to_best.analyse(RESULTS / "h200_ttb_cold_7b_seed71_2026-12-07.db", BEST))
    assert c is not None and c["card"] == "NVIDIA H200"
    xs, ys = zip(*c["steps"], strict=True)
    assert list(xs) == sorted(xs) and list(ys) == sorted(ys) and len(set(ys)) == len(ys)  # a new best at each step
    assert c["steps"][-1] == (174.8, 1.0) and c["within_s"] == 174.8  # #5, the best known itself
    assert c["goal_met"] == (289.7, 1.0) and c["end_s"] == pytest.approx(289.7, abs=0.5)
    # seed 83 met the goal under the best: its star sits at its best so far, 91.7%
    c83 = ttb_plot.curve(time_to_best.analyse(RESULTS / "h200_ttb_cold_7b_seed83_2026-12-07.db", BEST))
    assert c83["within_s"] is None and c83["goal_met"] == (237.1, pytest.approx(0.917, abs=1e-3))


def test_the_plot_is_written_and_a_run_without_a_best_known_is_left_out(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ttb.svg"
    rc = ttb_plot.main([str(RESULTS / "h200_ttb_cold_3b_seed71_2026-12-07.db"),
                        str(RESULTS / "h200_ttb_small_2b_explore_2026-12-03c.db"), "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and out.read_text().lstrip().startswith("<?xml") and "<svg" in out.read_text()
    assert "h200_ttb_small_2b_explore_2026-12-03c.db: no best known setting" in text  # no 2b-peaked entry
    assert "h200_ttb_cold_3b_seed71_2026-12-07.db: within 5% at None GPU-s; paired GoalMet at 214.2" in text
    assert ttb_plot.main([str(RESULTS / "h200_ttb_small_2b_explore_2026-12-03c.db"), "--out", str(out)]) == 2
    assert ttb_plot.main([str(tmp_path / "none.db"), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"ttb_plot: no such database: {tmp_path / 'none.db'}"
