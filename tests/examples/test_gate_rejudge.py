"""benchmarks/gpu/gate_rejudge.py: the loop's accuracy verdict on stored gate_demo.py results, against a baseline's."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gate_rejudge", ROOT / "benchmarks/gpu/gate_rejudge.py")
G = importlib.util.module_from_spec(spec)
sys.modules["gate_rejudge"] = G
spec.loader.exec_module(G)

RES = ROOT / "benchmarks/gpu/results"
LP1 = RES / "gate_lp1_h200_2026-12-05f.json"  # step 10lp on the H200, the same model as the two below
STEPS = [RES / "gate_lpnp_h200_2026-12-05f.json", RES / "gate_s14_h200_2026-12-05g.json"]


def test_the_steps_pass_against_the_step_they_extend(capsys) -> None:
    """The H200's gates of steps 13 and 14 read 'drift' against the absolute soft line (mean |dlogprob| 0.0179 >
    0.015), as step 10lp's own (0.0181) does; against step 10lp as the baseline, the loop's rule, they pass."""
    res = G.rejudge(STEPS, [LP1])
    assert [(r["absolute"], r["loop"]) for r in res] == [("drift", "pass")] * 2
    assert abs(res[0]["limits"]["mean_abs_dlogprob"] - 0.018117 * 1.5) < 1e-4
    assert G.main([*map(str, STEPS), "--baseline", str(LP1)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(": pass against the baseline (absolute limits: drift)" in x for x in lines)


def test_a_candidate_further_from_the_reference_than_its_baseline_is_not_passed(tmp_path) -> None:
    """lp1's own metrics with mean |dlogprob| doubled (0.036, over 1.5 x the baseline's 0.018): drift; over the
    hard limit (0.06 > 0.05): fail, whatever the baseline measured."""
    doc = json.loads(LP1.read_text())
    out = []
    for name, v in (("worse", 0.036), ("broken", 0.06)):
        d = copy.deepcopy(doc)
        d["honest_fast_bf16"]["metrics"]["mean_abs_dlogprob"] = v
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(d))
        out.append(p)
    res = G.rejudge(out, [LP1])
    assert [r["loop"] for r in res] == ["drift", "fail"], res
    assert "mean_abs_dlogprob=0.036" in res[0]["reason"]


def test_a_file_without_the_honest_run_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    bad = tmp_path / "dropped_only.json"
    bad.write_text(json.dumps({"dropped_last_layer": {"status": "fail", "metrics": {}}}))
    assert G.main([str(STEPS[0]), "--baseline", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gate_rejudge: ") and "no 'honest_fast_bf16' metrics" in err and "\n" not in err
    assert G.main([str(tmp_path / "missing.json"), "--baseline", str(LP1)]) == 2
