"""The gates' reference-side work, one at a time (before) and batched (after), in one process.

    python benchmarks/gate_reference_time.py [--model DIR] [--rounds 3]   # default: the forge's tiny model

What one accuracy gate run asks of the float32 reference (gates/thresholds.toml): the greedy
continuations of 12 generation prompts of 33 ids (32 new tokens each), the teacher-forced rows of
8 windows of 97 ids, and the teacher-forced score of 12 served continuations. Times each the way
the gates did it before (a loop of single-sequence calls) and the way they do now
(`reference_greedy_many`, `_reference_rows`, `score_many`), alternating, fresh prompts every round,
caches emptied. On the GPU pass the 7B's folder (`--model`): that is the prediction to check.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from gates import reference  # noqa: E402
from gates.accuracy import _heldout_ids, _reference_rows, draw_windows, load_reference  # noqa: E402
from gates.reference import reference_greedy, reference_greedy_many, score_many  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="model folder (default: the forge's tiny model)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch

    from orchestrator.models import forge

    model, tok = load_reference(Path(args.model) if args.model else forge.default_model())
    heldout = _heldout_ids(tok)
    times: dict[str, list[float]] = {}

    def timed(label: str, fn) -> None:
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        times.setdefault(label, []).append(time.perf_counter() - t0)

    def forward_each(windows: list[list[int]]) -> None:
        with torch.no_grad():
            for w in windows:
                model(torch.tensor([w], device=model.device)).logits[0].float().cpu()

    for rnd in range(args.rounds + 1):  # round 0 warms kernels and allocators up, not counted
        rng = random.Random(1000 + rnd)
        prompts = [[tok.bos_token_id, *w] for w in draw_windows(heldout, rng, 12, 32)]
        windows = [[tok.bos_token_id, *w] for w in draw_windows(heldout, rng, 8, 96)]
        reference._GREEDY_CACHE.clear()
        timed("greedy, one prompt at a time", lambda ps=prompts: [reference_greedy(model, p, 32) for p in ps])
        served = [reference_greedy(model, p, 32)[0] for p in prompts]
        reference._GREEDY_CACHE.clear()
        timed("greedy, batched", lambda ps=prompts: reference_greedy_many(model, ps, 32))
        timed("teacher-forced windows, one at a time", lambda ws=windows: forward_each(ws))
        timed("teacher-forced windows, batched", lambda ws=windows: _reference_rows(model, ws, {}, 0.0))
        pairs = list(zip(prompts, served, strict=True))
        reference._SCORE_CACHE.clear()
        timed("scoring, one at a time", lambda pp=pairs: [score_many(model, [pair]) for pair in pp])
        reference._SCORE_CACHE.clear()
        timed("scoring, batched", lambda pp=pairs: score_many(model, pp))
        timed("scoring, cached (same ids again)", lambda pp=pairs: score_many(model, pp))
        if rnd == 0:
            times.clear()
    print(f"reference on {model.device}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
          f"{args.rounds} rounds (median, min-max seconds):")
    for label, ts in times.items():
        print(f"  {label:<40} {statistics.median(ts):8.3f}   {min(ts):.3f}-{max(ts):.3f}")


if __name__ == "__main__":
    main()
