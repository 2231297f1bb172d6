"""Model forge: build small Hugging Face-format models locally, with no hub access.

A model made here is a normal folder (``tokenizer.json``, ``config.json``,
``model.safetensors``, a chat template) that transformers, vLLM and the example
server load like any downloaded checkpoint. Small presets are *trained* briefly on
the Python standard library's source so their next-token distributions are peaked:
random weights give nearly flat distributions whose greedy tokens flip on rounding
noise, which would make every accuracy comparison meaningless.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

# Bump when anything that changes the produced weights changes (corpus, recipe,
# presets): the cache key includes it so stale cached models are never reused.
FORGE_VERSION = "1"

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"

# A deliberately plain template: role tags on their own lines. Any OpenAI-style
# server can render it, and it tokenises the same everywhere.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

MODEL_INFO_FILE = "infergoal_model.json"


@dataclass(frozen=True)
class Preset:
    """Shape and training recipe of one model size."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    train_steps: int = 0  # 0 = random weights (too big to train on a CPU)
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    # Non-empty: build (and train) on the CUDA GPU in this dtype; a 7B model cannot train on a CPU.
    gpu_dtype: str = ""


PRESETS: dict[str, Preset] = {
    "tiny": Preset(2048, 128, 4, 4, 2, 384, 1024, train_steps=300),
    "small": Preset(4096, 256, 6, 8, 4, 768, 2048, train_steps=200, lr=2e-3),
    # A third CPU model of another shape (full multi-head attention, deeper and narrower than
    # `small`): the second source model of the knowledge-base reuse benchmark (benchmarks/kb_replay.py).
    "mid": Preset(3072, 192, 8, 6, 6, 512, 1024, train_steps=200, lr=2e-3),
    # A fourth, wide and shallow (3 layers of width 320, 10 query heads on 2 KV heads): the reuse
    # benchmark's held-out target, measured after the swap mechanism was designed on the other three.
    "wide": Preset(4096, 320, 3, 10, 2, 1024, 2048, train_steps=200, lr=2e-3),
    # Mistral-7B-shaped: for GPU hosts, random weights (the shape is what matters there).
    "7b-shape": Preset(32000, 4096, 32, 32, 8, 14336, 32768, rope_theta=1_000_000.0, train_steps=0),
    # The same shape trained briefly on the GPU (bf16 AdamW) so its logprobs are peaked and the
    # accuracy gate means something on it (benchmarks/gpu/ uses it; about two minutes on an H200).
    # 60 steps gave a unigram model (loss 7.05, same greedy output for every prompt): too flat.
    "7b-peaked": Preset(32000, 4096, 32, 32, 8, 14336, 32768, rope_theta=1_000_000.0, train_steps=250,
                        batch_size=16, seq_len=256, lr=1.5e-3, gpu_dtype="bfloat16"),
    # A smaller GPU shape (~1.6 B parameters: width 2048, MLP 5632, 16 query heads) for the warm
    # time-to-best run (the GPU tool's ttb-small-2b experiment): its run writes the knowledge base the 7B starts
    # from. Same layers x KV heads x head dim as 7b-peaked, so a batch size found on it transfers to
    # the 7B unscaled (knowledge.reuse.translate scales batch knobs by KV bytes per token); serves
    # hfserve_gpu's 4096-token prompts (32 k positions). Forged on the GPU in well under a minute.
    "2b-peaked": Preset(32000, 2048, 32, 16, 8, 5632, 32768, rope_theta=1_000_000.0, train_steps=250,
                        batch_size=16, seq_len=256, lr=1.5e-3, gpu_dtype="bfloat16"),
    # Llama-3.2-3B-shaped (28 layers of width 3072, 24 query heads on 8 KV heads, MLP 8192), forged like
    # 7b-peaked: a GPU shape the engine's kernels and the search were never tuned on (the GPU tool's
    # ttb-cold-3b experiment).
    "3b-peaked": Preset(32000, 3072, 28, 24, 8, 8192, 32768, rope_theta=500_000.0, train_steps=250,
                        batch_size=16, seq_len=256, lr=1.5e-3, gpu_dtype="bfloat16"),
}


def stdlib_files() -> list[Path]:
    """Top-level ``.py`` files of the running interpreter's standard library, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if p.is_file())


def corpus_split(holdout_every: int = 10) -> tuple[list[str], list[str]]:
    """Return (train_texts, heldout_texts) from the standard library source.

    Every ``holdout_every``-th file (in sorted order) is held out so tests and gates
    can measure the model on text it never trained on.
    """
    train: list[str] = []
    held: list[str] = []
    for i, path in enumerate(stdlib_files()):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        (held if i % holdout_every == holdout_every - 1 else train).append(text)
    return train, held


def _train_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE tokenizer (exact round-trip of any text) and wrap it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Prepend BOS like Llama tokenizers do, so servers that add special tokens and
    # the reference tokenizer agree on the first position.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1 << 30
    return fast


def _llama_config(p: Preset, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        # Big random shapes keep the nominal vocabulary so memory footprints are realistic
        # (embedding rows past the tokenizer's are simply never produced).
        vocab_size=max(p.vocab_size, len(tokenizer)),
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads,
        max_position_embeddings=p.max_position_embeddings,
        rope_theta=p.rope_theta,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


# A GPU with less memory than this trains the GPU presets with activation checkpointing and the fused AdamW: a 7B's
# bf16 weights, gradients and two AdamW moments are 58 GB, its activations at 16 x 256 tokens another ~35 GB and the
# multi-tensor AdamW's temporaries ~15 GB -- over an 80 GB H100 (out of memory in its first step), under a 141 GB H200.
LOW_MEMORY_BYTES = 100 * 2**30


def _train(model, ids, p: Preset, steps: int, seed: int, low_memory: bool = False) -> float:
    """Train ``model`` on random windows of the token stream ``ids``; return the final loss.

    Returns the mean loss over the last 10% of steps (a single step's loss is noisy). ``low_memory`` recomputes each
    layer's activations in the backward pass (the same arithmetic, a third more time) and, on CUDA, steps AdamW with
    its fused kernel (no whole-model temporaries).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    fused = low_memory and next(model.parameters()).is_cuda
    opt = torch.optim.AdamW(model.parameters(), lr=p.lr, betas=(0.9, 0.95), weight_decay=0.01,
                            **({"fused": True} if fused else {}))
    # transformers >= 5 names it activation checkpointing (the old names warn); older ones only have the old names.
    new_api = hasattr(model, "activation_checkpointing_enable")
    off = model.activation_checkpointing_disable if new_api else model.gradient_checkpointing_disable
    if low_memory and new_api:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif low_memory:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    warmup = max(1, steps // 15)

    def lr_at(step: int) -> float:
        # Linear warmup then cosine decay to 10%: the usual short-run recipe.
        if step < warmup:
            return p.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return p.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    tail: list[float] = []
    n = ids.numel() - p.seq_len - 1
    offsets = torch.arange(p.seq_len + 1)
    device = next(model.parameters()).device
    for step in range(steps):
        starts = torch.randint(0, n, (p.batch_size,), generator=gen)
        batch = ids[starts[:, None] + offsets[None, :]].to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= steps - max(1, steps // 10):
            tail.append(loss.item())
    if low_memory:
        off()
    model.eval()
    return sum(tail) / len(tail) if tail else float("nan")


def _top1_mass(model, tokenizer, p: Preset) -> float:
    """Mean top-1 next-token probability on held-out text (1/vocab for a flat model)."""
    import torch

    _, held = corpus_split()
    ids = tokenizer("\n".join(held)[:20000], add_special_tokens=False)["input_ids"][: 2 * p.seq_len]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=next(model.parameters()).device)).logits
    return float(torch.softmax(logits.float(), dim=-1).amax(-1).mean())


def make_model(out_dir: str | os.PathLike[str], *, preset: str = "tiny", seed: int = 0,
               train_steps: int | None = None) -> Path:
    """Write a Hugging Face-format causal LM folder to ``out_dir`` and return its path.

    The tokenizer is a byte-level BPE trained on the standard library source; the model
    is a ``LlamaForCausalLM`` of the preset's shape, trained for ``train_steps`` steps
    (default: the preset's own) on the same text. Deterministic given ``seed``.
    """
    import torch
    from transformers import LlamaForCausalLM

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    p = PRESETS[preset]
    steps = p.train_steps if train_steps is None else int(train_steps)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    train_texts, _ = corpus_split()
    tokenizer = _train_tokenizer(train_texts, p.vocab_size)
    torch.manual_seed(seed)
    cfg = _llama_config(p, tokenizer)
    if steps > 0 and not p.gpu_dtype:
        model = LlamaForCausalLM(cfg)
    elif p.gpu_dtype:
        if not torch.cuda.is_available():
            raise RuntimeError(f"preset {preset!r} is built on a CUDA GPU and none is visible here")
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg).to(getattr(torch, p.gpu_dtype))
    else:
        # Untrained shapes (e.g. 7b-shape) are built directly in float16, on a GPU when one
        # is present: a float32 7B model would need 28 GB of host memory just to be born.
        device = "cuda" if torch.cuda.is_available() else "cpu"
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float16)
        try:
            with torch.device(device):
                model = LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(previous)

    final_loss = float("nan")
    peak = None
    if steps > 0:
        # Encode without BOS: the stream is cut into windows anyway.
        ids = torch.tensor(
            [t for text in train_texts for t in tokenizer(text, add_special_tokens=False)["input_ids"]],
            dtype=torch.long,
        )
        low = bool(p.gpu_dtype) and torch.cuda.get_device_properties(0).total_memory < LOW_MEMORY_BYTES
        final_loss = _train(model, ids, p, steps, seed, low_memory=low)
        peak = _top1_mass(model, tokenizer, p)

    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    info = {
        "preset": preset,
        "seed": seed,
        "train_steps": steps,
        "final_loss": final_loss if steps > 0 else None,  # None: untrained (NaN is not valid JSON)
        "ln_vocab": math.log(cfg.vocab_size),
        "heldout_top1_prob": peak,  # mean top-1 probability on held-out text: how peaked the model is
        "forge_version": FORGE_VERSION,
        "build_seconds": round(time.monotonic() - t0, 2),
        "preset_config": asdict(p),
    }
    (out / MODEL_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return out


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Directory holding cached models: ``cache_dir``, ``$INFERGOAL_CACHE/models`` or ``~/.cache/infergoal/models``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("INFERGOAL_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "infergoal"
    return base / "models"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (blocks until free)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def cached_model(preset: str = "tiny", seed: int = 0, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the cached model for (preset, seed, forge version), building it once.

    The build goes to a temporary sibling folder renamed into place only when complete,
    so a killed build never leaves a half model; a file lock keeps two concurrent
    callers from both building.
    """
    root = cache_root(cache_dir)
    final = root / f"{preset}-seed{seed}-v{FORGE_VERSION}"
    if (final / MODEL_INFO_FILE).exists():
        return final
    with _locked(root / f".{final.name}.lock"):
        if (final / MODEL_INFO_FILE).exists():  # another process built it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            make_model(tmp, preset=preset, seed=seed)
            if final.exists():  # leftover without the info file: incomplete, replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def default_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the cached ``tiny`` model (seed 0), building it on first use."""
    return cached_model("tiny", 0, cache_dir)
