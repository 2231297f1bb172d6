"""Tests of the model forge: a trained tiny model that transformers loads, and the cache."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from orchestrator.models import forge  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tiny_model: Path) -> Path:
    """The session's forged model (tests/conftest.py: `forge.default_model()`, the preset's full
    training, cached). A model of its own here (120 steps) was 24-50 s of `make test`; the layout of a
    folder `make_model` writes from scratch is checked in `test_default_model_is_cached`."""
    return tiny_model


def _check_layout(folder: Path, train_steps: int) -> dict:
    for name in ("config.json", "tokenizer.json", "model.safetensors", forge.MODEL_INFO_FILE):
        assert (folder / name).exists(), name
    info = json.loads((folder / forge.MODEL_INFO_FILE).read_text())
    assert info["preset"] == "tiny" and info["seed"] == 0 and info["forge_version"] == forge.FORGE_VERSION
    assert info["train_steps"] == train_steps
    return info


def test_folder_layout_and_info(tiny: Path) -> None:
    info = _check_layout(tiny, forge.PRESETS["tiny"].train_steps)
    assert info["final_loss"] < info["ln_vocab"] - 1.5  # clearly learned something


def test_tokenizer_round_trip_and_chat_template(tiny: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    text = "def f(x):\n    return {'a': x ** 2}  # ünïcode ✓\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.eos_token and tok.pad_token
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                       tokenize=False)
    assert "hi" in rendered and rendered.endswith("<|assistant|>\n")


def test_model_is_peaked_on_heldout_text(tiny: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    _, held = forge.corpus_split()
    ids = torch.tensor([tok(held[0][:4000])["input_ids"][:256]])
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    vocab = model.config.vocab_size
    mean_max = probs.max(dim=-1).values.mean().item()
    assert mean_max > 20.0 / vocab, mean_max  # random weights sit near 1/vocab
    nll = -torch.log(probs[:-1].gather(-1, ids[0, 1:, None])).mean().item()
    assert nll < math.log(vocab) - 1.0


def test_default_model_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERGOAL_CACHE", str(tmp_path))
    # A short recipe keeps the test fast; caching logic does not depend on the step count.
    monkeypatch.setitem(forge.PRESETS, "tiny", dataclasses.replace(forge.PRESETS["tiny"], train_steps=5))
    first = forge.default_model()
    assert first.parent == tmp_path / "models"
    _check_layout(first, 5)  # a folder written from scratch by make_model
    t0 = time.monotonic()
    second = forge.default_model()
    assert second == first and time.monotonic() - t0 < 1.0
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".tiny") and p.is_dir()]  # no temp left


def test_unknown_preset_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        forge.make_model(tmp_path, preset="nope")


def test_low_memory_training_is_the_same_arithmetic() -> None:
    """The 80 GB cards train the 7B with activation checkpointing (forge.LOW_MEMORY_BYTES): recomputing the layers in
    the backward pass must give the same model as keeping their activations (an H100-forged 7B is the H200's)."""
    p = dataclasses.replace(forge.PRESETS["tiny"], seq_len=32, batch_size=4)  # the recipe; the shape is below
    ids = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(1))
    results = []
    for low in (False, True):
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(cfg)
        loss = forge._train(model, ids, p, steps=6, seed=0, low_memory=low)
        assert not getattr(model, "is_activation_checkpointing", None) and not model.model.gradient_checkpointing  # off again
        results.append((loss, torch.cat([w.detach().flatten() for w in model.parameters()])))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5)
    assert not torch.equal(results[1][1], torch.zeros_like(results[1][1]))
