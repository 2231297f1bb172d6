"""The fast engine refuses, at start-up and in one line, a combination it cannot serve: torch's
memory-efficient SDPA has no grouped-query attention, so `--sdpa efficient` with a fused prefill
attention (SDPA over the pool's K/V with enable_gqa) on a grouped-query model is refused there,
where it would otherwise answer every request with a server error; the same flags on a model with
as many KV heads as query heads, or with the torch prefill attention (the cache repeated per head), serve."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from hfserve.fast import FastModel  # noqa: E402

from orchestrator.targets.failures import classify_log  # noqa: E402


@pytest.fixture
def interpreted(monkeypatch):
    """The fused prefill attention's Triton kernels on the CPU (interpreter)."""
    pytest.importorskip("triton", reason="triton is not installed")
    from triton_interp import import_interpreted  # beside this file

    import_interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _llama(kv_heads: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=kv_heads, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("attn", ["fused", "fused-batched"])
@torch.inference_mode()
def test_efficient_sdpa_with_fused_prefill_attention_on_gqa_is_refused_in_one_line(attn, interpreted) -> None:
    with pytest.raises(ValueError) as e:
        FastModel(_llama(2), slots=2, capacity=64, sdpa="efficient", prefill_attn=attn)
    msg = str(e.value)
    assert "\n" not in msg and "--sdpa efficient" in msg and "4 heads, 2 KV heads" in msg and "use --sdpa" in msg
    # the loop reads it as the engine's own validation, not a crash of unknown cause
    assert classify_log(f"Traceback ...\nValueError: {msg}").kind == "constraint_violated"


@torch.inference_mode()
def test_what_it_can_serve_is_not_refused(interpreted) -> None:
    assert FastModel(_llama(4), slots=2, capacity=64, sdpa="efficient", prefill_attn="fused").prefill_attn == "fused"
    assert FastModel(_llama(2), slots=2, capacity=64, sdpa="efficient", prefill_attn="torch").sdpa == "efficient"
    assert FastModel(_llama(2), slots=2, capacity=64, sdpa="flash", prefill_attn="fused").prefill_attn == "fused"
