"""Deploy time of the example server: its old loading path (from_pretrained) against the new one
(safetensors straight onto the device), side by side, alternating.

    python benchmarks/deploy_time.py [--preset small] [--rounds 3] [--knobs "--device cuda --dtype bfloat16"]
    python benchmarks/deploy_time.py --model DIR ...       # an existing model folder (the 7B on the GPU)
    python benchmarks/deploy_time.py --7b-layers 2 --knobs "--dtype bfloat16"   # 7B-shaped layers, ~0.9 GB

With ``--standby`` it compares instead a cold start against a launch run by LocalHost's standby
interpreter (orchestrator.hosts.standby; the target's ``preload`` list of examples/targets/hfserve.toml),
both ``--load fast``: each launch's server stays up ``--settle`` seconds (a trial's gates and bench,
while the standby imports), the arms alternate, and the standby arm's first launch (cold: no standby
yet) is not counted.

    python benchmarks/deploy_time.py --standby --preset tiny --rounds 5
    PYTHONPATH=.:tests python benchmarks/deploy_time.py --standby --ssh --preset tiny --rounds 5   # SSHHost, over the tests' loopback sshd

``--ssh`` launches through an SSHHost on a loopback OpenSSH server started for the run (tests/sshd_server.py,
as the test suite's), so each launch also pays its SSH round trips (`hostd start`, `hostd health`).

Without ``--model`` it forges the preset's shape with random weights (``train_steps=0``: the
loading path does not care what the weights are) into ~/.cache/infergoal/bench/. Each round starts
examples/hfserve with ``--load hf`` then ``--load fast`` (the order swaps every round),
times the launch until /health answers (what a trial's deploy step waits for), reads the server's
own "loaded ... in X s" line, and stops it. Prints one JSON line per launch and the medians.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from orchestrator.hosts import LocalHost  # noqa: E402

SERVER = ROOT / "examples" / "hfserve"  # the tree, run as a program


def forged(preset: str) -> Path:
    """The preset's shape with random weights, built once."""
    from orchestrator.models import forge

    out = Path.home() / ".cache" / "infergoal" / "bench" / f"{preset}-untrained"
    if not (out / forge.MODEL_INFO_FILE).exists():
        forge.make_model(out, preset=preset, train_steps=0)
    return out


def seven_b_layers(n: int) -> Path:
    """The 7B's layer shape (hidden 4096, MLP 14336, 32 query / 8 KV heads), ``n`` layers, random
    bf16 weights, on the small preset's tokenizer (vocabulary 4096): weights big enough on a CPU
    for the loading path to show, built once."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    src = forged("small")
    out = Path.home() / ".cache" / "infergoal" / "bench" / f"7b-layers{n}"
    if (out / "model.safetensors").exists():
        return out
    cfg = AutoConfig.from_pretrained(src)
    cfg.update({"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": n})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("model.safetensors", "config.json"))
    model.save_pretrained(tmp)
    tmp.rename(out)
    return out


def launch(host: Any, model: Path, how: str, knobs: list[str], log_dir: Path,
           preload: list[str] | None = None, settle_s: float = 0.0) -> dict:
    port = host.free_port()
    log = log_dir / f"server-{how}-{port}.log"
    t0 = time.perf_counter()
    proc = host.start([sys.executable, str(SERVER), "--model", str(model), "--port", str(port), "--load", how, *knobs],
                      env=None, cwd=None, log_path=log, preload=preload or ())
    try:
        host.wait_healthy(f"http://127.0.0.1:{port}/health", 900, proc)
        deploy = time.perf_counter() - t0
        time.sleep(settle_s)
    finally:
        host.stop(proc)
    text = log.read_text()
    m = re.search(r"loaded \S+ in ([\d.]+)s via (.+)", text)
    row = {"load": how, "deploy_s": round(deploy, 3), "load_s": float(m.group(1)) if m else None,
           "path": m.group(2).strip() if m else None, "standby": proc.standby}
    if st := re.search(r"hfserve: startup imports ([\d.]+)s engine ([\d.]+)s", text):
        row |= {"imports_s": float(st.group(1)), "engine_s": float(st.group(2))}
    return row


@contextmanager
def ssh_hosts(tmp: Path):
    """A cold and a standby SSHHost on a loopback sshd started for the run."""
    from sshd_server import Sshd

    from orchestrator.hosts.ssh import SSHHost

    server = Sshd.start(tmp / "sshd")
    (tmp / "known_hosts").write_text(server.known_hosts_line())
    hosts = [SSHHost(server.spec(name, workdir=tmp / "remote"), state_dir=tmp / name, known_hosts=tmp / "known_hosts",
                     standby=name == "warm") for name in ("cold", "warm")]
    try:
        yield hosts
    finally:
        for h in hosts:
            h.close()
        server.stop()


def standby_rounds(model: Path, rounds: int, knobs: list[str], settle_s: float, tmp: Path, ssh: bool = False) -> None:
    """Cold against standby launches, alternated (see the module's doc)."""
    if ssh:
        with ssh_hosts(tmp) as (cold, warm):
            return _standby_rounds(model, rounds, knobs, settle_s, tmp, cold, warm)
    _standby_rounds(model, rounds, knobs, settle_s, tmp, LocalHost(tmp / "cold", standby=False), LocalHost(tmp / "warm"))


def _standby_rounds(model: Path, rounds: int, knobs: list[str], settle_s: float, tmp: Path, cold: Any, warm: Any) -> None:
    from orchestrator.targets import load_target

    preload = load_target(ROOT / "examples" / "targets" / "hfserve.toml").preload
    launch(warm, model, "fast", knobs, tmp, preload, settle_s)  # makes the first standby; not counted
    rows = []
    try:
        for r in range(rounds):
            for arm in (("cold", "standby") if r % 2 == 0 else ("standby", "cold")):
                host = warm if arm == "standby" else cold
                row = {"round": r, "arm": arm, **launch(host, model, "fast", knobs, tmp, preload, settle_s)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        warm.close()
    med = {arm: {k: statistics.median(x[k] for x in rows if x["arm"] == arm) for k in ("deploy_s", "imports_s", "engine_s")}
           for arm in ("cold", "standby")}
    print(json.dumps({"model": str(model), "median": med, "standby_used": sum(x["standby"] for x in rows if x["arm"] == "standby"),
                      "deploy_saved_s": round(med["cold"]["deploy_s"] - med["standby"]["deploy_s"], 3)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="small", help="forge preset (default: small, the largest quick one)")
    ap.add_argument("--model", default="", help="an existing model folder instead of a forged preset")
    ap.add_argument("--7b-layers", dest="layers", type=int, default=0,
                    help="instead: the 7B's layer shape with this many layers (bf16, ~0.44 GB a layer)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--knobs", default="", help="extra server arguments, e.g. '--device cuda --dtype bfloat16'")
    ap.add_argument("--standby", action="store_true", help="cold start against the standby interpreter instead")
    ap.add_argument("--settle", type=float, default=12.0, help="--standby: seconds each server stays up")
    ap.add_argument("--ssh", action="store_true", help="--standby: launch through SSHHost on a loopback sshd")
    args = ap.parse_args()
    model = Path(args.model) if args.model else seven_b_layers(args.layers) if args.layers else forged(args.preset)
    if args.standby:
        with tempfile.TemporaryDirectory() as tmp:
            standby_rounds(model, args.rounds, args.knobs.split(), args.settle, Path(tmp), args.ssh)
        return
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        host = LocalHost(Path(tmp) / "state")
        for r in range(args.rounds):
            for how in (("hf", "fast") if r % 2 == 0 else ("fast", "hf")):
                row = {"round": r, **launch(host, model, how, args.knobs.split(), Path(tmp))}
                print(json.dumps(row), flush=True)
                rows.append(row)
    med = {how: {k: statistics.median(x[k] for x in rows if x["load"] == how and x[k] is not None)
                 for k in ("deploy_s", "load_s")} for how in ("hf", "fast")}
    print(json.dumps({"model": str(model), "median": med,
                      "deploy_saved_s": round(med["hf"]["deploy_s"] - med["fast"]["deploy_s"], 3)}))


if __name__ == "__main__":
    main()
