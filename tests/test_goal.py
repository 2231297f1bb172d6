"""Goal parsing: every accepted form, and refusals that show the accepted forms."""

from pathlib import Path

import pytest

from orchestrator.config.goal import METRICS, GoalError, load_goal, parse_goal

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "goals"


def test_the_flagship_goal():
    g = parse_goal("/goal beat the baseline by 20% on TTFT and TPOT without accuracy loss within 30m")
    assert [(o.metric, o.kind, o.value, o.stat) for o in g.objectives] == [
        ("ttft", "relative", 0.2, "p50"), ("tpot", "relative", 0.2, "p50")]
    assert g.accuracy_mode == "no_loss"
    assert g.budget.wall_s == 1800
    assert g.scenarios == ["prefill", "decode"]
    assert [o.key for o in g.objectives] == ["ttft_ms_p50", "tpot_ms_p50"]


def test_relative_targets_by_direction():
    g = parse_goal("improve throughput by 2x and cut p90 TTFT by 2x within 12 trials")
    thr, ttft = g.objectives
    assert thr.target_for(100.0) == pytest.approx(200.0) and thr.met(201, 100) and not thr.met(199, 100)
    assert ttft.stat == "p90" and ttft.target_for(100.0) == pytest.approx(50.0)
    assert ttft.met(49, 100) and not ttft.met(51, 100)
    assert ttft.speedup(50, 100) == pytest.approx(2.0) and thr.speedup(50, 100) == pytest.approx(0.5)
    assert g.budget.trials == 12


def test_absolute_and_combined_budget():
    g = parse_goal("get p90 TTFT under 0.15 s and get throughput above 500 tok/s within 1h and 20 trials")
    ttft, thr = g.objectives
    assert (ttft.kind, ttft.value, ttft.key) == ("absolute", 150.0, "ttft_ms_p90")
    assert (thr.kind, thr.value, thr.key) == ("absolute", 500.0, "output_throughput")
    assert g.budget.wall_s == 3600 and g.budget.trials == 20
    assert g.accuracy_mode == "gated"


def test_digest_ignores_wording_but_not_meaning():
    a = parse_goal("beat the baseline by 20% on TPOT")
    b = parse_goal("/goal  Beat the baseline by 20% on tpot.")
    c = parse_goal("beat the baseline by 25% on TPOT")
    assert a.digest == b.digest != c.digest


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty goal"),
        ("make it go brrr", "could not understand"),
        ("beat the baseline by 20% on TTFT and vibes", "unknown metric"),
        ("get ttft above 100 ms", "should go down"),
        ("get throughput under 100 tok/s", "should go up"),
        ("beat the baseline by 120% on ttft", "below 100%"),
        ("improve ttft by 0.5x", "not an improvement"),
        ("beat the baseline by 20% on TPOT within 30 parsecs", "cannot read budget"),
        ("without accuracy loss", "no measurable objective"),
    ],
)
def test_bad_goals_are_refused_with_the_accepted_forms(text, fragment):
    with pytest.raises(GoalError) as e:
        parse_goal(text)
    assert fragment in str(e.value)
    assert "Accepted goal forms" in str(e.value)


def test_every_metric_is_parseable():
    for name in METRICS:
        g = parse_goal(f"beat the baseline by 10% on {name}")
        assert g.objectives[0].metric == name


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_example_goal_files_load(path):
    g = load_goal(path)
    assert g.objectives and g.text


def test_goal_toml_matches_text_form():
    text = parse_goal("beat the baseline by 20% on TPOT and throughput without accuracy loss within 12 trials")
    toml = load_goal(EXAMPLES / "demo.toml")
    assert [o.model_dump() for o in toml.objectives] == [o.model_dump() for o in text.objectives]
    assert toml.accuracy_mode == "no_loss" and toml.budget.trials == 12


@pytest.mark.parametrize(("text", "match"), [
    (None, "does not exist"),
    ("objectives = [ {metric = 'tpot'", "not valid TOML"),
    ("[[objectives]]\nmetric = 'vibes'\nvalue = 0.2\n", "unknown metric"),
    ("[[objectives]]\nmetric = 'tpot'\nvalue = 0.2\n[budget]\nwall = 'soon'\n", "budget.wall"),
    ("[slo]\nmaximize = 'rate'\nminimize = 'tpot'\n[[slo.limits]]\nmetric = 'ttft'\nvalue = 300\n",
     "exactly one of maximize or minimize"),
    ("[[objectives]]\nmetric = 'rate'\nkind = 'best'\n", "needs the goal's"),
])
def test_bad_goal_files(tmp_path, text, match):
    path = tmp_path / "goal.toml"
    if text is not None:  # None: the file is missing
        path.write_text(text)
    with pytest.raises(GoalError, match=match):
        load_goal(path)
