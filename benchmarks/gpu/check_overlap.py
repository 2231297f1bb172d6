"""The fast engine's --overlap-schedule on the GPU, engine only (no HTTP): same tokens, and the step time.

    python benchmarks/gpu/check_overlap.py MODEL_DIR [--n 64] [--kernels triton-mv] [--stream-us 30] [--logprobs K] [--out F]

One FastEngine (CUDA graphs), one burst of ``--n`` greedy requests of ``--prompt`` tokens with ``--out-tokens``
each (all the same length: no row leaves early, so both ways decode the same rows in the same slots and the
tokens must be equal bit for bit), run alternately with the plain step (``overlap`` off) and the overlap
schedule (on), ``--reps`` times each, on the same engine and graphs. An asyncio loop in its own thread plays
the server's event loop: one task per request reads its events and spends ``--stream-us`` of Python per
event batch (the server's detokenize + SSE + socket write, ~30-45 us per stream per step measured on the
CPU), holding the GIL as the server's streaming does. Per run: the burst's wall time, the median time
between decode steps while every row decodes (the served ITL's engine part), and its ratio to the device's
own step (the same graph replayed back to back, CUDA events). ``--device cpu`` runs it on a tiny model
(no graphs): a smoke test of the script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import torch
from hfserve.engine import GenRequest  # noqa: E402
from hfserve.fast import FastEngine  # noqa: E402


def _spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def burst(eng: FastEngine, loop: asyncio.AbstractEventLoop, prompts: list[list[int]], out_tokens: int,
          stream_us: float, logprobs: int | None = None) -> dict:
    marks: list[tuple[int, float]] = []
    real = eng._decode

    def timed(active, late):
        marks.append((len(active), time.perf_counter()))
        return real(active, late)

    eng._decode = timed
    reqs = [GenRequest(prompt_ids=p, max_tokens=out_tokens, temperature=0.0, top_p=1.0, seed=None, ignore_eos=True,
                       logprobs=logprobs, loop=loop) for p in prompts]

    async def consume(r: GenRequest) -> list[int]:
        toks: list[int] = []
        while True:
            evs = await r.events.get_batch()
            _spin(stream_us)
            for kind, payload in evs:
                if kind == "token":
                    toks.append(payload if isinstance(payload, int) else payload.token_id)
                elif kind == "done":
                    return toks
                else:
                    raise RuntimeError(payload)

    async def all_of() -> list[list[int]]:
        return await asyncio.gather(*(consume(r) for r in reqs))

    t0 = time.perf_counter()
    fut = asyncio.run_coroutine_threadsafe(all_of(), loop)
    for r in reqs:
        eng.submit(r)
    toks = fut.result(600)
    wall = time.perf_counter() - t0
    eng._decode = real
    full = [t for n, t in marks if n == len(prompts)]
    gaps = sorted(b - a for a, b in zip(full, full[1:], strict=False))
    return {"tokens": toks, "wall_s": wall, "steps": len(full),
            "step_ms_p50": gaps[len(gaps) // 2] * 1000 if gaps else None,
            "step_ms_mean": sum(gaps) / len(gaps) * 1000 if gaps else None}


def device_step_ms(eng: FastEngine, n: int, pos: int) -> float | None:
    """The batch-n graph alone, replayed back to back (CUDA events): the device's own step."""
    if eng.fm.device.type != "cuda":
        return None
    dec = eng.decoder
    with torch.inference_mode():
        for _ in range(3):
            dec.launch([1] * n, [pos] * n)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            dec.launch([1] * n, [pos] * n)
        b.record()
        b.synchronize()
    return a.elapsed_time(b) / 20


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--out-tokens", type=int, default=128)
    ap.add_argument("--kernels", default="triton-mv")
    ap.add_argument("--stream-us", type=float, default=30.0, help="event loop Python per stream per step")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--logprobs", type=int, default=None,
                    help="each request asks for K logprobs (the bench and the gates ask for 0: the chosen token's)")
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="the KV pool's capacity per slot (default: prompt + outputs + 64; the server's is 4608)")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    cuda = a.device.startswith("cuda")
    eng = FastEngine(a.model, dtype="bfloat16" if cuda else "float32", device=a.device, max_batch_size=a.n,
                     max_model_len=a.max_model_len or a.prompt + a.out_tokens + 64, cuda_graphs=cuda, kernels=a.kernels if cuda else "torch",
                     prefill_pack=a.n * a.prompt, prefill_attn="fused" if cuda else "torch")
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    gen = torch.Generator().manual_seed(7)
    vocab = eng.model.config.vocab_size
    prompts = [torch.randint(4, vocab - 1, (a.prompt,), generator=gen).tolist() for _ in range(a.n)]
    burst(eng, loop, prompts[:2], 4, 0.0)  # warm-up: first prefill and decode outside the timing
    default_switch = sys.getswitchinterval()
    runs = []
    for rep in range(a.reps):
        for overlap in (False, True):
            eng.overlap = overlap
            sys.setswitchinterval(0.0005 if overlap else default_switch)
            r = burst(eng, loop, prompts, a.out_tokens, a.stream_us, a.logprobs)
            r.update(overlap=overlap, rep=rep)
            runs.append(r)
            print(f"overlap={'on ' if overlap else 'off'} rep {rep}: burst {r['wall_s']:.3f} s, steps {r['steps']}, "
                  f"step p50 {r['step_ms_p50']:.3f} ms mean {r['step_ms_mean']:.3f} ms", flush=True)
    dev = device_step_ms(eng, a.n, a.prompt + a.out_tokens // 2)
    same = all(r["tokens"] == runs[0]["tokens"] for r in runs)
    print(f"device step (batch {a.n}, graph alone, KV capacity {eng.fm.capacity}): {dev if dev is None else round(dev, 3)}"
          f" ms; tokens equal in every"
          f" run: {same}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "device_step_ms": dev, "tokens_equal": same,
                                           "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]},
                                          indent=1))
    if not same:
        raise SystemExit("check_overlap: the overlap schedule changed the tokens")


if __name__ == "__main__":
    main()
