"""The real example server with one decode-path flaw patched in (the generation check's negatives).

``PYTHONPATH=examples/hfserve python tests/gates/flawed_server.py --flaw NAME <hfserve arguments>``

Every flaw leaves prompt scoring (``echo`` with ``max_tokens: 0``: one teacher-forced pass) exact,
so the teacher-forced check passes them all; only what the server generates is wrong:

* ``batch_positions`` - with more than one sequence in the batch, decode position ids count the
  generated tokens instead of the cache length (the step index where the sequence position
  belongs); alone, a request decodes correctly. Needs ``--batching on``.
* ``kv_quant3``       - the KV cache is rounded to 3 bits (per row, symmetric) before every decode
  step; the prefill and its first token are exact. Needs the manual loop.
* ``late_drop_layer`` - from the fifth generated token on, decoder layer 1 is skipped.
  Needs ``--decode-loop manual`` without batching.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from hfserve import engine as hfengine
from hfserve import server as hfserve

FLAWS = ("batch_positions", "kv_quant3", "late_drop_layer")


def _quantize_(t: torch.Tensor, bits: int) -> None:
    levels = 2 ** (bits - 1) - 1
    scale = t.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / levels
    t.copy_(torch.round(t / scale).clamp(-levels, levels) * scale)


def patch(flaw: str) -> None:
    """Patch ``hfengine.Engine`` (hfserve.engine) in place with ``flaw``."""
    engine = hfengine.Engine
    forward, decode_step = engine._forward, engine._decode_step

    if flaw == "batch_positions":
        def _decode_step(self: Any, seqs: list, cache: Any, mask: torch.Tensor) -> list[int]:
            # A step of the forge's tiny model takes ~1 ms, so a 32-token request can be over before
            # the next concurrent one is admitted, and the bug never runs (1 full run in 6: off-top
            # 0.000). 5 ms per step, like a real model's, makes the gate's concurrent probes overlap.
            time.sleep(0.005)
            if len(seqs) == 1:
                return decode_step(self, seqs, cache, mask)

            def _forward(ids: torch.Tensor, cache: Any = None, **kw: Any) -> Any:
                kw["position_ids"] = torch.tensor([[s.req.n_generated] for s in seqs])
                return forward(self, ids, cache, **kw)
            self._forward = _forward
            try:
                return decode_step(self, seqs, cache, mask)
            finally:
                del self._forward
        engine._decode_step = _decode_step
    elif flaw == "kv_quant3":
        def _forward(self: Any, ids: torch.Tensor, cache: Any = None, **kw: Any) -> Any:
            if cache is not None:
                for layer in cache.layers:
                    _quantize_(layer.keys, 3)
                    _quantize_(layer.values, 3)
            return forward(self, ids, cache, **kw)
        engine._forward = _forward
    elif flaw == "late_drop_layer":
        def _decode_step(self: Any, seqs: list, cache: Any, mask: torch.Tensor) -> list[int]:
            layer = self.model.model.layers[1]
            if min(s.req.n_generated for s in seqs) >= 4:
                layer.forward = lambda hidden_states, *a, **k: hidden_states
            try:
                return decode_step(self, seqs, cache, mask)
            finally:
                layer.__dict__.pop("forward", None)
        engine._decode_step = _decode_step
    else:
        raise SystemExit(f"unknown flaw {flaw!r}; choose one of {FLAWS}")


def main() -> None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--flaw", required=True, choices=FLAWS)
    args, rest = ap.parse_known_args()
    patch(args.flaw)
    hfserve.main(rest)


if __name__ == "__main__":
    main()
