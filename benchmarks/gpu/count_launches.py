"""Count the kernels one decode step launches, per kernels setting, on the CPU (no GPU needed).

    TRITON_INTERPRET=1 python benchmarks/gpu/count_launches.py [--batch 1] [--layers 2 3]

Builds a tiny random Llama (FastModel over transformers' LlamaForCausalLM, head_dim 16) for each
layer count, runs one eager decode step per ``--kernels`` setting and counts what would be a CUDA
kernel on the GPU: every Triton launch (hfserve.hfkernels' kernels, counted at their launcher) and every
aten op that computes (matmuls, elementwise, reductions, index/gather, copies; views, reshapes,
``empty`` allocations and other metadata ops are not kernels). The per-layer count is the
difference between two layer counts, so the step's fixed part (embedding, final norm, lm_head,
the float cast, argmax) falls out. The CUDA graph replays exactly these launches.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# aten ops that launch no kernel (views, metadata, allocation without initialisation).
_FREE = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select", "unsqueeze",
         "squeeze", "as_strided", "alias", "detach", "empty", "empty_like", "empty_strided", "split", "unbind",
         "_reshape_alias", "lift_fresh", "split_with_sizes", "numpy_T", "contiguous", "_to_copy_noop"}


def count(fm, kernels: str, batch: int) -> Counter:
    import torch
    from hfserve import hfkernels as K
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: Counter = Counter()
    inside: list[int] = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in _FREE and not inside:  # the interpreter's own tensor work inside a launch is not counted
                seen["aten." + name] += 1
            return func(*args, **(kwargs or {}))

    class Launcher:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            inner = self.fn[grid]

            def launch(*a, **k):
                seen["triton." + self.name] += 1
                inside.append(1)
                try:
                    return inner(*a, **k)
                finally:
                    inside.pop()
            return launch

    saved = {n: getattr(K, n) for n in dir(K) if n.startswith("_") and n.endswith(("_kernel", "_tuned"))}
    for n, f in saved.items():
        K.rebind(n, Launcher(n.lstrip("_"), f))
    try:
        fm.set_kernels(kernels)
        tokens = torch.tensor([5] * batch)
        pos = torch.tensor([20 + i for i in range(batch)])
        with torch.inference_mode(), Ops():
            fm.decode(tokens, pos, 256)
    finally:
        for n, f in saved.items():
            K.rebind(n, f)
        fm.set_kernels("torch")
    return seen


def tiny(layers: int):
    import torch
    from hfserve.fast import FastModel
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.inference_mode():
        return FastModel(LlamaForCausalLM(cfg).eval(), slots=4, capacity=300)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, nargs=2, default=[2, 3])
    ap.add_argument("--kernels", nargs="+", default=["torch", "triton", "triton-gemv"])
    ap.add_argument("--splits", type=int, default=0, help="force decode attention's split count (0: split_count)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from hfserve import hfkernels as K

    if args.splits:  # the H200's batch-1 plan at a 1024 bucket is 8 splits (two launches); the tiny bucket's is 1
        orig = K.decode_attn
        K.rebind("decode_attn", lambda *a, **k: orig(*a, **{**k, "splits": args.splits}))
        K._OPS = {n: type(o)(**{**o.__dict__, "decode_attn": K.decode_attn}) if n != "torch" else o
                  for n, o in K._OPS.items()}
    lo, hi = args.layers
    res: dict = {"batch": args.batch, "layers": [lo, hi], "splits": args.splits or "split_count"}
    models = {n: tiny(n) for n in (lo, hi)}
    for kern in args.kernels:
        c = {n: count(models[n], kern, args.batch) for n in (lo, hi)}
        per_layer = (sum(c[hi].values()) - sum(c[lo].values())) / (hi - lo)
        fixed = sum(c[lo].values()) - lo * per_layer
        layer_ops = {k: (c[hi][k] - c[lo][k]) / (hi - lo) for k in c[hi] if c[hi][k] != c[lo][k]}
        res[kern] = {"per_layer": per_layer, "fixed": fixed, "layer_ops": layer_ops,
                     "step_at_32_layers": fixed + 32 * per_layer}
        print(f"{kern:12s} per layer {per_layer:5.1f}  fixed {fixed:4.1f}  at 32 layers {fixed + 32 * per_layer:6.1f}"
              f"  {json.dumps(layer_ops)}", flush=True)
    return res


if __name__ == "__main__":
    main()
