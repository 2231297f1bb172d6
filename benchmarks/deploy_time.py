"""Deploy time of the example server: its old loading path (from_pretrained) against the new one
(safetensors straight onto the device), side by side, alternating.

    python benchmarks/deploy_time.py [--preset small] [--rounds 3] [--knobs "--device cuda --dtype bfloat16"]
    python benchmarks/deploy_time.py --model DIR ...       # an existing model folder (the 7B on the GPU)
    python benchmarks/deploy_time.py --7b-layers 2 --knobs "--dtype bfloat16"   # 7B-shaped layers, ~0.9 GB

Without ``--model`` it forges the preset's shape with random weights (``train_steps=0``: the
loading path does not care what the weights are) into ~/.cache/infergoal/bench/. Each round starts
examples/hfserve/server.py with ``--load hf`` then ``--load fast`` (the order swaps every round),
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.hosts import LocalHost  # noqa: E402

SERVER = ROOT / "examples" / "hfserve" / "server.py"


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


def launch(host: LocalHost, model: Path, how: str, knobs: list[str], log_dir: Path) -> dict:
    port = host.free_port()
    log = log_dir / f"server-{how}-{port}.log"
    t0 = time.perf_counter()
    proc = host.start([sys.executable, str(SERVER), "--model", str(model), "--port", str(port), "--load", how, *knobs],
                      env=None, cwd=None, log_path=log)
    try:
        host.wait_healthy(f"http://127.0.0.1:{port}/health", 900, proc)
        deploy = time.perf_counter() - t0
    finally:
        host.stop(proc)
    m = re.search(r"loaded \S+ in ([\d.]+)s via (.+)", log.read_text())
    return {"load": how, "deploy_s": round(deploy, 3), "load_s": float(m.group(1)) if m else None,
            "path": m.group(2).strip() if m else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="small", help="forge preset (default: small, the largest quick one)")
    ap.add_argument("--model", default="", help="an existing model folder instead of a forged preset")
    ap.add_argument("--7b-layers", dest="layers", type=int, default=0,
                    help="instead: the 7B's layer shape with this many layers (bf16, ~0.44 GB a layer)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--knobs", default="", help="extra server arguments, e.g. '--device cuda --dtype bfloat16'")
    args = ap.parse_args()
    model = Path(args.model) if args.model else seven_b_layers(args.layers) if args.layers else forged(args.preset)
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
