"""The speed-of-light check through the real loop: a server that fakes its timing is caught.

The fake streaming server's `tpot_ms` is a knob; 0 streams every token at once (a decode faster
than reading the weights allows). Floors are recorded for the forged tiny model with a made-up
ceiling (the weights read in 1 ms), the way `benchmarks/gpu/sol.py` writes them on a GPU.
"""

import json
from pathlib import Path

import pytest
from fake_target import write_fake_target
from typer.testing import CliRunner

from gates.plausible import model_numbers
from orchestrator.cli import app
from orchestrator.goal import parse_goal
from orchestrator.runs import start_run
from orchestrator.store import Store
from orchestrator.workspace import ConfigError, Workspace

pytestmark = pytest.mark.slow  # launches (fake) servers

SOL_7B = Path(__file__).resolve().parents[1] / "benchmarks/gpu/results/sol.json"


def _floors(path, model_dir):
    """Floors for `model_dir`'s shape: the weights read in 1 ms (TTFT and TPOT floors ~1 ms), FLOPs free."""
    m = model_numbers(json.loads((Path(model_dir) / "config.json").read_text()))
    ceil = {"copy_bytes_per_s": m["weight_bytes"] / 1e-3, "bf16_flops_per_s": 1e18, "gpu": "made up"}
    path.write_text(json.dumps({"ceilings": ceil, "model": m, "floors": {"decode_tpot_ms": 1.0}}))
    return path


def _run(tmp_path, floors, steps):
    target = write_fake_target(tmp_path / "fake.toml", choices=(8.0, 0.0, 4.0))
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    ws = Workspace(tmp_path, [f'target="{target}"', f'proposer="scripted:{tmp_path / "steps.json"}"', "gates.accuracy=false",
                              "gates.integrity=false", "bench.scale=0.5", "bench.timeout_s=3",
                              *([f'bench.floors="{floors}"'] if floors else [])])
    out = start_run(ws, parse_goal("beat the baseline by 10% on TPOT within 3 trials"))
    store = Store(ws.db_url)
    own = {t.number: t for t in store.list_trials(out.run_id) if t.proposer not in ("sentinel", "paired")}
    return ws, store, out, own


def test_a_server_that_fakes_its_timing_is_invalid_and_an_honest_one_passes(tmp_path, tiny_model):
    ws, store, out, t = _run(tmp_path, _floors(tmp_path / "sol.json", tiny_model), [{"tpot_ms": 0.0}, {"tpot_ms": 4.0}])
    assert store.events(out.run_id, kind="speed_of_light")[0].data["model"]["weight_bytes"] > 0
    assert len(t) == 3, (out.stop_reason, [(x.number, x.status, x.error) for x in t.values()])
    cheat, honest, base = t[1], t[2], t[0]
    assert cheat.status == "invalid" and cheat.score is None
    assert cheat.error.startswith("faster than the hardware allows: measurement or cheat: decode tpot_ms_p50 ")
    assert "floor 1.0" in cheat.error and "x the speed of light; margin " in cheat.error
    sol = [g for g in store.gate_results(cheat.id) if g.gate == "speed_of_light"]
    assert sol[0].status == "fail" and sol[0].details["slack"] == 0.15
    # Honest timings (8 and 4 ms per token) are slower than the floor: checked, passed, judged as ever.
    for trial in (base, honest):
        assert [g.status for g in store.gate_results(trial.id) if g.gate == "speed_of_light"] == ["pass"]
    assert honest.status == "kept" and honest.score > 1.5
    assert out.stop_reason.startswith("GoalMet")
    # `infergoal why 1` says it, with the numbers.
    r = CliRunner().invoke(app, ["-w", str(tmp_path), "why", "1"])
    assert r.exit_code == 0, r.output
    assert "decided by gate:speed_of_light" in r.stdout and "faster than the hardware allows" in r.stdout
    r = CliRunner().invoke(app, ["-w", str(tmp_path), "why", "1", "--json"])
    ev = json.loads(r.stdout)["evidence"]
    assert ev["checked"] and ev["margin"] == pytest.approx(ev["noise"] + 0.15)


def test_without_floors_for_this_model_nothing_changes(tmp_path, tiny_model):
    # The 7B's floors (the H200's sol.json) do not judge the tiny model: the cheat is kept as before.
    ws, store, out, t = _run(tmp_path, SOL_7B, [{"tpot_ms": 0.0}])
    assert store.events(out.run_id, kind="speed_of_light")  # recorded for the report all the same
    assert "hardware" not in (t[1].error or "")
    # Kept as before, unless this busy host made the measurement untrusted (then judged on nothing).
    assert t[1].status == "kept" or "untrusted" in (t[1].error or "") or "busier" in (t[1].error or ""), t[1].error
    assert not [g for tr in t.values() for g in store.gate_results(tr.id) if g.gate == "speed_of_light"]


def test_a_floors_file_that_cannot_be_used_is_refused_before_the_run(tmp_path):
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="bench.floors: .*no `floors` object"):
        _run(tmp_path, tmp_path / "bad.json", [])
    assert not Store(Workspace(tmp_path).db_url).list_runs()
