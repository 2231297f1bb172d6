"""The speed-of-light check through the real loop: a server that fakes its timing is caught.

The fake streaming server's `tpot_ms` is a knob; 0 streams every token at once (a decode faster
than reading the weights allows). Floors are recorded for the forged tiny model with a made-up
ceiling (the weights read in 1 ms), the way `benchmarks/gpu/sol.py` writes them on a GPU.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_target import write_fake_target
from own_trials import candidates
from typer.testing import CliRunner

from gates.plausible import model_numbers
from orchestrator.bench.scenarios import Scenario
from orchestrator.cli import app
from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import ConfigError, Workspace
from orchestrator.runs import start_run
from orchestrator.store import Store
from orchestrator.trial import verdict
from orchestrator.trial.context import TrialResult
from orchestrator.trial.verdict import Baseline

pytestmark = pytest.mark.slow  # launches (fake) servers

SOL_7B = Path(__file__).resolve().parents[1] / "benchmarks/gpu/results/sol.json"


def _floors(path, model_dir):
    """Floors for `model_dir`'s shape: the weights read in 1 ms (TTFT and TPOT floors ~1 ms), FLOPs free."""
    m = model_numbers(json.loads((Path(model_dir) / "config.json").read_text()))
    ceil = {"copy_bytes_per_s": m["weight_bytes"] / 1e-3, "bf16_flops_per_s": 1e18, "gpu": "made up"}
    path.write_text(json.dumps({"ceilings": ceil, "model": m, "floors": {"decode_tpot_ms": 1.0}}))
    return path


def _run(tmp_path, floors, steps):
    target = write_fake_target(tmp_path / "fake.toml", choices=(4.0, 0.0, 4.1))
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    ws = Workspace(tmp_path, [f'target="{target}"', f'proposer="scripted:{tmp_path / "steps.json"}"', "gates.accuracy=false",
                              "gates.integrity=false", "bench.scale=0.5", "bench.timeout_s=3",
                              *([f'bench.floors="{floors}"'] if floors else [])])
    # 4 -> 4.1 ms is slower: nothing is kept, so no paired confirmation (seconds, not a minute). A 4 ms
    # baseline (was 8 ms, and the candidate 7.9) halves the decode scenario's bench time in every trial.
    out = start_run(ws, parse_goal("beat the baseline by 40% on TPOT within 3 trials"))
    store = Store(ws.db_url)
    # The baseline and the script's candidates in order (the loop's own sentinels left out: their number depends on the host).
    own = dict(enumerate(candidates(store, out.run_id)))
    return ws, store, out, own


def _sol(store, trial):
    return [g.status for g in store.gate_results(trial.id) if g.gate == "speed_of_light"]


def test_a_server_that_fakes_its_timing_is_invalid_and_an_honest_one_passes(tmp_path, tiny_model):
    ws, store, out, t = _run(tmp_path, _floors(tmp_path / "sol.json", tiny_model), [{"tpot_ms": 0.0}, {"tpot_ms": 4.1}])
    assert store.events(out.run_id, kind="speed_of_light")[0].data["model"]["weight_bytes"] > 0
    assert len(t) == 3, (out.stop_reason, [(x.number, x.status, x.error) for x in t.values()])
    base, cheat, honest = t[0], t[1], t[2]
    assert cheat.status == "invalid" and cheat.score is None
    assert cheat.error.startswith("faster than the hardware allows: measurement or cheat: decode tpot_ms_p50 ")
    assert "floor 1.0" in cheat.error and "x the speed of light; margin " in cheat.error
    sol = [g for g in store.gate_results(cheat.id) if g.gate == "speed_of_light"]
    assert sol[0].status == "fail" and sol[0].details["slack"] == 0.15
    # Honest timings (4 and 4.1 ms per token) are slower than the ~1 ms floor: checked, passed, judged as ever.
    assert _sol(store, base) == ["pass"] and base.status == "kept"
    if "busier" not in (honest.error or "") and "untrusted" not in (honest.error or ""):  # this host may be loaded
        assert _sol(store, honest) == ["pass"] and honest.status in ("kept", "discarded") and honest.score
    # `infergoal why N` says it, with the numbers.
    r = CliRunner().invoke(app, ["-w", str(tmp_path), "why", str(cheat.number)])
    assert r.exit_code == 0, r.output
    assert "decided by gate:speed_of_light" in r.stdout and "faster than the hardware allows" in r.stdout
    r = CliRunner().invoke(app, ["-w", str(tmp_path), "why", str(cheat.number), "--json"])
    ev = json.loads(r.stdout)["evidence"]
    assert ev["checked"] and ev["margin"] == pytest.approx(ev["noise"] + 0.15)


def test_without_floors_for_this_model_nothing_is_checked(tmp_path, tiny_model):
    # The 7B's floors (the H200's sol.json) do not judge the tiny model: nothing checked, nothing said.
    ws, store, out, t = _run(tmp_path, SOL_7B, [])  # the baseline alone: the real path, in seconds
    assert store.events(out.run_id, kind="speed_of_light")  # recorded for the report all the same
    assert t[0].status == "kept" and not [s for tr in t.values() for s in _sol(store, tr)]


class _Events:
    """The one store call `verdict.speed_of_light` makes."""

    def __init__(self, *records):
        self.records = records

    def events(self, run_id, kind=None):
        return [SimpleNamespace(data=r) for r in self.records]


def test_the_cheats_numbers_are_judged_only_by_floors_for_its_model(tmp_path, tiny_model):
    scen = {"decode": Scenario(name="decode", prompt_tokens=64, output_tokens=16, num_requests=4)}
    cheat = TrialResult(metrics={"decode": {"tpot_ms_p50": 0.001, "ttft_ms_p50": 5.0}}, samples={"decode:tpot_ms_mean": [0.001]})
    assert verdict.speed_of_light(_Events(), 1, cheat, None, tiny_model, scen) is None  # no floors
    assert verdict.speed_of_light(_Events(json.loads(SOL_7B.read_text())), 1, cheat, None, tiny_model, scen) is None
    mine = json.loads(_floors(tmp_path / "sol.json", tiny_model).read_text())
    base = Baseline(samples={}, values={}, noise=0.07)
    r = verdict.speed_of_light(_Events(mine), 1, cheat, base, tiny_model, scen)
    assert r.status == "fail" and r.details["margin"] == pytest.approx(0.22)  # the baseline's noise + 15% slack


def test_a_floors_file_that_cannot_be_used_is_refused_before_the_run(tmp_path):
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="bench.floors: .*no `floors` object"):
        _run(tmp_path, tmp_path / "bad.json", [])
    assert not Store(Workspace(tmp_path).db_url).list_runs()
