"""hfserve's model loading: safetensors straight onto the device, from_pretrained as the fallback.

``from_pretrained`` spends most of a 7B deploy (15-19 s on the H200) in its own bookkeeping; a
fresh process gets the same 14.5 GB of bf16 safetensors onto the GPU in 2.3-3.4 s with
``safetensors.torch.load_file(..., device="cuda")``. So :func:`load_model` builds the model from
its config with initialisation switched off (no random weights drawn only to be overwritten),
reads the checkpoint with ``load_file`` onto the device, assigns the tensors into the modules and
ties the embeddings as transformers does. Same tensors, so the same outputs (tests/examples/
test_hfserve.py compares the logits with ``from_pretrained``'s).

Where the fast path does not apply it says why and uses ``from_pretrained``: no safetensors
file, a checkpoint whose names or shapes do not match the model's, modules transformers keeps in
float32, or a quantisation config.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch

__all__ = ["Phases", "checkpoint_files", "init_device", "load_model"]


class Phases:
    """The engine's start-up, split into named consecutive spans (issue 23: the H200's engine part was
    9.7-15.6 s while the weights took 3-4.5 s). Each :meth:`mark` closes the span that began at the
    previous mark (or at ``start``), so the spans add up to the time from ``start`` to the last mark."""

    def __init__(self, start: float | None = None) -> None:
        self.spans: list[tuple[str, float]] = []
        self.end: float = time.perf_counter() if start is None else start
        """When the last span closed (``time.perf_counter`` seconds)."""

    def mark(self, name: str) -> None:
        """End the current span and call it ``name`` (a repeated name adds to the first one)."""
        now = time.perf_counter()
        for i, (n, s) in enumerate(self.spans):
            if n == name:
                self.spans[i] = (n, s + now - self.end)
                break
        else:
            self.spans.append((name, now - self.end))
        self.end = now

    def line(self) -> str:
        """``hfserve: engine tokenizer 0.31s cuda 0.80s load 3.52s ... total 6.10s``."""
        parts = " ".join(f"{n} {s:.2f}s" for n, s in self.spans)
        return f"hfserve: engine {parts} total {sum(s for _, s in self.spans):.2f}s"


def init_device(device: str) -> None:
    """Create the CUDA context now (one allocation, synchronised), so its cost is timed on its own
    instead of inside the first weight copy; nothing to do on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=device)
        torch.cuda.synchronize()


def checkpoint_files(model_dir: str) -> list[str] | None:
    """The safetensors files of ``model_dir`` (one file, or the shards its index names); None if neither."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    index = single + ".index.json"
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_dir, s) for s in shards]
    return None


def load_model(model_dir: str, *, dtype: torch.dtype, device: str = "cpu", attn: str | None = None,
               how: str = "fast") -> tuple[Any, str]:
    """The model of ``model_dir`` on ``device`` in ``dtype``, in eval mode, and how it was loaded.

    ``how``: "fast" (safetensors onto the device, falling back to from_pretrained where that does
    not apply) or "hf" (from_pretrained always). The second value says which path ran (and why
    the fallback, if it was one); the server prints it with the load time.
    """
    t0 = time.perf_counter()
    model, path = None, "from_pretrained"
    if how == "fast":
        try:
            model = _load_fast(model_dir, dtype=dtype, device=device, attn=attn)
            path = "safetensors"
        except _NotFast as e:
            path = f"from_pretrained (fast load does not apply: {e})"
    if model is None:
        model = _from_pretrained(model_dir, dtype=dtype, device=device, attn=attn)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    print(f"hfserve: loaded {model_dir} in {secs:.2f}s via {path}", file=sys.stderr, flush=True)
    return model.eval(), path


class _NotFast(Exception):
    """The fast path does not apply to this checkpoint; the message says why."""


def _from_pretrained(model_dir: str, *, dtype: torch.dtype, device: str, attn: str | None) -> Any:
    from transformers import AutoModelForCausalLM

    kw: dict[str, Any] = {"dtype": dtype}
    if attn:
        kw["attn_implementation"] = attn
    if torch.device(device).type != "cpu":
        kw["device_map"] = device  # load straight onto the GPU, no host copy
    return AutoModelForCausalLM.from_pretrained(model_dir, **kw)


def _load_fast(model_dir: str, *, dtype: torch.dtype, device: str, attn: str | None) -> Any:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers before 5.x kept it in modeling_utils
        from transformers.modeling_utils import no_init_weights

    files = checkpoint_files(model_dir)
    if files is None:
        raise _NotFast("no model.safetensors or model.safetensors.index.json")
    cfg = AutoConfig.from_pretrained(model_dir)
    if getattr(cfg, "quantization_config", None):
        raise _NotFast("a quantisation config")
    kw: dict[str, Any] = {"dtype": dtype}
    if attn:
        kw["attn_implementation"] = attn
    # Built on the CPU with every init function switched off: the parameters are allocated but never
    # touched (load_state_dict below replaces them with the device's tensors), while buffers computed
    # in __init__ (RoPE's inv_freq) are computed on the CPU, as from_pretrained computes them, and
    # moved to the device at the end: bit for bit the same model.
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(cfg, **kw)
    if getattr(model, "_keep_in_fp32_modules", None) or getattr(model, "_keep_in_fp32_modules_strict", None):
        raise _NotFast("the model keeps some modules in float32")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f, device=str(device)))
    own = model.state_dict()
    unexpected = sorted(set(state) - set(own))
    if unexpected:
        raise _NotFast(f"checkpoint names the model does not have: {unexpected[:3]}")
    for k, t in state.items():
        if t.shape != own[k].shape:
            raise _NotFast(f"{k} has shape {tuple(t.shape)} in the checkpoint, {tuple(own[k].shape)} in the model")
        if t.dtype != dtype and t.is_floating_point():
            state[k] = t.to(dtype)  # what from_pretrained(dtype=...) does with a checkpoint of another dtype
    del own
    missing = model.load_state_dict(state, strict=False, assign=True).missing_keys
    # Tied weights (lm_head = embed_tokens) are not in the checkpoint; tie them as transformers does,
    # then every missing name must share its storage with a loaded tensor.
    model.tie_weights()
    loaded = {t.data_ptr() for t in state.values()}
    now = model.state_dict(keep_vars=True)
    untied = [k for k in missing if now[k].data_ptr() not in loaded]
    if untied:
        raise _NotFast(f"weights missing from the checkpoint: {untied[:3]}")
    model.to(device)  # the buffers; the parameters are there already
    if os.path.isfile(os.path.join(model_dir, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    return model
