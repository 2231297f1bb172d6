"""The one-command GPU scripts (benchmarks/gpu/*.sh) parse: a syntax error found on the device costs a fresh machine's
start (minutes of GPU time) for nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "benchmarks/gpu").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_gpu_script_parses(script: Path) -> None:
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_the_scripts_are_found() -> None:
    assert {"device_env.sh", "step12_one.sh", "step12_show.sh"} <= {s.name for s in SCRIPTS}


def test_device_env_builds_the_servers_and_the_ib_run(tmp_path: Path) -> None:
    """device_env.sh's logged and ib_servers (the step scripts' A/B runs): each server's command with its step log (and
    extra environment), ib_baseline's argv with the scenarios file and the time kept for what follows; python3 and
    timeout stubbed (no wheels installed, nothing run)."""
    root = SCRIPTS[0].parents[2]
    script = f"""set -u
OUT={tmp_path}; START=$SECONDS; LIMIT=500
python3() {{ :; }}
. benchmarks/gpu/device_env.sh
unset -f python3
ARGS="--model {{model}} $FLAGS"
timeout() {{ echo "limit $1"; shift; printf '%s|' "$@"; echo; }}
logged lpnpg $LP --gc-freeze on
logged lpp0 HFSERVE_PDL_PREFETCH=0 $LP --pdl on
LOG_TAG=show_ logged s12 $LP
M=/m IB_SCENARIOS=sc.toml IB_RESERVE_S=130 ib_servers "$OUT/x.json" a,b 45 "n=cmd one"
M=/m ib_servers "$OUT/y.json" "" 90 "n=cmd"
"""
    r = subprocess.run(["bash", "-c", script], cwd=root, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    lp = "--kernels triton-mm --prefill-attn fused-batched --decode-attn lowp"
    srv = "{python} examples/hfserve/server.py --model {model} --dtype bfloat16"
    assert lines[0].startswith(f"lpnpg=env HFSERVE_STEP_LOG={tmp_path}/steps_lpnpg.log {srv}")
    assert lines[0].endswith(f"--overlap-schedule on {lp} --gc-freeze on")
    assert lines[1].startswith(f"lpp0=env HFSERVE_PDL_PREFETCH=0 HFSERVE_STEP_LOG={tmp_path}/steps_lpp0.log {srv}")
    assert lines[2].startswith(f"s12=env HFSERVE_STEP_LOG={tmp_path}/steps_show_s12.log ")
    assert lines[3] == "limit 370"  # 500 s less the 130 kept
    assert lines[4] == (f"python3|benchmarks/gpu/ib_baseline.py|/m|--out|{tmp_path}/x.json|--no-naive|--only|a,b|"
                        "--scenarios|sc.toml|--deadline-s|345|--ours-min-s|45|--server|n=cmd one|")
    assert lines[5] == "limit 490"
    assert lines[6] == (f"python3|benchmarks/gpu/ib_baseline.py|/m|--out|{tmp_path}/y.json|--no-naive|--deadline-s|465|"
                        "--ours-min-s|90|--server|n=cmd|")


def test_served_steps_run_serves_exactly_the_engine_steps(tmp_path: Path) -> None:
    """served_steps_run.sh's five servers (python3 and timeout stubbed: nothing runs) launch exactly engine steps
    14, 13, 12, 11 and step 10's knob set, as served_steps.py checks a manifest entry against its run: their results
    go into served_steps_h200.toml as they come back. A flag dropped or added in the script fails here."""
    pytest.importorskip("torch")  # served_steps parses with the server's own parser
    import json
    import os
    import sys

    root = SCRIPTS[0].parents[2]
    sys.path.insert(0, str(root / "benchmarks" / "gpu"))
    import served_steps

    from orchestrator.targets.spec import load_target

    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "python3").write_text("#!/bin/sh\nexit 0\n")
    (stubs / "timeout").write_text(f"#!/bin/sh\nshift\nprintf '%s\\n' \"$@\" > {tmp_path}/argv\n")
    for f in stubs.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "OUT": str(tmp_path)}
    r = subprocess.run(["bash", "benchmarks/gpu/served_steps_run.sh", "360"], cwd=root, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    servers = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--server")
    assert list(servers) == ["s14", "s13", "lp", "s12", "s11"]
    fill = {"{python}": "python3", "{model}": "/m", "{port}": "8000", "{device}": "cuda", "{name}": "model"}
    report = {"gpu": "NVIDIA H200", "servers": {}}
    for name, cmd in servers.items():
        for k, v in fill.items():
            cmd = cmd.replace(k, v)
        report["servers"][name] = {"command": cmd}
    steps = json.loads((root / "benchmarks/gpu/engine_steps.json").read_text())
    by_no = dict(zip(served_steps.step_numbers(steps), steps, strict=True))
    parse, target = served_steps._server_parse(), load_target(served_steps.TARGET)
    for name, step in {"s14": 14, "s13": 13, "s12": 12, "s11": 11, "lp": 10}.items():
        served_steps.check_entry({"file": "ib_steps.json", "server": name}, report, by_no[step]["knobs"], gpu="H200",
                                 parse=parse, target=target)
    with pytest.raises(served_steps.ManifestError, match="pdl"):  # and the check can fail: s13 is not step 12
        served_steps.check_entry({"file": "ib_steps.json", "server": "s13"}, report, by_no[12]["knobs"], gpu="H200",
                                 parse=parse, target=target)
