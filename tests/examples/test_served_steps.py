"""benchmarks/gpu/served_steps.py: each engine step's served A-D from the kept runs, each entry checked against its run."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"

pytest.importorskip("torch")  # the server's own parser lives in a module that imports torch

import served_steps  # noqa: E402

from orchestrator.targets.spec import load_target  # noqa: E402

STEPS = json.loads((GPU / "engine_steps.json").read_text())
NO = dict(zip(served_steps.step_numbers(STEPS), STEPS, strict=True))  # engine step number -> entry


def _command(knobs: dict, *, before: bool = False, env: str = "env HFSERVE_STEP_LOG=/tmp/s.log ") -> str:
    """A command line the way ib_baseline.py records it, for this knob set."""
    target = load_target(served_steps.TARGET)
    argv = target.render(target.validate_knobs(knobs), port=41234, model="/root/m", source="/s")[3:]
    script = (".before/" if before else "") + "examples/hfserve"
    return env + "/opt/torch/.venv/bin/python3 " + script + " " + " ".join(argv).replace("mistral-7b-shape", "model")


def _scen(ok: bool = True, **m: float) -> dict:
    return {"ok": ok, "num_requests": 8, "metrics": m}


def _write(tmp: Path, servers: dict, runs: list[dict], *, gpu: str = "NVIDIA H200", man_gpu: str = "H200") -> Path:
    (tmp / "results").mkdir(exist_ok=True)
    (tmp / "results" / "run.json").write_text(json.dumps({"gpu": gpu, "servers": servers}))
    (tmp / "results" / "sol.json").write_text((GPU / "results" / "sol.json").read_text())
    (tmp / "scenarios_ib.toml").write_text((GPU / "scenarios_ib.toml").read_text())
    lines = [f'gpu = "{man_gpu}"', 'sol = "results/sol.json"', 'scenarios = "scenarios_ib.toml"']
    for r in runs:
        lines += ["[[run]]", 'file = "results/run.json"']
        for k, v in r.items():
            if isinstance(v, dict):  # an inline table: extra = { kv_cache_dtype = "fp8" }
                v = "{ " + ", ".join(f"{a} = {json.dumps(b)}" for a, b in v.items()) + " }"
            else:
                v = json.dumps(v)
            lines.append(f"{k} = {v}")
    path = tmp / "m.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_entry_must_launch_its_knob_set(tmp_path: Path) -> None:
    """Step 8's server (overlap on) is accepted as step 8's knob set and refused as step 7's, naming the option."""
    servers = {"s8": {"command": _command(NO[8]["knobs"]), "scenarios": {"decode": _scen(tpot_ms_p50=4.2)}}}
    ok = served_steps.build(_write(tmp_path, servers, [{"step": 8, "knobs": 8, "server": "s8"}]))
    assert [r["step"] for r in ok["rows"]] == [8] and ok["rows"][0]["B_tpot_ms_p50"]["median"] == 4.2
    with pytest.raises(served_steps.ManifestError, match="overlap_schedule: ran 'on', knob set says 'off'"):
        served_steps.build(_write(tmp_path, servers, [{"step": 8, "knobs": 7, "server": "s8"}]))
    # an extra knob counts: step 10's set + an fp8 cache is not step 10's set, and is accepted as that set + extra
    kv = {"kv": {"command": _command(NO[10]["knobs"] | {"kv_cache_dtype": "fp8"}), "scenarios": {}}}
    with pytest.raises(served_steps.ManifestError, match="kv_cache_dtype"):
        served_steps.build(_write(tmp_path, kv, [{"step": 10, "knobs": 10, "server": "kv"}]))
    served_steps.build(_write(tmp_path, kv, [{"step": 10, "knobs": 10, "server": "kv", "extra": {"kv_cache_dtype": "fp8"}}]))


@pytest.mark.parametrize("case", ["gpu", "tree", "server", "knobs_no"])
def test_refused_entries(tmp_path: Path, case: str) -> None:
    servers = {"s": {"command": _command(NO[14]["knobs"], before=(case == "tree")), "scenarios": {}}}
    run = {"step": 14, "knobs": 99 if case == "knobs_no" else 14, "server": "x" if case == "server" else "s"}
    path = _write(tmp_path, servers, [run], gpu="NVIDIA H100 80GB HBM3" if case == "gpu" else "NVIDIA H200")
    msg = {"gpu": "not the manifest's H200", "tree": "ran .before/", "server": "no such server",
           "knobs_no": "engine_steps.json has steps"}[case]
    with pytest.raises(served_steps.ManifestError, match=msg):
        served_steps.build(path)


def test_launches_pool_repeats_and_skip_failures(tmp_path: Path) -> None:
    """A scenario's repeats are launches of it; a failed launch is left out; % of floor is floor / median."""
    sc = {"prefill": _scen(ttft_ms_p50=90.0), "prefill_2": _scen(ttft_ms_p50=94.0), "prefill_3": _scen(ttft_ms_p50=92.0),
          "prefill_x": _scen(ttft_ms_p50=1.0), "throughput": _scen(False, output_throughput=9e9),
          "throughput_2": _scen(output_throughput=5000.0)}
    doc = served_steps.build(_write(tmp_path, {"s": {"command": _command(NO[14]["knobs"]), "scenarios": sc}},
                                    [{"step": 14, "knobs": 14, "server": "s"}]))
    row = doc["rows"][0]
    assert row["A_ttft_ms_p50"] == {"median": 92.0, "min": 90.0, "max": 94.0, "n": 3}
    assert row["C_output_tok_s"]["n"] == 1 and row["C_output_tok_s"]["median"] == 5000.0
    assert row["frac_of_floor"]["A"] == pytest.approx(doc["floors"]["prefill_ttft_ms"] / 92.0)
    assert row["frac_of_floor"]["C"] == pytest.approx(5000.0 / doc["floors"]["throughput_tok_s"])
    assert row["frac_of_floor"]["B"] is None and 14 not in doc["unserved"] and 13 in doc["unserved"]
    # a variant keeps runs of one knob set apart (a tree before a fix); left in the plot, it is a second set there
    two = {"s": {"command": _command(NO[14]["knobs"]), "scenarios": sc}}
    runs = [{"step": 14, "knobs": 14, "server": "s"}, {"step": 14, "knobs": 14, "server": "s", "variant": "old"}]
    with pytest.raises(served_steps.ManifestError, match="two knob sets to plot"):
        served_steps.build(_write(tmp_path, two, runs))
    doc = served_steps.build(_write(tmp_path, two, [runs[0], runs[1] | {"plot": False}]))
    assert [(r["variant"], r["plot"], r["A_ttft_ms_p50"]["n"]) for r in doc["rows"]] == [("", True, 3), ("old", False, 3)]
    assert "step 14's (old)" in served_steps.markdown(doc)
    with pytest.raises(served_steps.ManifestError, match="two knob sets to plot"):
        served_steps.build(_write(tmp_path, {"s": {"command": _command(NO[14]["knobs"]), "scenarios": sc},
                                             "t": {"command": _command(NO[10]["knobs"]), "scenarios": sc}},
                                  [{"step": 14, "knobs": 14, "server": "s"}, {"step": 14, "knobs": 10, "server": "t"}]))


def test_the_kept_h200_manifest_holds_against_its_runs(tmp_path: Path) -> None:
    """Every entry of served_steps_h200.toml checks out; step 14's C pools its six launches as read from the files."""
    doc = served_steps.build(GPU / "served_steps_h200.toml")
    assert sorted({r["step"] for r in doc["rows"] if r["plot"]}) == [4, 5, 6, 7, 8, 9, 10, 14]
    c = []
    for f, srv in (("ib_show_h200_2026-12-05g.json", "s12"), ("ib_c_h200_2026-12-05f.json", "lpnpgr")):
        sc = json.loads((GPU / "results" / f).read_text())["servers"][srv]["scenarios"]
        c += [s["metrics"]["output_throughput"] for n, s in sc.items() if n.startswith("throughput") and s["ok"]]
    row = next(r for r in doc["rows"] if r["step"] == 14 and r["plot"])
    assert len(c) == 6 and row["C_output_tok_s"]["median"] == statistics.median(c)
    # the lines as % of the same floors: A 95 ms, B 4.3 ms, C 40%
    assert doc["bars"]["A"] == pytest.approx(doc["floors"]["prefill_ttft_ms"] / 95.0)
    assert doc["bars"]["B"] == pytest.approx(doc["floors"]["decode_tpot_ms"] / 4.3) and doc["bars"]["C"] == 0.40
    md = served_steps.markdown(doc)
    assert "| **14** | step 14's |" in md and "Not served on the H200: steps 1, 2, 3, 11, 12, 13." in md
    out = served_steps.write_plot(doc, tmp_path / "p.svg")
    assert out.read_text().lstrip().startswith("<?xml") and "engine step" in out.read_text()


def test_cli_bad_manifest_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert served_steps.main([str(tmp_path / "none.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("served_steps: no manifest at")
    (tmp_path / "bad.toml").write_text("gpu = \n")
    assert served_steps.main([str(tmp_path / "bad.toml")]) == 2
    assert "not TOML" in capsys.readouterr().err
