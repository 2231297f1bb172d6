"""Speed of light on this GPU: measure copy bandwidth and bf16 matrix rate, then floor each scenario.

    python benchmarks/gpu/sol.py --scenarios benchmarks/gpu/scenarios.toml --out sol.json
    python benchmarks/gpu/sol.py --config MODEL/config.json --ceilings results/sol.json --out floors.json

A floor is the larger of (FLOPs / matrix rate) and (bytes that must move / copy bandwidth) for
the model's shape (a Llama/Mistral config, or a forge preset's: default 7b-peaked); the formulas live in
gates/plausible.py, which holds every trial of a run with these floors only when the recorded shape is
the trial's model's. ``--ceilings`` takes the ceilings of an earlier run of this script instead of
measuring them (no GPU needed): another model's floors on the same card.

* A (TTFT): one prefill of P tokens: 2*N*P FLOPs for the weights + causal attention, weights read once.
* B (TPOT): one decode step at batch 1: the weights plus the sequence's KV read once.
* C (output tok/s): R requests of P prompt / O output tokens: the prefill FLOPs of all prompts, and
  at least O sequential decode steps that each read the weights: floor time = max of the two.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import tomllib

# One owner of the formulas: the speed-of-light check (gates/plausible.py) recomputes these floors per trial.
from gates.plausible import floors, model_numbers  # noqa: E402


def measure(gib: float = 4.0, n: int = 8192, reps: int = 20) -> dict[str, float]:
    """Device-to-device copy bandwidth (bytes read + written) and bf16 GEMM rate, medians."""
    import torch
    from check_engine import cuda_time  # 3 warm-ups, median of the CUDA-event times, ms

    src = torch.randn(int(gib * 2**30) // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    t = cuda_time(lambda: dst.copy_(src), reps) / 1000
    bw = 2 * src.numel() * 2 / t
    src = dst = None  # free before the GEMM buffers
    x = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")  # random, not zeros (zeros run faster)
    y = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    t = cuda_time(lambda: x @ y, reps) / 1000
    return {"copy_bytes_per_s": bw, "bf16_flops_per_s": 2 * n**3 / t, "gpu": torch.cuda.get_device_name()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=str(Path(__file__).with_name("scenarios.toml")))
    ap.add_argument("--config", default="", help="model config.json (default: --preset's shape)")
    ap.add_argument("--preset", default="7b-peaked", help="a forge preset's shape (orchestrator/models/forge.py)")
    ap.add_argument("--ceilings", default="", help="an earlier sol.py JSON whose ceilings to use (no measuring)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.config:
        cfg = json.loads(Path(args.config).read_text())
    else:
        from orchestrator.models.forge import PRESETS

        if args.preset not in PRESETS:
            raise SystemExit(f"sol.py: no forge preset {args.preset!r}; choose from {', '.join(sorted(PRESETS))}")
        p = PRESETS[args.preset]
        cfg = {k: getattr(p, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                           "vocab_size", "num_attention_heads", "num_key_value_heads")}
    if args.ceilings:
        try:
            ceil = dict(json.loads(Path(args.ceilings).read_text())["ceilings"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"sol.py: --ceilings {args.ceilings}: no ceilings there ({e}); give a JSON sol.py wrote") from None
    else:
        ceil = measure()
    m = model_numbers(cfg)
    scen = tomllib.loads(Path(args.scenarios).read_text())
    res = {"ceilings": ceil, "model": m, "floors": floors(scen, m, ceil)}
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    assert math.isfinite(ceil["copy_bytes_per_s"])


if __name__ == "__main__":
    main()
