"""GPU-only checks of the fast engine: CUDA-graph decode equals eager decode and tracks prefill.

Opt-in: runs only with INFERGOAL_GPU_TESTS=1 on a machine with CUDA (never in CI). On the H200
the same checks ran on the 7B model through benchmarks/gpu/check_engine.py (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(os.environ.get("INFERGOAL_GPU_TESTS") != "1" or not torch.cuda.is_available(),
                       reason="GPU tests are opt-in: INFERGOAL_GPU_TESTS=1 on a CUDA machine"),
]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "hfserve"))
from fastengine import FastModel, GraphDecoder  # noqa: E402


@torch.inference_mode()
def test_graph_decode_equals_eager_and_prefill(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16, device_map="cuda").eval()
    fm = FastModel(hf, slots=6, capacity=600)
    graphs, eager = GraphDecoder(fm, 4, use_graphs=True), GraphDecoder(fm, 4, use_graphs=False)
    graphs.capture_all()
    ids = torch.randint(4, 2000, (300,), device="cuda")
    full = torch.log_softmax(fm.prefill(ids, 5, 0, all_logits=True), -1)
    for n in (3, 4):  # a padded bucket and a full one
        for slot in range(n):
            fm.prefill(ids[:200 + slot], slot, 0)
        toks, pos = [int(ids[200 + s]) for s in range(n)], [200 + s for s in range(n)]
        lg, _ = graphs.step(toks, pos)
        lg = lg[:n].clone()
        for slot in range(n):
            fm.prefill(ids[:200 + slot], slot, 0)
        le, _ = eager.step(toks, pos)
        assert torch.equal(lg, le[:n])
        for s in range(n):
            lp = torch.log_softmax(lg[s], -1)
            assert float((lp - full[200 + s]).abs().max()) < 0.1  # bf16 prefill vs decode kernels
