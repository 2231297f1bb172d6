#!/bin/bash
# Prepared for the next H200 session (issue 24), one command from the repository root:
#   benchmarks/gpu/step10_run.sh LIMIT_S
# 1. prefill_attn_bench.py (random tensors, no model): per-prompt vs batched prefill attention per backend, and a
#    batched call's first use at new prompt counts (is cuDNN's per-shape plan why a5c0ae6's batched call served slower?).
# 2. The 7B forged, then A-D from four servers side by side (overlap on): step9 (--prefill-attn fused; from .before/
#    when carried: `mkdir -p .before && git archive 2a13622 examples/hfserve | tar -x -C .before`, the tree before
#    this session's arrival rule, so step10's figures are against the tree step 9 was measured on), step10
#    (--prefill-attn fused-batched: a burst's equal prompts in 2**k groups, one SDPA call each), step10lp (the same
#    with --kernels triton-mm and --decode-attn lowp: bf16 dots, hfkernels.ATTN_LOWP's launch) and step10kv
#    (step10lp with --kv-cache-dtype fp8: the KV pool in float8 e4m3). Results in $OUT; step10's and step10kv's
#    decode steps logged (HFSERVE_STEP_LOG: the passes of C's burst, the arrival rule's effect; step_gaps.py reads them).
# PATTN=0 leaves out step 1.
# GATE=1: then the accuracy gate on the GPU for step10kv's and step10lp's flags (both change rounding). With too
# little of LIMIT left, run it on the warm machine (the 7B stays forged there): GATE_ONLY=1 ... step10_run.sh LIMIT.
set -u
START=$SECONDS
LIMIT=${1:-560}
. benchmarks/gpu/device_env.sh
M=$(forge_7b)
if [ -z "${GATE_ONLY:-}" ]; then
[ "${PATTN:-1}" = 0 ] || { log "prefill attention bench"
timeout 90 python3 benchmarks/gpu/prefill_attn_bench.py --reps 5 --out "$OUT/pattn.json" 2>/dev/null | tail -22; }
log "model $M; A-D: step9, step10, step10lp, step10kv"
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
ib_servers "$OUT/ib_ab.json" "${AB_ONLY:-prefill,decode,throughput,general}" 60 \
  "step9={python} $([ -d .before/examples/hfserve ] && echo .before/)examples/hfserve/server.py $ARGS --kernels triton-mv --prefill-attn fused" \
  "step10=env HFSERVE_STEP_LOG=$OUT/steps_step10.log {python} examples/hfserve/server.py $ARGS --kernels triton-mv --prefill-attn fused-batched" \
  "step10lp={python} examples/hfserve/server.py $ARGS --kernels triton-mm --prefill-attn fused-batched --decode-attn lowp" \
  "step10kv=env HFSERVE_STEP_LOG=$OUT/steps_step10kv.log {python} examples/hfserve/server.py $ARGS --kernels triton-mm --prefill-attn fused-batched --decode-attn lowp --kv-cache-dtype fp8" \
  2>&1 | grep -E "ready|prefill:|decode:|throughput:|general:|rror" | tail -20
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_ab.json"
fi
# GATE=1 / GATE_ONLY=1: the accuracy gate on the GPU for step10kv's flags (the honest server; a dropped layer with
# them must still fail), then for step10lp's (honest only): which of the two roundings the gate keeps.
G="--max-batch-size 64 --max-model-len 4608 --prefill-pack 32768 --overlap-schedule on --kernels triton-mm \
--prefill-attn fused-batched --decode-attn lowp"
[ -z "${GATE:-}${GATE_ONLY:-}" ] || {
  log "accuracy gate, step10kv's flags"
  timeout $((LIMIT - (SECONDS - START) - 5)) python3 benchmarks/gpu/gate_demo.py "$M" --out "$OUT/gate_kv.json" \
    --flags "$G --kv-cache-dtype fp8" 2>&1 | tail -24
  log "accuracy gate, step10lp's flags"
  timeout $((LIMIT - (SECONDS - START) - 5)) python3 benchmarks/gpu/gate_demo.py "$M" --out "$OUT/gate_lp.json" \
    --honest-only --flags "$G" 2>&1 | tail -12; }
log done
