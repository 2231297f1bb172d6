"""hfserve's fast engine (``--engine fast``): a preallocated KV pool, continuous batching and CUDA-graph decode.

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
  attention (split-KV flash-decoding) and SwiGLU as hfserve.hfkernels' fused Triton kernels, and prefill's
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

The job types, sampling, finish check and prompt scoring are hfserve.engine's, so both engines agree on them.

Modules: ``model`` (FastModel: the weights, the KV pool, prefill and decode steps), ``graphs`` (GraphDecoder: the
decode steps' CUDA graphs), ``scheduler`` (FastEngine: the worker thread, batching, prefill rounds, the overlap
schedule, scoring) and ``profiling`` (HFSERVE_STEP_LOG, HFSERVE_PROFILE).
"""


from .graphs import GraphDecoder
from .model import KV_CACHE_DTYPES, PREFILL_ATTN, FastModel, set_pdl
from .scheduler import FastEngine

__all__ = ["KV_CACHE_DTYPES", "PREFILL_ATTN", "FastEngine", "FastModel", "GraphDecoder", "set_pdl"]
