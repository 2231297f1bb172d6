"""SLO goals: "maximize X subject to latency limits" and "minimize a latency at a throughput floor"."""

from pathlib import Path

import pytest

from orchestrator.config.goal import GoalError, Objective, SloGoal, SloLimit, load_goal, parse_goal
from orchestrator.trial.verdict import no_target

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "goals"


def test_maximize_throughput_under_two_limits():
    g = parse_goal("maximize throughput with p90 TTFT under 300 ms and p90 TPOT under 40 ms")
    assert g.slo == SloGoal(maximize="rate", limits=(SloLimit(metric="ttft", stat="p90", value=300),
                                                     SloLimit(metric="tpot", stat="p90", value=40)))
    assert g.objectives == (Objective(metric="rate", kind="best"),)
    assert g.scenarios == ["slo"] and g.objectives[0].key == "slo_rate"
    assert g.slo.latency_limits == [("ttft_ms_p90", 300.0), ("tpot_ms_p90", 40.0)]
    assert g.slo.goodput_slos == {"slo_ttft_ms": 300.0, "slo_tpot_ms": 40.0}
    assert g.describe() == "maximize request rate with p90 TTFT <= 300 ms and p90 TPOT <= 40 ms"


def test_maximize_goodput_in_seconds_with_a_budget():
    g = parse_goal("/goal maximize goodput at p99 TTFT under 1 s within 30m")
    assert g.slo == SloGoal(maximize="goodput", limits=(SloLimit(metric="ttft", stat="p99", value=1000),))
    assert g.objectives[0].key == "slo_goodput" and g.budget.wall_s == 1800


def test_minimize_a_latency_at_a_throughput_floor():
    g = parse_goal("minimize p90 TPOT with throughput above 500 tok/s")
    assert g.slo == SloGoal(minimize="tpot", stat="p90", limits=(SloLimit(metric="throughput", value=500),))
    o = g.objectives[0]
    assert (o.metric, o.stat, o.kind, o.at_load, o.scenario, o.key) == ("tpot", "p90", "best", True, "slo", "tpot_ms_p90")
    assert g.slo.floor_tok_s == 500 and g.slo.latency_limits == []


def test_an_slo_objective_is_scored_but_never_met():
    o = parse_goal("maximize throughput with p90 TTFT under 300 ms").objectives[0]
    assert o.speedup(12.0, 10.0) == pytest.approx(1.2) and not o.met(1e9, 1.0)
    assert no_target([o]).status == "fail" and no_target(parse_goal("improve throughput by 2x").objectives) is None


def test_other_goals_keep_their_digest():
    # Computed on main before SLO goals existed: resumed runs still find their goal.
    assert parse_goal("beat the baseline by 20% on TPOT").digest == "d29aac42124cb6db"


def _refusal(text: str) -> tuple[str, list[str]]:
    """The first line of the error a goal text is refused with, and the lines after it (the accepted forms)."""
    with pytest.raises(GoalError) as e:
        parse_goal(text)
    first, *rest = str(e.value).splitlines()
    assert "Accepted goal forms" in rest[0]
    return first, rest


@pytest.mark.parametrize("text, fragment", [
    ("maximize throughput with p101 TTFT under 300 ms", "unknown percentile 'p101'"),
    ("maximize throughput with p90 TTFT under 300", "has no unit; write e.g. 300 ms"),
    ("maximize throughput with p90 TTFT under -3 ms", "a limit must be a positive number"),
    ("maximize throughput and goodput with p90 TTFT under 300 ms", "no trade-off between them"),
    ("maximize throughput and maximize goodput", "maximizes one and minimizes the other"),
    ("maximize throughput with TTFT under 300 ms", "names no percentile"),
    ("maximize throughput with p90 TTFT above 300 ms", "asks the opposite"),
    ("maximize throughput with p90 TTFT under 300 tok/s", "measured in ms, not tok/s"),
    ("maximize vibes with p90 TTFT under 300 ms", "maximizes throughput (the request rate) or goodput"),
    ("maximize throughput with p90 vibes under 300 ms", "unknown metric 'vibes'"),
    ("maximize throughput with throughput above 5 tok/s", "takes latency limits, not a throughput limit"),
    ("minimize p90 TPOT with p90 TTFT under 300 ms", "needs a throughput limit"),
    ("minimize throughput with throughput above 5 tok/s", "minimizes a latency"),
    ("maximize throughput with p90 TTFT under 300 ms and p99 TTFT under 1 s", "limits each metric once"),
])
def test_bad_slo_goals_are_refused_in_one_clear_line(text, fragment):
    first, rest = _refusal(text)
    assert fragment in first
    assert any("maximize throughput with" in line for line in rest)


def test_plain_forms_do_not_take_the_slo_metrics():
    with pytest.raises(GoalError, match="unknown metric"):
        parse_goal("beat the baseline by 20% on goodput")


def test_slo_goal_toml_matches_text_form():
    toml = load_goal(EXAMPLES / "slo_throughput.toml")
    text = parse_goal("maximize throughput with p90 TTFT under 300 ms and p90 TPOT under 40 ms within 1h")
    assert toml.slo == text.slo and toml.objectives == text.objectives and toml.budget == text.budget


def test_two_objectives_trade_off_one_maximized_one_minimized(tmp_path):
    g = parse_goal("maximize throughput and minimize p90 TPOT within 12 trials")
    assert g.multi_objective and g.slo is None and g.scenarios == ["throughput", "decode"]
    assert [(o.metric, o.stat, o.kind) for o in g.objectives] == [("throughput", "p50", "best"), ("tpot", "p90", "best")]
    assert g.describe() == "highest throughput, lowest p90 TPOT; within 12 trials"
    assert parse_goal("minimize p90 TPOT and maximize throughput within 12 trials").objectives == g.objectives
    toml = load_goal(EXAMPLES / "pareto.toml")
    assert toml.objectives == g.objectives and toml.budget == g.budget and toml.multi_objective
    # The SLO rate and a latency measured at that rate.
    s = parse_goal("maximize throughput and minimize p90 TPOT with p90 TTFT under 300 ms")
    assert s.multi_objective and s.slo.maximize == "rate" and s.scenarios == ["slo"]
    assert [(o.metric, o.key, o.at_load) for o in s.objectives] == [("rate", "slo_rate", False), ("tpot", "tpot_ms_p90", True)]
    assert s.describe() == "maximize request rate with p90 TTFT <= 300 ms; and lowest p90 TPOT at that rate"
    assert not parse_goal("maximize throughput with p90 TTFT under 300 ms").multi_objective
    assert not parse_goal("beat the baseline by 20% on TTFT and TPOT").multi_objective


@pytest.mark.parametrize("text, fragment", [
    ("maximize throughput and maximize goodput", "maximizes one and minimizes the other"),
    ("minimize p90 ttft and minimize p90 tpot", "maximizes one and minimizes the other"),
    ("maximize throughput and minimize p90 tpot and minimize p90 ttft", "at most two objectives"),
    ("maximize goodput and minimize p90 tpot", "counted against latency limits"),
    ("maximize vibes and minimize p90 tpot", "throughput (the request rate) or goodput, not 'vibes'"),
    ("maximize throughput and minimize throughput", "one latency (ttft, tpot, itl, e2e), not 'throughput'"),
    ("maximize throughput and minimize p90 tpot with throughput above 5 tok/s", "takes latency limits"),
])
def test_bad_two_objective_goals_are_refused_with_the_accepted_forms(text, fragment):
    first, rest = _refusal(text)
    assert fragment in first
    assert any("maximize throughput and minimize p90 TPOT" in line for line in rest)


def test_a_second_objective_in_toml_must_be_a_latency_at_the_slo_rate(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[slo]\nmaximize = 'rate'\n[[slo.limits]]\nmetric = 'ttft'\nvalue = 300\n"
                   "[[objectives]]\nmetric = 'rate'\nkind = 'best'\n[[objectives]]\nmetric = 'tpot'\nkind = 'best'\n")
    with pytest.raises(GoalError, match="at most one latency minimized at that load"):
        load_goal(bad)
    bad.write_text("[[objectives]]\nmetric = 'throughput'\nkind = 'best'\n[[objectives]]\nmetric = 'tpot'\nvalue = 0.2\n")
    with pytest.raises(GoalError, match="cannot be mixed with targets"):
        load_goal(bad)
