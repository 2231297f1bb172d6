"""hfserve's fast engine: a preallocated KV pool, continuous batching and CUDA-graph decode.

This is what a GPU engineer writes when ``generate()`` is too slow: the Llama forward pass in
plain torch over the checkpoint's own weights (QKV and gate/up fused into single matrices),

* a **KV pool** allocated once: ``[layers, slots, kv_heads, capacity, head_dim]``. Decoding
  sequences occupy slots ``0..n-1`` contiguously, so one decode step reads ``K[:, :n, :, :L]`` as a
  view (no gather); a finished sequence's slot is refilled by moving the last one into it;
* **continuous batching**: requests join between decode steps and leave as soon as they finish;
* **chunked prefill** (``--prefill-chunk N``): a long prompt is prefilled N tokens per step between
  decode steps, so running sequences keep streaming (chunk 0 = whole prompts, prefill first);
* **packed prefill** (``--prefill-pack N``): queued whole prompts, up to N tokens together, run as one
  forward pass straight into their decode slots (every GEMM once over all their rows, attention per
  sequence), so a burst of 64 is a few prefill passes instead of 64;
* **CUDA graphs** for the decode step (``--cuda-graphs on``), one per (batch bucket, context
  bucket), captured at start-up, so a decode step is one graph launch instead of ~500 kernels;
* a choice of SDPA backend for prefill (``--sdpa flash|efficient|math``); decode attention is a
  grouped (GQA) batched matmul that reads each cached key once;
* a choice of kernels (``--kernels torch|triton``): ``torch`` is the plain code below; ``triton``
  runs the decode step's norms (each residual add fused with the norm after it), RoPE + KV store,
  attention (split-KV flash-decoding) and SwiGLU as hfkernels.py's fused Triton kernels, and prefill's
  norms and SwiGLU likewise. ``--prefill-attn fused`` does prefill's RoPE + KV store as one Triton
  launch over all packed rows and lets SDPA read the pool's K/V in place (GQA) instead of a copy. Worth it only under CUDA graphs:
  launched eagerly, each Triton call costs more host time than it saves on the GPU.
  ``--kernels triton-gemv`` is ``triton`` plus, at decode batch <= 16, the QKV and gate/up
  projections as Triton GEMVs with the residual add + RMSNorm in their prologue and RoPE + KV store
  or SwiGLU in their epilogue: 6 launches per layer instead of 10 (:meth:`FastModel._decode_gemv`).
  ``--kernels triton-mv`` is ``triton`` with, at decode batch 1, the QKV, O, gate/up, down and lm_head
  projections as a plain Triton GEMV tuned per shape (kernels.mv_linear; faster than cuBLAS at M=1).
  ``--kernels triton-mm`` is ``triton-mv`` with, at decode batch 2..64, the projections as a skinny Triton
  GEMM where kernels.MM_CONFIGS lists the shape (kernels.mm_linear; else cuBLAS); with ``--mm-glu on`` the
  gate/up GEMM and SwiGLU there are one launch where kernels.MM_GLU_CONFIGS lists the shape (kernels.mm_glu_linear);
  with ``--mm-norm on`` each RMSNorm there is folded into the GEMM after it and each residual add into the GEMM
  before it (kernels.mm_norm_linear, kernels.mm_res_linear: FastModel._decode_mm_norm).
  ``--pdl on`` (any Triton kernels, Hopper) launches the decode step's Triton kernels with programmatic dependent
  launch: each placed while the one before it finishes, waiting on it first (kernels.set_pdl).

Prompt scoring (``echo`` + ``logprobs``, what the accuracy gate asks for) runs through this same
prefill path, chunking included, so the gate measures the code that serves.
It runs on a CPU too (no graphs), which is how its logic is tested without a GPU.

The job types, sampling, finish check and prompt scoring are engine.py's, so both engines agree on them.
"""

from __future__ import annotations

import gc
import os
import queue
import sys
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from . import hfkernels as kernels_mod
from .engine import (
    as_list,
    drain_jobs,
    event_token,
    finish_check,
    logprob_table,
    prompt_logprobs,
    request_generator,
    sample_row,
    table_event,
    token_event,
    wake,
)
from .loading import Phases, init_device, load_model

_SDPA = {"auto": None, "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


KV_CACHE_DTYPES = {"auto": None, "fp8": torch.float8_e4m3fn}
"""--kv-cache-dtype's choices: the pool in the model's dtype, or in float8 e4m3 with scale 1 (vLLM's default
for ``--kv-cache-dtype fp8`` without calibrated scales): values rounded to nearest, saturating at +-448."""

PREFILL_ATTN = ("torch", "fused", "fused-batched")
"""--prefill-attn's choices (FastModel.set_prefill_attn)."""

PROFILE_SKIP, PROFILE_STEPS = 20, 10
"""HFSERVE_PROFILE: the large decode steps skipped first, and how many are profiled."""
PROFILE_PREFILL_TOKENS = 8192
"""HFSERVE_PROFILE: the first packed prefill pass of at least this many tokens is profiled too (FILE.prefill)."""

SWITCH_INTERVAL_S = 0.0005
"""--overlap-schedule's GIL switch interval (``sys.setswitchinterval``): how long the engine thread can
wait for the GIL held by the event loop's streaming once a step's ids are in."""


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


class FastModel:
    """Llama-family forward passes over a static KV pool (weights taken from a HF model)."""

    decode_attn = "default"  # set_decode_attn
    mm_glu = False  # set_mm_glu
    mm_norm = False  # set_mm_norm

    def __init__(self, hf_model: Any, *, slots: int, capacity: int, sdpa: str = "auto",
                 kernels: str = "torch", prefill_attn: str = "torch", decode_attn: str = "default",
                 kv_cache_dtype: str = "auto") -> None:
        cfg = hf_model.config
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown KV cache dtype {kv_cache_dtype!r}; choose from {list(KV_CACHE_DTYPES)}")
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            raise ValueError("the fast engine supports Llama/Mistral-style models without biases")
        if getattr(cfg, "rope_scaling", None) and (cfg.rope_scaling or {}).get("rope_type", "default") != "default":
            raise ValueError("the fast engine supports the default RoPE only")
        self.cfg = cfg
        w = next(hf_model.parameters())
        self.device, self.dtype = w.device, w.dtype
        self.nh, self.nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.nh
        self.eps = float(cfg.rms_norm_eps)
        self.scale = self.hd ** -0.5
        m = hf_model.model
        self.embed = m.embed_tokens.weight
        self.layers: list[dict[str, torch.Tensor]] = []
        for layer in m.layers:
            a, p = layer.self_attn, layer.mlp
            self.layers.append({
                "ln1": layer.input_layernorm.weight, "ln2": layer.post_attention_layernorm.weight,
                # Fused projections: one GEMM instead of three (two), same arithmetic per output.
                "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),
                "o": a.o_proj.weight, "gu": torch.cat([p.gate_proj.weight, p.up_proj.weight]).contiguous(),
                "down": p.down_proj.weight,
            })
            # Free the unfused copies as we go, so peak memory stays ~one model.
            a.q_proj = a.k_proj = a.v_proj = p.gate_proj = p.up_proj = None
        self.norm = m.norm.weight
        self.lm_head = hf_model.lm_head.weight
        self.inter = cfg.intermediate_size
        self.slots = slots
        self.capacity = _round_up(capacity + 1, 256)  # +1: the scratch position padded rows write to
        self.scratch_pos = self.capacity - 1
        shape = (len(self.layers), slots, self.nkv, self.capacity, self.hd)
        # --kv-cache-dtype fp8: the pool in float8 e4m3 (half the bytes every decode step's attention reads);
        # written by the Triton RoPE + store kernels, widened to the model's dtype wherever it is read.
        kv_dtype = KV_CACHE_DTYPES[kv_cache_dtype] or self.dtype
        self.K = torch.zeros(shape, dtype=kv_dtype, device=self.device)
        self.V = torch.zeros(shape, dtype=kv_dtype, device=self.device)
        theta = float(getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {}).get(
            "rope_theta", 10000.0))
        # HF's default RoPE: float32 angles, cos/sin cast to the activation dtype.
        inv = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.int64, device=self.device).float() / self.hd))
        ang = torch.arange(self.capacity, device=self.device).float()[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        self.sdpa = sdpa
        if sdpa not in _SDPA:
            raise ValueError(f"unknown SDPA backend {sdpa!r}; choose from {sorted(_SDPA)}")
        self.set_kernels(kernels)
        self.set_prefill_attn(prefill_attn)
        self.set_decode_attn(decode_attn)

    def set_prefill_attn(self, how: str) -> None:
        """Prefill's RoPE + attention: ``"torch"`` (rotate-half in torch, K/V stored by index_put, the
        cache repeated per query head for SDPA) or ``"fused"`` (kernels.rope_store rotates q and k of
        every packed row and stores k and v in one Triton launch; SDPA reads the pool's K/V in place
        with ``enable_gqa``, no repeated copy) or ``"fused-batched"`` (``fused``, and a run of whole prompts of
        one length in consecutive slots, a burst's, attends in one SDPA call over the run instead of one
        call per prompt: :meth:`_plan`)."""
        if how not in PREFILL_ATTN:
            raise ValueError(f"unknown prefill attention {how!r}; choose from {sorted(PREFILL_ATTN)}")
        if how != "torch":
            kernels_mod.get_ops("triton")  # needs triton
        if how != "torch" and self.sdpa == "efficient" and self.nkv != self.nh:  # torch's efficient SDPA has no enable_gqa
            raise ValueError(f"--sdpa efficient is not supported with --prefill-attn {how} on a grouped-query model "
                             f"({self.nh} heads, {self.nkv} KV heads): use --sdpa auto, flash or math, or --prefill-attn torch")
        self.prefill_attn = how

    def set_decode_attn(self, how: str) -> None:
        """The Triton decode attention's launch: ``"default"`` (kernels.ATTN_CONFIGS, else today's: K/V
        widened to tf32 dots) or ``"lowp"`` (bf16 MMA dots at every bucket, the launch tuned on the H200
        where kernels.ATTN_LOWP lists the bucket). Needs the Triton kernels (``--kernels`` other than torch)."""
        if how not in kernels_mod.DECODE_ATTN:
            raise ValueError(f"unknown decode attention {how!r}; choose from {list(kernels_mod.DECODE_ATTN)}")
        if how != "default" and self.kernels == "torch":
            raise ValueError(f"--decode-attn {how} needs the Triton kernels: add --kernels triton (or triton-mv/-mm)")
        self.decode_attn = how

    def set_mm_glu(self, on: bool) -> None:
        """``--mm-glu on`` (with ``--kernels triton-mm``): the decode step's gate/up GEMM and SwiGLU in one skinny-GEMM
        launch at batch 2..64 where kernels.MM_GLU_CONFIGS lists the shape (:func:`kernels.mm_glu_linear`)."""
        if on and self.kernels != "triton-mm":
            raise ValueError(f"--mm-glu on needs --kernels triton-mm, not {self.kernels}")
        self.mm_glu = bool(on)

    def set_mm_norm(self, on: bool) -> None:
        """``--mm-norm on`` (with ``--kernels triton-mm``): at decode batch 2..64 each RMSNorm in the prologue of the
        skinny GEMM after it (QKV, gate/up, lm_head: kernels.mm_norm_linear) and each residual add in the epilogue of
        the GEMM before it (O, down: kernels.mm_res_linear), where the launch tables list the shape: no norm launch."""
        if on and self.kernels != "triton-mm":
            raise ValueError(f"--mm-norm on needs --kernels triton-mm, not {self.kernels}")
        self.mm_norm = bool(on)

    def _attn_kw(self, B: int, ctx: int) -> dict[str, Any]:
        """decode_attn's launch for this (batch, context) bucket under --decode-attn (host ints: one plan per graph)."""
        if self.decode_attn == "default":
            return {}
        return {"cfg": kernels_mod.decode_attn_config(self.decode_attn, B, ctx, self.kv_fp8)}

    @property
    def kv_fp8(self) -> bool:
        """Whether the KV pool is float8 (--kv-cache-dtype fp8)."""
        return self.K.dtype != self.dtype

    def set_kernels(self, kernels: str) -> None:
        """``"torch"`` (the plain code), ``"triton"`` (hfkernels.py), ``"triton-gemv"`` (the same, and at
        decode batch <= 16 the QKV and gate/up GEMVs fused with norm, RoPE + store, SwiGLU:
        :meth:`_decode_gemv`) or ``"triton-mv"`` (``triton``, and at decode batch 1 the five projections
        as plain Triton GEMVs: kernels.mv_linear in :meth:`_decode_fused`); graphs keep what they captured. On a
        GPU the Triton kernels launch as its tuned tables say (``kernels.load_tables``)."""
        self.ops = kernels_mod.get_ops(kernels)
        self.kernels = kernels
        if kernels != "torch" and self.device.type == "cuda":
            # The launch tables tuned for this GPU (tables/<its name>.json), else the defaults: cuBLAS, today's launches.
            kernels_mod.load_tables(torch.cuda.get_device_name(self.device))

    # -- pieces ------------------------------------------------------------------------

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype)

    @staticmethod
    def _rot(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

    def _mlp(self, x: torch.Tensor, L: dict[str, torch.Tensor]) -> torch.Tensor:
        gu = x @ L["gu"].t()
        return (F.silu(gu[..., : self.inter]) * gu[..., self.inter:]) @ L["down"].t()

    def _split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_end = self.nh * self.hd
        k_end = q_end + self.nkv * self.hd
        return qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:]

    def _sdpa_ctx(self, batched: bool = False) -> Any:
        names = sdpa_backends(self.sdpa, batched, self.device.type)
        if names is None:
            return nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, n) for n in names])

    # -- prefill -----------------------------------------------------------------------

    def prefill(self, ids: torch.Tensor, slot: int, start: int, all_logits: bool = False) -> torch.Tensor:
        """Run ``ids`` (1-D) at positions ``start..`` of ``slot``, writing its KV; return float logits.

        Attention covers the slot's cache ``[0, start)`` plus the chunk causally (a lower-right
        aligned causal mask, which flash and memory-efficient SDPA both support).
        """
        return self.prefill_packed([(ids, slot, start)], all_logits)

    def prefill_packed(self, parts: list[tuple[torch.Tensor, int, int]], all_logits: bool = False) -> torch.Tensor:
        """:meth:`prefill` of several sequences in one forward pass: ``parts`` = (ids, slot, start) each.

        Their rows are stacked, so every GEMM (QKV, O, gate/up, down) runs once over all of them;
        attention runs per sequence over its own slot. Returns the logits of every row
        (``all_logits``) or of each part's last row, in ``parts`` order ([len(parts), V]).
        """
        lens = [int(ids.shape[0]) for ids, _, _ in parts]
        for (_, _, start), c in zip(parts, lens, strict=True):
            if start + c > self.scratch_pos:
                raise ValueError(f"sequence of {start + c} tokens exceeds the KV pool capacity {self.scratch_pos}")
        ids = parts[0][0] if len(parts) == 1 else torch.cat([p[0] for p in parts])
        plan = self._plan(parts, lens)
        last = plan.last
        if self.kernels != "torch":
            return self._prefill_fused(ids, plan, all_logits)
        x = self.embed[ids]
        for li, L in enumerate(self.layers):
            x = x + self._attend_prefill(self._rms(x, L["ln1"]), L, li, plan)
            x = x + self._mlp(self._rms(x, L["ln2"]), L)
        x = self._rms(x if all_logits else x[last], self.norm)
        return (x @ self.lm_head.t()).float()

    def _plan(self, parts: list[tuple[torch.Tensor, int, int]], lens: list[int]) -> types.SimpleNamespace:
        """Rows of each packed part, its slot, start and causal mask; per-row positions and slots
        (what the fused RoPE kernel reads) only when prefill attention is fused."""
        from torch.nn.attention.bias import causal_lower_right

        rows, r0 = [], 0
        for (_, slot, start), c in zip(parts, lens, strict=True):
            rows.append((r0, r0 + c, slot, start, causal_lower_right(c, start + c)))
            r0 += c
        dev = self.device
        last = torch.tensor([r1 - 1 for _, r1, _, _, _ in rows], device=dev) if len(rows) > 1 else slice(r0 - 1, r0)
        pos = slots = None
        if self.prefill_attn != "torch":
            pos = torch.cat([torch.arange(st, st + (b - a), device=dev) for a, b, _, st, _ in rows])
            slots = torch.cat([torch.full((b - a,), sl, device=dev) for a, b, sl, _, _ in rows])
        groups = _attn_groups(rows) if self.prefill_attn == "fused-batched" else [
            (r0, r1, slot, 1, start, mask) for r0, r1, slot, start, mask in rows]
        return types.SimpleNamespace(rows=rows, last=last, pos=pos, slots=slots, groups=groups)

    def _attend_prefill(self, h: torch.Tensor, L: dict[str, torch.Tensor], li: int,
                        plan: types.SimpleNamespace) -> torch.Tensor:
        """One layer's attention over packed prefill rows (normed input ``h``), as :meth:`prefill_packed` does it."""
        qkv = h @ L["qkv"].t()
        fused = self.prefill_attn != "torch"
        if fused:
            # One launch for every row of every part: rotate q and k, store k and v at (slot, pos).
            qr = kernels_mod.rope_store(qkv, self.cos, self.sin, plan.pos, self.K, self.V, li, slots=plan.slots)
        outs = []
        for r0, r1, slot, n, start, mask in plan.groups:
            c = (r1 - r0) // n
            end = start + c
            if fused:
                q = qr[r0:r1].view(n, c, self.nh, self.hd).transpose(1, 2)
                kc, vc = self.K[li, slot:slot + n, :, :end], self.V[li, slot:slot + n, :, :end]
                if self.kv_fp8:  # SDPA takes no fp8: the parts' cache widened (a copy; in place otherwise)
                    kc, vc = kc.to(self.dtype), vc.to(self.dtype)
                with self._sdpa_ctx(batched=n > 1):
                    o = (F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=self.scale, enable_gqa=True)
                         if n == 1 else  # n > 1: whole prompts (start 0), where causal is the mask
                         F.scaled_dot_product_attention(q, kc, vc, is_causal=True, scale=self.scale, enable_gqa=True))
            else:
                o = self._attend_torch(qkv[r0:r1], li, slot, start, mask)
            outs.append(o.transpose(1, 2).reshape(r1 - r0, self.nh * self.hd))
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        return o @ L["o"].t()

    def _attend_torch(self, qkv: torch.Tensor, li: int, slot: int, start: int, mask: Any) -> torch.Tensor:
        """RoPE, KV store and SDPA of one part's rows in plain torch; returns [1, nh, c, hd]."""
        c = qkv.shape[0]
        end = start + c
        g = self.nh // self.nkv
        cos, sin = self.cos[start:end][None, :, None, :], self.sin[start:end][None, :, None, :]
        q, k, v = self._split(qkv)
        q = q.view(1, c, self.nh, self.hd)
        k = k.view(1, c, self.nkv, self.hd)
        q = (q * cos + self._rot(q) * sin).transpose(1, 2)
        k = (k * cos + self._rot(k) * sin).transpose(1, 2)
        self.K[li, slot, :, start:end] = k[0]
        self.V[li, slot, :, start:end] = v.view(c, self.nkv, self.hd).transpose(0, 1)
        kc = self.K[li, slot:slot + 1, :, :end].to(self.dtype).repeat_interleave(g, dim=1)
        vc = self.V[li, slot:slot + 1, :, :end].to(self.dtype).repeat_interleave(g, dim=1)
        with self._sdpa_ctx():
            return F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=self.scale)

    def _prefill_fused(self, ids: torch.Tensor, plan: types.SimpleNamespace, all_logits: bool) -> torch.Tensor:
        """:meth:`prefill_packed` with the fused ops: each residual add fused with the norm that follows
        it (the next layer's ln1, or the final norm), SwiGLU in one kernel; RoPE and attention as
        ``prefill_attn`` says."""
        ops, n, last = self.ops, len(self.layers), plan.last
        x = self.embed[ids]
        h = ops.rmsnorm(x, self.layers[0]["ln1"], self.eps)
        for li, L in enumerate(self.layers):
            x, h = ops.add_rmsnorm(x, self._attend_prefill(h, L, li, plan), L["ln2"], self.eps)
            d = ops.silu_mul(h @ L["gu"].t(), self.inter) @ L["down"].t()
            if li + 1 < n:
                x, h = ops.add_rmsnorm(x, d, self.layers[li + 1]["ln1"], self.eps)
            elif all_logits:
                x, h = ops.add_rmsnorm(x, d, self.norm, self.eps)
            else:  # only each part's last row's logits: their norm alone
                x, h = ops.add_rmsnorm(x[last], d[last], self.norm, self.eps)
        return (h @ self.lm_head.t()).float()

    # -- decode ------------------------------------------------------------------------

    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One token for each of slots ``0..B-1`` (B = len(tokens)); attends to cache ``[0, ctx)``.

        Static shapes only (B and ctx fixed per call site), no host syncs: safe to capture in a
        CUDA graph. Returns (float logits [B, V], greedy ids [B]).
        """
        if self.kernels == "triton-gemv" and tokens.shape[0] <= kernels_mod.GEMV_MAX_ROWS:
            return self._decode_gemv(tokens, pos, ctx)
        if self.kernels != "torch":  # --pdl on: not at batch 1 (the GEMVs' step: slower with it; kernels.pdl_paused)
            with kernels_mod.pdl_paused(tokens.shape[0] <= kernels_mod.MV_MAX_ROWS):
                return self._decode_fused(tokens, pos, ctx)
        if self.kv_fp8:
            raise ValueError("--kv-cache-dtype fp8 needs the Triton kernels (--kernels triton*): they store and read it")
        B = tokens.shape[0]
        g = self.nh // self.nkv
        rows = torch.arange(B, device=tokens.device)
        x = self.embed[tokens]
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        keep = torch.arange(ctx, device=tokens.device)[None, :] <= pos[:, None]  # [B, ctx]
        bias = torch.zeros(B, ctx, device=tokens.device, dtype=torch.float32).masked_fill(~keep, float("-inf"))
        bias = bias[:, None, None, :]
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["ln1"])
            q, k, v = self._split(h @ L["qkv"].t())
            q = q.view(B, self.nh, self.hd)
            k = k.view(B, self.nkv, self.hd)
            q = q * cos + self._rot(q) * sin
            k = k * cos + self._rot(k) * sin
            self.K[li, rows, :, pos] = k
            self.V[li, rows, :, pos] = v.view(B, self.nkv, self.hd)
            kc, vc = self.K[li, :B, :, :ctx], self.V[li, :B, :, :ctx]  # views: no copy
            # GQA as a batched matmul: [B, kv, g, hd] x [B, kv, hd, ctx]; softmax in float32 like HF.
            s = torch.matmul(q.view(B, self.nkv, g, self.hd), kc.transpose(-1, -2)).float() * self.scale
            p = torch.softmax(s + bias, dim=-1).to(self.dtype)
            o = torch.matmul(p, vc).reshape(B, self.nh * self.hd)
            x = x + o @ L["o"].t()
            x = x + self._mlp(self._rms(x, L["ln2"]), L)
        logits = (self._rms(x, self.norm) @ self.lm_head.t()).float()
        return logits, torch.argmax(logits, dim=-1)

    def _decode_fused(self, tokens: torch.Tensor, pos: torch.Tensor, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`decode` with the fused ops: RoPE + KV store in one kernel, flash-decoding attention
        that stops at each row's position, each residual add fused with the norm after it, SwiGLU
        in one kernel. Same static shapes and no host syncs: graph-capturable."""
        ops, B, n = self.ops, tokens.shape[0], len(self.layers)
        # --kernels triton-mv: the five projections through kernels.mv_linear (at batch <= MV_MAX_ROWS a
        # Triton GEMV with the config tuned for its shape; otherwise x @ w.t(), as here for the rest).
        # --kernels triton-mm: the same at batch 1, and at 2..64 kernels.mm_linear (the skinny Triton GEMM where
        # kernels.MM_CONFIGS lists the shape: tuned on the H200 for the 7B; else cuBLAS).
        lin = {"triton-mv": kernels_mod.mv_linear, "triton-mm": kernels_mod.mmv_linear}.get(self.kernels, _linear)
        attn_kw = self._attn_kw(B, ctx)
        if self.mm_norm and self.kernels == "triton-mm" and B > kernels_mod.MV_MAX_ROWS:
            return self._decode_mm_norm(tokens, pos, ctx, lin, attn_kw)
        glu = self.mm_glu and self.kernels == "triton-mm"  # (a later set_kernels leaves mm_glu set: unfused then)
        x = self.embed[tokens]
        h = ops.rmsnorm(x, self.layers[0]["ln1"], self.eps)
        for li, L in enumerate(self.layers):
            q = ops.rope_store(lin(h, L["qkv"]), self.cos, self.sin, pos, self.K, self.V, li)
            o = ops.decode_attn(q, self.K, self.V, li, B, pos, ctx, self.scale, **attn_kw)
            x, h = ops.add_rmsnorm(x, lin(o, L["o"]), L["ln2"], self.eps)
            act = kernels_mod.mm_glu_linear(h, L["gu"], self.inter) if glu else None  # --mm-glu on
            if act is None:
                act = ops.silu_mul(lin(h, L["gu"]), self.inter)
            d = lin(act, L["down"])
            x, h = ops.add_rmsnorm(x, d, self.layers[li + 1]["ln1"] if li + 1 < n else self.norm, self.eps)
        logits = lin(h, self.lm_head).float()
        return logits, torch.argmax(logits, dim=-1)

    def _decode_mm_norm(self, tokens: torch.Tensor, pos: torch.Tensor, ctx: int, lin: Callable[..., torch.Tensor],
                        attn_kw: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_decode_fused` under ``--mm-norm on`` (batch 2..64): the residual stream ``x`` is what the GEMMs
        read and write; each norm is folded into the GEMM after it (kernels.mm_norm_linear: QKV, gate/up, lm_head;
        with --mm-glu, gate/up's GLU launch) and each residual add into the GEMM before it (kernels.mm_res_linear, in
        place: O, down), so no norm launch is left where kernels.MM_FUSE_CONFIGS lists the shapes (per layer 8
        launches -> 6; 5 with --mm-glu). Where a norm's GEMM is not listed, the norm runs as its own launch; where a
        residual add's GEMM is not listed, the add and the next norm run as one add_rmsnorm launch (what
        :meth:`_decode_fused` runs; the next GEMM then takes the normed rows, fused or not: a residual add alone in a
        launch would cost a launch more than today's step). The norm's scale is applied to the dot, not to x before it:
        rounded once where the norm launch rounds twice, so the accuracy gate judges it. Graph-capturable."""
        ops, eps, B = self.ops, self.eps, tokens.shape[0]

        def normed(x: torch.Tensor, h: torch.Tensor | None, ln: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            if h is not None:  # the add before could not fuse: add_rmsnorm normed x already
                return lin(h, w)
            y = kernels_mod.mm_norm_linear(x, ln, eps, w)
            return y if y is not None else lin(ops.rmsnorm(x, ln, eps), w)

        def added(a: torch.Tensor, w: torch.Tensor, x: torch.Tensor,
                  ln: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            """The residual add after a's GEMM: in its epilogue where listed (x updated in place; h None), else
            the GEMM, then the add and the next norm (``ln``) in one add_rmsnorm launch, as without --mm-norm."""
            y = kernels_mod.mm_res_linear(a, w, x)
            return (y, None) if y is not None else ops.add_rmsnorm(x, lin(a, w), ln, eps)

        x, h, n = self.embed[tokens], None, len(self.layers)  # x a fresh tensor: the residual stream, updated in place
        for li, L in enumerate(self.layers):
            q = ops.rope_store(normed(x, h, L["ln1"], L["qkv"]), self.cos, self.sin, pos, self.K, self.V, li)
            o = ops.decode_attn(q, self.K, self.V, li, B, pos, ctx, self.scale, **attn_kw)
            x, h = added(o, L["o"], x, L["ln2"])
            act = None
            if h is not None:  # ln2 normed by add_rmsnorm: --mm-glu's launch (or the GEMM) over h
                act = kernels_mod.mm_glu_linear(h, L["gu"], self.inter) if self.mm_glu else None
            elif self.mm_glu:
                act = kernels_mod.mm_glu_linear(x, L["gu"], self.inter, norm=(L["ln2"], eps))
                if act is None and kernels_mod.fuse_config("norm", B, *L["gu"].shape) is None:
                    act = kernels_mod.mm_glu_linear(ops.rmsnorm(x, L["ln2"], eps), L["gu"], self.inter)  # --mm-glu alone
            if act is None:
                act = ops.silu_mul(normed(x, h, L["ln2"], L["gu"]), self.inter)
            x, h = added(act, L["down"], x, self.layers[li + 1]["ln1"] if li + 1 < n else self.norm)
        logits = normed(x, h, self.norm, self.lm_head).float()
        return logits, torch.argmax(logits, dim=-1)

    def _decode_gemv(self, tokens: torch.Tensor, pos: torch.Tensor, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_decode_fused` with the QKV and gate/up GEMMs as Triton GEMVs that take their
        neighbours in (``--kernels triton-gemv``, batch <= kernels.GEMV_MAX_ROWS): per layer

        * ``norm_qkv_rope``: the residual add of the previous down projection + ln1 in the prologue,
          RoPE + KV store in the epilogue (was add_rmsnorm, the QKV GEMM, rope_store: 3 launches);
        * ``decode_attn`` (split-KV partials + reduction: 2) and the O projection (cuBLAS: 1);
        * ``norm_gu_silu``: the residual add of O + ln2 in, SwiGLU out (was add_rmsnorm, GEMM, silu_mul);
        * the down projection (cuBLAS: 1); its output is the next layer's residual delta.

        6 launches per layer instead of 10. The final norm (with the last residual add) and the lm_head
        stay as in :meth:`_decode_fused`. Same arithmetic and rounding points; graph-capturable."""
        ops, B = self.ops, tokens.shape[0]
        attn_kw = self._attn_kw(B, ctx)
        x, d = self.embed[tokens], None
        for li, L in enumerate(self.layers):
            q, x = kernels_mod.norm_qkv_rope(x, d, L["ln1"], self.eps, L["qkv"], self.cos, self.sin, pos,
                                             self.K, self.V, li)
            o = ops.decode_attn(q, self.K, self.V, li, B, pos, ctx, self.scale, **attn_kw)
            act, x = kernels_mod.norm_gu_silu(x, o @ L["o"].t(), L["ln2"], self.eps, L["gu"], self.inter)
            d = act @ L["down"].t()
        _, h = ops.add_rmsnorm(x, d, self.norm, self.eps)
        logits = (h @ self.lm_head.t()).float()
        return logits, torch.argmax(logits, dim=-1)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy one sequence's KV (all layers) from slot ``src`` to ``dst``."""
        self.K[:, dst, :, :length] = self.K[:, src, :, :length]
        self.V[:, dst, :, :length] = self.V[:, src, :, :length]


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def sdpa_backends(sdpa: str, batched: bool, device_type: str) -> list[str] | None:
    """The SDPA backends a prefill attention call may use (None: torch's own choice, all of them).

    ``--sdpa auto`` leaves the choice to torch, except for ``--prefill-attn fused-batched``'s calls over
    several prompts on a GPU: there cuDNN, which torch prefers on Hopper, builds a plan per new shape on its
    first call (~78 ms on the H200 at 9-63 prompts of 512 tokens, against 0.3-0.8 ms once built:
    prefill_attn_bench.py, 2026-12-04) and a burst meets up to 7 new batch sizes per prompt length, so
    those calls leave cuDNN out (flash: 0.70 ms at 64 prompts, no plan)."""
    name = _SDPA[sdpa]
    if name is not None:
        return [name]
    if batched and device_type == "cuda":
        return ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]
    return None


def _attn_groups(rows: list[tuple]) -> list[tuple]:
    """``--prefill-attn fused-batched``: a packed pass's parts (r0, r1, slot, start, mask) grouped for
    attention as (r0, r1, first slot, n parts, start, mask). A run of whole prompts (start 0) of one length
    in consecutive slots (a burst's) becomes groups of 2**k parts, largest first (55 = 32 + 16 + 4 + 2 + 1),
    each one SDPA call over [n, heads, length, head_dim] reading the pool's slots in place: a backend then
    sees at most 7 batch sizes per prompt length (64 slots), not every count a pass happens to take (the
    H200: one batched cuDNN call 0.35 ms against 64 per-prompt calls of 15.6 us per layer, C's shape;
    prefill_attn_bench.py). Other parts stay one call each."""
    groups: list[tuple] = []
    i = 0
    while i < len(rows):
        r0, r1, slot, start, mask = rows[i]
        c, j = r1 - r0, i + 1
        while (start == 0 and j < len(rows) and rows[j][3] == 0 and rows[j][1] - rows[j][0] == c
               and rows[j][2] == slot + (j - i)):
            j += 1
        k, left = i, j - i
        while left:
            n = 1 << (left.bit_length() - 1)
            groups.append((rows[k][0], rows[k + n - 1][1], rows[k][2], n, rows[k][3], rows[k][4]))
            k, left = k + n, left - n
        i = j
    return groups


class GraphDecoder:
    """Decode steps by CUDA graph replay: one graph per (batch bucket, context bucket)."""

    def __init__(self, fm: FastModel, max_batch: int, use_graphs: bool) -> None:
        self.fm = fm
        self.use_graphs = use_graphs and fm.device.type == "cuda"
        b, self.batch_buckets = 1, []
        while b < max_batch:
            self.batch_buckets.append(b)
            b *= 2
        self.batch_buckets.append(max_batch)
        c, self.ctx_buckets = 256, []
        while c < fm.capacity:
            self.ctx_buckets.append(c)
            c *= 2
        self.ctx_buckets.append(fm.capacity)
        dev = fm.device
        self.inp = torch.zeros(2, max_batch, dtype=torch.long, device=dev)  # tokens, positions
        self.host = torch.zeros(2, max_batch, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.host_np = self.host.numpy()  # the same memory: a list goes in without a tensor built per step
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor, torch.Tensor]] = {}
        self.pool = None
        # --overlap-schedule: each step's ids copied out at once into one of two pinned buffers (two
        # steps can be in flight), with an event the host waits on (see :meth:`copy_out`).
        cuda = dev.type == "cuda"
        self.out_host = [torch.zeros(max_batch, dtype=torch.long, pin_memory=cuda) for _ in range(2)]
        self.out_events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self.out_tables: dict[tuple[int, int], torch.Tensor] = {}  # (flip, columns): logprob tables' buffers
        self._flip = 0
        self.timing: list | None = None  # HFSERVE_STEP_LOG: (start, end) CUDA events of each graph step

    def _bucket(self, xs: list[int], n: int) -> int:
        return next(x for x in xs if x >= n)

    def capture_all(self) -> float:
        """Capture every (batch, context) graph now, so no request pays for a capture."""
        t0 = time.perf_counter()
        if self.use_graphs:
            for b in self.batch_buckets:
                for c in self.ctx_buckets:
                    self._graph(b, c)
        return time.perf_counter() - t0

    def _graph(self, b: int, c: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
        key = (b, c)
        if key not in self.graphs:
            self.inp[1, :b] = self.fm.scratch_pos  # harmless positions while capturing
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):  # warm-up outside the graph (cuBLAS handles, workspaces)
                    self.fm.decode(self.inp[0, :b], self.inp[1, :b], c)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.pool):
                logits, ids = self.fm.decode(self.inp[0, :b], self.inp[1, :b], c)
            self.graphs[key] = (graph, logits, ids)
        return self.graphs[key]

    def step(self, tokens: list[int], positions: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Decode one token for slots ``0..n-1``; returns (float logits [>=n, V], greedy ids [n])."""
        logits, ids = self.launch(tokens, positions)
        return logits, ids.tolist()  # the step's one device->host copy, the whole batch at once

    def launch(self, tokens: list[int] | None, positions: list[int],
               prev: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step` without waiting for it: the step is queued on the device and this returns at
        once with (float logits [>=n, V], greedy ids [n] on the device); ``ids.tolist()`` waits.
        ``tokens`` None: the input ids are ``prev``, the greedy ids of the step queued before (same rows,
        same order), copied on the device: the host need not have read them (--overlap-schedule)."""
        n = len(positions)
        b = self._bucket(self.batch_buckets, n)
        c = self._bucket(self.ctx_buckets, max(positions) + 1)
        h = self.host_np
        h[0, :n] = tokens if tokens is not None else 0
        h[1, :n] = positions
        h[0, n:b] = 0
        h[1, n:b] = self.fm.scratch_pos  # padding rows write only the scratch position
        self.inp[:, :b].copy_(self.host[:, :b], non_blocking=True)
        if tokens is None:
            self._feed(prev, n)
        if self.use_graphs:
            graph, logits, ids = self._graph(b, c)
            if self.timing is not None:  # HFSERVE_STEP_LOG: the step's start and end on the device
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
                graph.replay()
                ev[1].record()
                self.timing.append(ev)
            else:
                graph.replay()
        else:
            logits, ids = self.fm.decode(self.inp[0, :b], self.inp[1, :b], c)
        return logits, ids[:n]

    def _feed(self, prev: torch.Tensor, n: int) -> None:
        """The next step's input ids from the last step's output, on the device (stream order: after
        that step, before this one's replay overwrites a graph's output buffer)."""
        self.inp[0, :n].copy_(prev, non_blocking=True)

    def copy_out(self, ids: torch.Tensor) -> Any:
        """Queue ``ids``' copy to pinned host memory right behind the step that writes them (before a
        later replay of the same graph overwrites its output buffer); returns a handle whose
        ``tolist()`` waits for the copy alone, with the GIL released (later steps may still run).
        ``ids`` may also be a step's :func:`logprob_table` (float64 [n, columns])."""
        i, n = self._flip, ids.shape[0]
        self._flip ^= 1
        if ids.dim() == 1:
            buf = self.out_host[i][:n]
        else:
            key = (i, ids.shape[1])
            if key not in self.out_tables:
                self.out_tables[key] = torch.zeros(self.out_host[i].shape[0], ids.shape[1], dtype=ids.dtype,
                                                   pin_memory=self.out_events[i] is not None)
            buf = self.out_tables[key][:n]
        ev = self.out_events[i]
        buf.copy_(ids, non_blocking=True)
        if ev is not None:
            ev.record()
        return _HostIds(buf, ev)


class _HostIds:
    """A step's greedy ids on their way to pinned host memory (see :meth:`GraphDecoder.copy_out`)."""

    __slots__ = ("buf", "ev")

    def __init__(self, buf: torch.Tensor, ev: Any) -> None:
        self.buf, self.ev = buf, ev

    def tolist(self) -> list[int]:
        if self.ev is not None:
            self.ev.synchronize()  # releases the GIL while it waits
        return self.buf.tolist()


class _Ahead:
    """A decode step on the device whose ids the host has not read: its rows (the sequences, in slot
    order at its launch), its ids on the device (the next step's input) and their copy to the host
    (:func:`_readout`'s: the bare ids, or a :func:`logprob_table` when some row asked for logprobs)."""

    __slots__ = ("rows", "ids", "host")

    def __init__(self, rows: list[_FSeq], ids: torch.Tensor, host: Any) -> None:
        self.rows, self.ids, self.host = rows, ids, host


def _readout(seqs: list[_FSeq], logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """What the host reads of a step over ``seqs`` (greedy ``ids`` from ``logits``), in one copy: the ids,
    or, when a greedy request asks for logprobs, a :func:`logprob_table` as wide as the most any asks for.
    Each read row becomes the request's event by :func:`table_event`."""
    ks = [s.req.logprobs for s in seqs if s.req.temperature <= 0 and s.req.logprobs is not None]
    return ids if not ks else logprob_table(logits[:len(seqs)], ids, max(ks))


class _FSeq:
    __slots__ = ("req", "gen", "last", "pos", "done_prompt", "done")

    def __init__(self, req: Any, gen: torch.Generator | None) -> None:
        self.req, self.gen, self.last, self.pos, self.done_prompt, self.done = req, gen, 0, 0, 0, False


def set_pdl(fm: FastModel, on: bool) -> None:
    """``--pdl on``: the Triton kernels launched with programmatic dependent launch (kernels.set_pdl; process-wide,
    set off again by an engine without it). Needs the Triton kernels and, on a GPU, Hopper or newer (sm_90+: the
    launch attribute and griddepcontrol); on the CPU (the interpreter) the launches stay as they are."""
    if on and fm.kernels == "torch":
        raise ValueError("--pdl on needs the Triton kernels: add --kernels triton (or triton-mv/-mm)")
    cap = torch.cuda.get_device_capability(fm.device) if on and fm.device.type == "cuda" else (9, 0)
    if cap[0] < 9:
        raise ValueError(f"--pdl on needs a Hopper GPU or newer (sm_90+), not sm_{cap[0]}{cap[1]}")
    kernels_mod.set_pdl(on)


_GC_HOOKS: list[tuple[weakref.ref, Callable[[str, dict[str, Any]], None]]] = []


def _gc_hook(engine: FastEngine) -> Callable[[str, dict[str, Any]], None]:
    """A gc.callbacks entry calling ``engine._gc_mark`` while the engine lives (a weak reference: the hook does not
    keep an engine alive). Hooks of engines gone are taken out of gc.callbacks here, outside any collection."""
    for ref, dead in [h for h in _GC_HOOKS if h[0]() is None]:
        _GC_HOOKS.remove((ref, dead))
        if dead in gc.callbacks:
            gc.callbacks.remove(dead)
    ref = weakref.ref(engine)

    def hook(phase: str, info: dict[str, Any]) -> None:
        e = ref()
        if e is not None:
            e._gc_mark(phase, info)

    _GC_HOOKS.append((ref, hook))
    return hook


class FastEngine:
    """The server's engine interface (``submit``, ``tokenizer``, ``max_len``) over :class:`FastModel`."""

    # Defaults of the optional parts (set per instance in __init__; tests build engines without it).
    overlap = False
    prefill_rounds = 1
    _ahead: _Ahead | None = None
    _step_log_path: str | None = None
    _profile_path: str | None = None
    _timeline: deque | None = None

    def __init__(self, model_dir: str, *, dtype: str = "bfloat16", device: str = "cuda", max_batch_size: int = 8,
                 max_model_len: int = 4608, prefill_chunk: int = 0, cuda_graphs: bool = True,
                 sdpa: str = "auto", kernels: str = "torch", load: str = "fast", prefill_pack: int = 0,
                 prefill_attn: str = "torch", decode_attn: str = "default", kv_cache_dtype: str = "auto",
                 overlap_schedule: bool = False, prefill_rounds: int = 1, mm_glu: bool = False,
                 mm_norm: bool = False, pdl: bool = False, phases: Phases | None = None) -> None:
        from transformers import AutoTokenizer

        # `phases`: where the start-up's seconds go (server.py prints them as one line).
        phases = phases or Phases()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        phases.mark("tokenizer")
        init_device(device)
        phases.mark("cuda")
        hf, self.load_path = load_model(model_dir, dtype=getattr(torch, dtype), device=device, how=load)
        phases.mark("load")
        cfg = hf.config
        self.max_len = min(int(max_model_len), int(getattr(cfg, "max_position_embeddings", max_model_len)))
        self.max_batch = max(1, int(max_batch_size))
        # Slots: the decode batch, one staging slot for chunked prefill, one for scoring.
        self.stage_slot, self.score_slot = self.max_batch, self.max_batch + 1
        with torch.inference_mode():
            if kv_cache_dtype != "auto" and kernels == "torch":
                raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} needs the Triton kernels (--kernels triton*)")
            self.fm = FastModel(hf, slots=self.max_batch + 2, capacity=self.max_len, sdpa=sdpa, kernels="torch",
                                kv_cache_dtype=kv_cache_dtype)
        if self.fm.device.type == "cuda":
            torch.cuda.synchronize()
        phases.mark("build")  # fused weights (concatenated QKV, gate/up), the KV pool, RoPE tables
        self.fm.set_kernels(kernels)
        self.fm.set_prefill_attn(prefill_attn)
        self.fm.set_decode_attn(decode_attn)
        self.fm.set_mm_glu(mm_glu)
        self.fm.set_mm_norm(mm_norm)
        set_pdl(self.fm, pdl)
        phases.mark("kernels")  # Triton's import and checks, where asked for
        self.model = types.SimpleNamespace(config=cfg)  # what the HTTP layer reads (vocab size)
        del hf
        self.eos_ids = set(as_list(getattr(cfg, "eos_token_id", None)))
        self.chunk = max(0, int(prefill_chunk))
        self.pack = max(0, int(prefill_pack))
        if int(prefill_rounds) not in (1, 2):
            raise ValueError(f"prefill_rounds must be 1 or 2, not {prefill_rounds!r}")
        self.prefill_rounds = int(prefill_rounds)
        self.decoder = GraphDecoder(self.fm, self.max_batch, cuda_graphs)
        # HFSERVE_STEP_LOG=FILE: every decode step's (batch, time) appended to FILE whenever the batch empties
        # (the served step time, to set beside the client's inter-token latency; benchmarks/gpu/step_gaps.py).
        self._step_log_path = os.environ.get("HFSERVE_STEP_LOG") or None
        self._step_marks: list[tuple[int, float, float]] = []
        # ... and beside it, FILE.timeline: each job's arrival (``J time``) and each packed prefill pass
        # (``P prompts tokens start end device_ms``), same clock: where a burst's time goes before its first step.
        self._timeline: deque | None = deque() if self._step_log_path else None
        # ... and the cyclic garbage collector's passes of 1 ms or more (``G generation start ms``): a collection
        # holds the GIL for its whole pass, so a long one stalls the engine thread between two steps (--gc-freeze).
        self._gc_t0 = 0.0
        if self._timeline is not None:
            gc.callbacks.append(_gc_hook(self))
        self.overlap = bool(overlap_schedule)
        if self._step_log_path and self.decoder.use_graphs:
            self.decoder.timing = []
        # HFSERVE_PROFILE=FILE: torch.profiler over PROFILE_STEPS decode steps of the first batch of >= 32 rows
        # (after PROFILE_SKIP of them), its kernel table written to FILE: the served step's own profile.
        self._profile_path = os.environ.get("HFSERVE_PROFILE") or None
        for var, path in (("HFSERVE_STEP_LOG", self._step_log_path), ("HFSERVE_PROFILE", self._profile_path)):
            try:  # refused now, in one line, rather than by the worker thread mid-burst
                if path:
                    open(path, "a").close()
            except OSError as exc:
                raise SystemExit(f"hfserve: {var}={path} cannot be written: {exc.strerror}") from None
        self._profile: Any = None
        self._profile_seen = 0
        self._prefill_profiled = False
        self._ahead: _Ahead | None = None  # --overlap-schedule: the step on the device not read yet
        if self.overlap:
            # The engine thread must win the GIL back within a fraction of a step when its ids are in,
            # while the event loop streams the step before (CPython's default is 5 ms: ~a whole step).
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        with torch.inference_mode():
            secs = self.decoder.capture_all()
        if self.decoder.use_graphs:
            print(f"hfserve: captured {len(self.decoder.graphs)} decode graphs in {secs:.1f}s",
                  file=sys.stderr, flush=True)
        if self.fm.device.type == "cuda":
            torch.cuda.synchronize()
        phases.mark("capture")  # the decode graphs (and their warm-up runs), or the decoder's buffers without
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="hfserve-fast", daemon=True)
        self.thread.start()
        phases.mark("other")

    def submit(self, job: Any) -> None:
        """Queue a job for the worker thread."""
        if self._timeline is not None:
            self._timeline.append(f"J {time.perf_counter():.6f}")
        self.jobs.put(job)

    # -- worker ------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            self._loop()

    def _loop(self) -> None:
        active: list[_FSeq] = []  # decoding, in slots 0..len-1
        pending: deque = deque()
        filling: _FSeq | None = None  # a chunked prefill in progress (staging slot)
        late: list = []  # requests with events of the last decode step not yet woken (see _decode)
        again = False  # --prefill-rounds 2: this round only prefills the prompts that arrived during the last one's pass
        while True:
            # The last step's events wait for the next launch, unless none comes next (nothing active,
            # or a job first: a scoring pass, a prompt to prefill): then they are streamed now.
            if late and (not active or not self.jobs.empty()):
                wake(late)
                late = []
            drain_jobs(self.jobs, pending, self._safe_score, block=not active and not pending and filling is None)
            # A step launched ahead (--overlap-schedule) is read before a prefill changes the rows.
            if self._ahead is not None and (pending or filling is not None) and len(active) < self.max_batch:
                try:
                    active = self._settle(active)
                except Exception as exc:
                    active = self._failed(exc, active, [])
            if late and (pending or filling is not None) and len(active) < self.max_batch:  # a prefill comes first
                wake(late)
                late = []
            # Prefill: whole prompts first (chunk 0), or one chunk per step between decode steps.
            budget = self.chunk if self.chunk else None
            prefilled = False
            while (filling is not None or pending) and len(active) < self.max_batch:
                prefilled = True
                if filling is None and self.pack:
                    used = self._prefill_packed(pending, active, budget)
                    if used:
                        if budget is not None:
                            budget -= used
                            if budget <= 0:
                                break
                        continue
                    if not pending:  # every one left was cancelled
                        break
                if filling is None:
                    req = pending.popleft()
                    if req.cancelled:
                        continue
                    filling = _FSeq(req, self._generator(req))
                try:
                    done, used = self._prefill_some(filling, len(active), budget)
                except Exception as exc:  # a bad request must not kill the worker
                    print(f"hfserve: prefill failed: {exc!r}", file=sys.stderr, flush=True)
                    filling.req.emit("error", str(exc))
                    filling = None
                    continue
                if done:
                    s = filling
                    if not s.req.cancelled and not self._first_token(s, self._pending_logits):
                        active.append(s)
                    filling = None
                if budget is not None:
                    budget -= used
                    if budget <= 0:
                        break
            # --prefill-rounds 2: whole prompts that arrived while this round's pass ran are prefilled before
            # the next decode step (one more round, not more), instead of after one decode step of the rows
            # there (served C on the H200: 11 prompts, a batch-11 step, 53 prompts). Measured on the H200
            # (2026-12-04): C unchanged within the launch spread; D's TTFT p50 143 -> 188 ms (its c4 arrivals,
            # ~50 ms apart with one round, get grouped into passes the later ones wait for), TPOT 5.42 -> 5.26.
            if prefilled and not again and self.prefill_rounds > 1 and budget is None and len(active) < self.max_batch and not self.jobs.empty():
                again = True
                continue
            again = False
            if active:
                if self._step_log_path:
                    self._step_marks.append((len(active), time.perf_counter(), time.thread_time()))
                if self._profile_path and len(active) >= 32:
                    self._profile_step()
                try:
                    active, late = self._decode(active, late)
                except Exception as exc:
                    active = self._failed(exc, active, late)
                    late = []
                if not active and self._step_log_path and self._step_marks:
                    self._flush_step_log()

    def _profile_prefill(self, parts: list, used: int) -> torch.Tensor:
        """HFSERVE_PROFILE: one packed prefill pass under the profiler; its kernel table and wall time go
        to FILE.prefill."""
        self._prefill_profiled = True
        cuda = self.fm.device.type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        with self._profiler() as prof:
            logits = self.fm.prefill_packed(parts)
            sync()
        wall = time.perf_counter() - t0
        with open(f"{self._profile_path}.prefill", "w") as f:
            f.write(f"packed prefill of {used} tokens ({len(parts)} prompts): {wall * 1000:.1f} ms profiled\n"
                    f"{self._profile_table(prof)}\n")
        return logits

    def _profiler(self) -> Any:
        """HFSERVE_PROFILE's torch.profiler: CPU, and CUDA on a GPU."""
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if self.fm.device.type == "cuda"
                                                            else [])])

    def _profile_table(self, prof: Any) -> str:
        """The profile's kernel table, by device time on a GPU (CPU time on the CPU), 30 rows."""
        return prof.key_averages().table(sort_by="self_cuda_time_total" if self.fm.device.type == "cuda"
                                         else "self_cpu_time_total", row_limit=30)

    def _profile_step(self) -> None:
        """HFSERVE_PROFILE: start the profiler at the PROFILE_SKIP-th large step, stop it PROFILE_STEPS later."""
        self._profile_seen += 1
        if self._profile_seen == PROFILE_SKIP:
            self._profile = self._profiler()
            self._profile.__enter__()
        elif self._profile_seen == PROFILE_SKIP + PROFILE_STEPS and self._profile is not None:
            if self.fm.device.type == "cuda":
                torch.cuda.synchronize()
            prof, self._profile = self._profile, None
            prof.__exit__(None, None, None)
            with open(self._profile_path, "w") as f:
                f.write(f"{PROFILE_STEPS} decode steps from the {PROFILE_SKIP}-th of a batch >= 32\n"
                        f"{self._profile_table(prof)}\n")

    def _gc_mark(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks hook (HFSERVE_STEP_LOG): a pass of >= 1 ms into the timeline, in whichever thread ran it."""
        now = time.perf_counter()
        if phase == "start":
            self._gc_t0 = now
        elif now - self._gc_t0 >= 1e-3 and self._timeline is not None:
            self._timeline.append(f"G {info.get('generation', -1)} {self._gc_t0:.6f} {(now - self._gc_t0) * 1e3:.3f}")

    def _device_event(self) -> Any:
        """A CUDA event recorded now on the current stream (None off the GPU): the timeline's device clock."""
        if self.fm.device.type != "cuda":
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _flush_step_log(self) -> None:
        """Append the burst's steps: ``batch wall_time thread_cpu_time`` per step (the engine thread's CPU
        clock), and with CUDA graphs ``busy_ms idle_ms``: the graph's own time on the device and the device's
        wait from the step before's end to its start."""
        ev = self.decoder.timing or []
        dev = [""] * len(self._step_marks)
        if ev and len(ev) == len(self._step_marks):
            ev[-1][1].synchronize()
            for i, (a, b) in enumerate(ev):
                idle = ev[i - 1][1].elapsed_time(a) if i else 0.0
                dev[i] = f" {a.elapsed_time(b):.4f} {idle:.4f}"
        if self._timeline is not None:  # first: a reader that sees the step log's "end" finds the timeline's too
            lines = []
            while self._timeline:  # the event loop's thread appends arrivals meanwhile: popped one by one
                lines.append(self._timeline.popleft())
            with open(f"{self._step_log_path}.timeline", "a") as f:
                f.write("".join(f"{x}\n" for x in lines) + "end\n")
        with open(self._step_log_path, "a") as f:
            f.write("".join(f"{n} {t:.6f} {c:.6f}{d}\n" for (n, t, c), d in zip(self._step_marks, dev, strict=True))
                    + "end\n")
        self._step_marks.clear()
        if self.decoder.timing is not None:
            self.decoder.timing = []

    def _failed(self, exc: Exception, active: list[_FSeq], late: list) -> list[_FSeq]:
        """A decode step failed: stream what was queued, end every decoding request with the error."""
        print(f"hfserve: decode failed: {exc!r}", file=sys.stderr, flush=True)
        self._ahead = None
        if late:
            wake(late)
        for s in active:
            s.req.emit("error", str(exc))
        return []

    def _generator(self, req: Any) -> torch.Generator | None:
        return request_generator(req, self.fm.device)

    def _prefill_some(self, s: _FSeq, row: int, budget: int | None) -> tuple[bool, int]:
        """Prefill up to ``budget`` prompt tokens of ``s``; (prompt finished, tokens used)."""
        ids = s.req.prompt_ids
        whole = budget is None or (s.done_prompt == 0 and len(ids) <= budget)
        slot = row if whole else self.stage_slot
        n = len(ids) - s.done_prompt if budget is None else min(budget, len(ids) - s.done_prompt)
        chunk = torch.tensor(ids[s.done_prompt:s.done_prompt + n], device=self.fm.device)
        logits = self.fm.prefill(chunk, slot, s.done_prompt)
        s.done_prompt += n
        if s.done_prompt < len(ids):
            return False, n
        if slot != row:
            self.fm.move_slot(slot, row, len(ids))
        s.pos = len(ids)
        s.last = -1
        self._pending_logits = logits[-1]
        return True, n

    def _prefill_packed(self, pending: deque, active: list[_FSeq], budget: int | None) -> int:
        """Prefill the queued whole prompts that fit together (``--prefill-pack`` tokens, the step's
        chunk budget, free slots) in one forward pass, straight into their decode slots; emit their
        first tokens and admit the unfinished ones to ``active``. Returns the tokens prefilled, 0
        when the next prompt does not fit whole (the one-prompt path then takes it, chunked)."""
        cap = self.pack if budget is None else min(self.pack, budget)
        group: list[_FSeq] = []
        used = 0
        while pending and len(active) + len(group) < self.max_batch:
            req = pending[0]
            if req.cancelled:
                pending.popleft()
                continue
            n = len(req.prompt_ids)
            if used + n > cap or n > self.fm.scratch_pos:  # too long: left to the one-prompt path
                break
            pending.popleft()
            group.append(_FSeq(req, self._generator(req)))
            used += n
        if not group:
            return 0
        rows = range(len(active), len(active) + len(group))
        parts = [(torch.tensor(s.req.prompt_ids, device=self.fm.device), row, 0) for s, row in zip(group, rows,
                                                                                                      strict=True)]
        mark = self._timeline is not None
        t0, ev0 = (time.perf_counter(), self._device_event()) if mark else (0.0, None)
        try:
            if self._profile_path and not self._prefill_profiled and used >= PROFILE_PREFILL_TOKENS:
                logits = self._profile_prefill(parts, used)
            else:
                logits = self.fm.prefill_packed(parts)
        except Exception as exc:  # a bad batch must not kill the worker
            print(f"hfserve: packed prefill failed: {exc!r}", file=sys.stderr, flush=True)
            for s in group:
                s.req.emit("error", str(exc))
            return used
        ev1 = self._device_event() if mark else None
        firsts = self._greedy_firsts(group, logits)
        if mark:
            dev = -1.0
            if ev0 is not None and ev1 is not None:
                ev1.synchronize()
                dev = ev0.elapsed_time(ev1)
            self._timeline.append(f"P {len(group)} {used} {t0:.6f} {time.perf_counter():.6f} {dev:.3f}")
        # Sequences that finish at once leave holes: the next admitted one moves into the first hole.
        for s, row, lg, ev in zip(group, rows, logits, firsts, strict=True):
            s.pos, s.last, s.done_prompt = len(s.req.prompt_ids), -1, len(s.req.prompt_ids)
            if s.req.cancelled or self._first_token(s, lg, notify=False, ev=ev):
                continue
            if row != len(active):
                self.fm.move_slot(row, len(active), s.pos)
            active.append(s)
        wake([s.req for s in group])  # one event-loop call for the whole group's first tokens
        return used

    @staticmethod
    def _greedy_firsts(group: list[_FSeq], logits: torch.Tensor) -> list[Any]:
        """The first tokens' events of a packed prefill's greedy requests, from one argmax and one
        :func:`logprob_table` over the group read back in one copy (None for a sampled request)."""
        if not any(s.req.temperature <= 0 for s in group):
            return [None] * len(group)
        rows = _readout(group, logits, torch.argmax(logits, dim=-1)).tolist()
        return [None if s.req.temperature > 0 else table_event(r, s.req.logprobs) for s, r in zip(group, rows, strict=True)]

    def _first_token(self, s: _FSeq, row: torch.Tensor, notify: bool = True, ev: Any = None) -> bool:
        """Emit the token sampled from the prompt's last logits ``row`` (or ``ev``, its event already
        built); True if the request is finished. ``notify=False`` only queues the events (the caller
        wakes the handlers)."""
        req = s.req
        if ev is None:
            tok = sample_row(row, req, s.gen)
            ev = token_event(tok, row, req.logprobs)
        else:
            tok = event_token(ev)
        req.n_generated += 1
        req.push("token", ev)
        s.last = tok
        done = finish_check(req, tok, self.eos_ids, notify=False)
        if notify:
            wake([req])
        return done

    def _decode(self, active: list[_FSeq], late: list) -> tuple[list[_FSeq], list]:
        """One decode step over ``active``; returns the sequences still decoding and the requests whose
        events this step queued, to be woken after the next step's launch (``late`` are the previous
        step's: they are woken here, once this step is queued on the device).

        Host work per request is a few attribute updates and a deque append: the sampled ids come
        back in one copy for the whole batch, a greedy request without logprobs gets its bare id (the
        HTTP side builds the event and detokenizes), and the handlers are woken by one event-loop
        call for the step, not one per token per request. That call comes *after* the next step is
        launched: the event loop's streaming of a step's tokens (detokenize, SSE, one socket write
        per stream: ~2 ms at batch 64) then runs while the device computes the next step and the
        engine thread waits on its ids with the GIL released, instead of between the sync and the
        next launch, where it held the GIL the launch needed (the device idle meanwhile).

        Greedy requests asking for logprobs get them from one :func:`logprob_table` for the step, queued
        right behind it and read back in that same one copy (the bench's and the gates' requests all
        ask for the chosen token's logprob: a log-softmax and a read per row cost ~2.4 ms per step at
        batch 64 on the H200).

        With ``--overlap-schedule`` and every sequence greedy, :meth:`_decode_ahead` does the step
        instead (and returns no late requests)."""
        if self.overlap and (self._ahead is not None or all(s.req.temperature <= 0 for s in active)):
            if late:  # a plain step came before: its events go now (the next launch is the first thing below)
                wake(late)
            return self._decode_ahead(active), []
        logits, ids = self.decoder.launch([s.last for s in active], [s.pos for s in active])
        out = _readout(active, logits, ids)
        if late:
            wake(late)
        rows = out.tolist()  # waits for the step: the step's one device->host copy (the logprobs with the ids)
        finished: list[int] = []
        eos = self.eos_ids
        for i, s in enumerate(active):
            s.pos += 1
            req = s.req
            if req.cancelled:
                finished.append(i)
                continue
            if req.temperature <= 0:
                ev = table_event(rows[i], req.logprobs)
                tok = event_token(ev)
                req.events.push("token", ev)
            else:
                tok = sample_row(logits[i], req, s.gen)
                req.events.push("token", token_event(tok, logits[i], req.logprobs))
            req.n_generated += 1
            s.last = tok
            if finish_check(req, tok, eos, notify=False):
                finished.append(i)
        step_reqs = [s.req for s in active]
        return self._refill(active, finished), step_reqs

    # -- --overlap-schedule: the next decode step launched before this one's ids are read -------------

    def _decode_ahead(self, active: list[_FSeq]) -> list[_FSeq]:
        """One decode step for greedy sequences, with the *next* step already on the device when the
        host reads this one's ids: its input ids are this step's output, copied on the device, so the
        host's work per step (reading the ids, events, finish checks, the event loop's streaming) runs
        while the device computes instead of between steps (SGLang's overlap scheduler, vLLM's async
        scheduling). Steps stay in order on one stream; the tokens are the plain path's, bit for bit.

        The step read here was launched by the call before (``self._ahead``), or now if none was. The
        next one is launched for the same rows unless this one ends them all by length; if this step
        finishes any row (a stop token, its length, a cancel), the next one is read too, its token
        for a finished row dropped (one step of that row computed for nothing), and the rows are then
        compacted as the plain path does. Returns the sequences still decoding."""
        cur = self._ahead or self._launch_ahead(active, None)
        nxt = None
        if any(s.req.n_generated + 1 < s.req.max_tokens for s in active):
            nxt = self._launch_ahead(active, cur)
        self._ahead = None
        wake(self._read_ahead(cur))
        if nxt is not None and not any(s.done for s in active):
            self._ahead = nxt
            return active
        if nxt is not None:
            wake(self._read_ahead(nxt))
        return self._compact(active)

    def _launch_ahead(self, active: list[_FSeq], prev: _Ahead | None) -> _Ahead:
        """Queue a step for ``active``: from the host's last tokens, or from ``prev``'s ids on the device
        (``prev`` not read yet: the positions are one past the host's)."""
        if prev is None:
            logits, ids = self.decoder.launch([s.last for s in active], [s.pos for s in active])
        else:
            logits, ids = self.decoder.launch(None, [s.pos + 1 for s in active], prev=prev.ids)
        return _Ahead(list(active), ids, self.decoder.copy_out(_readout(active, logits, ids)))

    def _read_ahead(self, step: _Ahead) -> list:
        """Wait for ``step``'s ids and queue their events, as the plain path does; a row already finished
        at an earlier step gets nothing. Returns the requests to wake."""
        vals = step.host.tolist()
        reqs = []
        eos = self.eos_ids
        for s, v in zip(step.rows, vals, strict=True):
            if s.done:
                continue
            s.pos += 1
            req = s.req
            if req.cancelled:
                s.done = True
                continue
            ev = table_event(v, req.logprobs)
            tok = event_token(ev)
            req.events.push("token", ev)
            req.n_generated += 1
            s.last = tok
            if finish_check(req, tok, eos, notify=False):
                s.done = True
            reqs.append(req)
        return reqs

    def _settle(self, active: list[_FSeq]) -> list[_FSeq]:
        """Read the step launched ahead (something other than a decode step comes next)."""
        step, self._ahead = self._ahead, None
        if step is not None:
            wake(self._read_ahead(step))
        return self._compact(active)

    def _compact(self, active: list[_FSeq]) -> list[_FSeq]:
        """Drop the rows marked done (:meth:`_refill`)."""
        return self._refill(active, [i for i, s in enumerate(active) if s.done])

    def _refill(self, active: list[_FSeq], finished: list[int]) -> list[_FSeq]:
        """Drop rows ``finished`` (ascending), refilling holes from the end, so decoding slots stay 0..n-1
        (KV moves, not gathers)."""
        for i in reversed(finished):
            last = len(active) - 1
            if i != last:
                self.fm.move_slot(last, i, active[last].pos)
                active[i] = active[last]
            active.pop()
        return active

    def _safe_score(self, job: Any) -> None:
        try:
            job.loop.call_soon_threadsafe(job.future.set_result, self._score(job))
        except Exception as exc:  # report to the client instead of killing the worker
            print(f"hfserve: scoring failed: {exc!r}", file=sys.stderr, flush=True)
            job.loop.call_soon_threadsafe(job.future.set_exception, exc)

    def _score(self, job: Any) -> tuple[list[float], list[list[tuple[int, float]]]]:
        """Teacher-forced log-probabilities of the prompt through the serving prefill path."""
        ids = torch.tensor(job.prompt_ids, device=self.fm.device)
        step = self.chunk or len(job.prompt_ids)
        parts = [self.fm.prefill(ids[s:s + step], self.score_slot, s, all_logits=True)
                 for s in range(0, len(job.prompt_ids), step)]
        return prompt_logprobs(torch.cat(parts), ids, job.top_k)
