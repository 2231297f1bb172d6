"""On the GPU: the accuracy gate passes the honest fast engine and fails a dropped layer, on the 7B.

    python benchmarks/gpu/gate_demo.py MODEL_DIR [--out gate_demo.json] [--flags "--kernels triton-mm ..."]

Serves MODEL_DIR with hfserve's fast engine (bf16, batching, CUDA graphs) and runs the real
accuracy gate against the float32 reference on the GPU; then serves a copy whose config drops the
last decoder layer (the weights are the same files, linked) and runs the gate again. ``--flags`` adds server
flags to both (a headline configuration's: the overlap schedule, Triton kernels, batched prefill attention).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from gates import accuracy  # noqa: E402
from orchestrator.hosts import LocalHost  # noqa: E402

KNOBS = ["--device", "cuda", "--engine", "fast", "--dtype", "bfloat16", "--batching", "on",
         "--max-batch-size", "8", "--cuda-graphs", "on", "--max-model-len", "1024"]


def dropped_layer_copy(src: Path, dst: Path) -> Path:
    """A folder serving ``src`` minus its last layer: the same weight files, a config with one layer fewer."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "config.json":
            os.symlink(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] -= 1
    if cfg.get("layer_types"):
        cfg["layer_types"] = cfg["layer_types"][:-1]
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def gate(model: Path, reference: Path, state: Path, flags: tuple[str, ...] = ()) -> dict:
    host = LocalHost(state)
    port = host.free_port()
    proc = host.start([sys.executable, str(ROOT / "examples/hfserve"), "--model", str(model),
                       "--port", str(port), *KNOBS, *flags], env=None, cwd=None, log_path=state / f"server-{port}.log")
    try:
        host.wait_healthy(f"http://127.0.0.1:{port}/health", 300, proc)
        r = accuracy.check(f"http://127.0.0.1:{port}", served_model=model.name, reference_model_dir=reference)
        return {"status": r.status, "reason": r.reason, "metrics": r.details.get("metrics")}
    finally:
        host.stop(proc)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out", default="")
    ap.add_argument("--dropped-only", action="store_true", help="skip the honest server (the loop's trials show it)")
    ap.add_argument("--honest-only", action="store_true", help="skip the dropped layer (shown failing by another run)")
    ap.add_argument("--flags", default="", help="more server flags for both servers (one string)")
    args = ap.parse_args(argv)
    if args.dropped_only and args.honest_only:
        ap.error("--dropped-only and --honest-only leave nothing to run")
    model = Path(args.model)
    flags = tuple(shlex.split(args.flags))
    state = Path(tempfile.mkdtemp(prefix="gate-demo-"))
    res: dict = {"flags": list(KNOBS) + list(flags)}
    if not args.dropped_only:
        res["honest_fast_bf16"] = gate(model, model, state, flags)
    if not args.honest_only:
        res["dropped_last_layer"] = gate(dropped_layer_copy(model, state / "dropped"), model, state, flags)
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
