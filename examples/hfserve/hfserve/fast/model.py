"""The fast engine's model: the Llama forward pass in plain torch over a preallocated KV pool.

:class:`FastModel` holds the checkpoint's weights (QKV and gate/up fused into single matrices), the KV pool
``[layers, slots, kv_heads, capacity, head_dim]`` (decoding sequences in slots ``0..n-1``, so a decode step reads
``K[:, :n, :, :L]`` as a view) and the RoPE tables; it prefills prompts (one, or several packed into one pass)
and runs decode steps, with the plain torch arithmetic or the Triton kernels of :mod:`hfserve.hfkernels`
(``--kernels``), the SDPA backend of ``--sdpa`` and the prefill attention of ``--prefill-attn``.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from .. import hfkernels as kernels_mod

_SDPA = {"auto": None, "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


KV_CACHE_DTYPES = {"auto": None, "fp8": torch.float8_e4m3fn}
"""--kv-cache-dtype's choices: the pool in the model's dtype, or in float8 e4m3 with scale 1 (vLLM's default
for ``--kv-cache-dtype fp8`` without calibrated scales): values rounded to nearest, saturating at +-448."""

PREFILL_ATTN = ("torch", "fused", "fused-batched")
"""--prefill-attn's choices (FastModel.set_prefill_attn)."""

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
        """``"torch"`` (the plain code), ``"triton"`` (hfserve.hfkernels), ``"triton-gemv"`` (the same, and at
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


