#!/bin/bash
# Prepared for the next H200 session (issue 24), from the repository root: benchmarks/gpu/step11_run.sh PART LIMIT_S
# Each part stands alone on a fresh machine (the 7B forged first, ~155 s); carry .whl (benchmarks/gpu/wheels.py).
# PART 1 (~440 s): mm_bench.py --attn-only --kv bf16,fp8 (no model: decode attention at batch 64 and 4 over both
#   pools, fp8 with and without the tiles widened in registers, AttnCfg.reg), then A-D from step10lp (this tree's
#   defaults: --prefill-rounds 1) and step10kvr (+ --kv-cache-dtype fp8 --decode-attn lowp-reg), C's steps logged.
# PART 2 (~430 s): A-D from step10kv (fp8, lowp: last session's fp8 path), step10lp2r (step10lp with
#   --prefill-rounds 2: the arrival rule, C and D) and step10kvr again (its launch spread), then the accuracy gate
#   on the GPU for step10kvr's flags (honest; a dropped layer failed with fp8's flags last session).
set -u
START=$SECONDS
PART=${1:?PART 1 or 2}
LIMIT=${2:-560}
. benchmarks/gpu/device_env.sh
KVR="--kernels triton-mm --prefill-attn fused-batched --decode-attn lowp-reg --kv-cache-dtype fp8"
if [ "$PART" = 1 ]; then
  log "decode attention over bf16 and fp8 pools"
  timeout 170 python3 benchmarks/gpu/mm_bench.py --attn-only --kv bf16,fp8 --budget-s 110 --out "$OUT/attn.json" \
    2>&1 | grep -E "attention|stage|ATTN|AttnCfg|rror" | tail -16
fi
M=$(forge_7b)
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
if [ "$PART" = 1 ]; then
  log "model $M; A-D: step10lp, step10kvr"
  ib_servers "$OUT/ib_ab.json" "prefill,decode,throughput,general" 60 \
    "step10lp=env HFSERVE_STEP_LOG=$OUT/steps_step10lp.log {python} examples/hfserve/server.py $ARGS $LP" \
    "step10kvr=env HFSERVE_STEP_LOG=$OUT/steps_step10kvr.log {python} examples/hfserve/server.py $ARGS $KVR" \
    2>&1 | grep -E "ready|prefill:|decode:|throughput:|general:|rror" | tail -10
else
  log "model $M; A-D: step10kv, step10lp2r, step10kvr"
  ib_servers "$OUT/ib_ab.json" "prefill,decode,throughput,general" 60 \
    "step10kv={python} examples/hfserve/server.py $ARGS --kernels triton-mm --prefill-attn fused-batched --decode-attn lowp --kv-cache-dtype fp8" \
    "step10lp2r={python} examples/hfserve/server.py $ARGS $LP --prefill-rounds 2" \
    "step10kvr=env HFSERVE_STEP_LOG=$OUT/steps_step10kvr.log {python} examples/hfserve/server.py $ARGS $KVR" \
    2>&1 | grep -E "ready|prefill:|decode:|throughput:|general:|rror" | tail -15
  log "accuracy gate, step10kvr's flags"
  timeout $((LIMIT - (SECONDS - START) - 5)) python3 benchmarks/gpu/gate_demo.py "$M" --out "$OUT/gate_kvr.json" \
    --honest-only --flags "--max-batch-size 64 --max-model-len 4608 --prefill-pack 32768 --overlap-schedule on $KVR" \
    2>&1 | tail -12
fi
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_ab.json"
log done
