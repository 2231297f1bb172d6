#!/bin/bash
# After engine step 9 on the H200 (issue 24), one command from the repository root:
#   benchmarks/gpu/step9b_run.sh LIMIT_S
# 1. Served C from this tree (overlap on, triton-mv) with HFSERVE_STEP_LOG and HFSERVE_PROFILE: the decode
#    steps' gaps and device busy/idle, the kernel table of 10 batch-64 steps, and (FILE.prefill) the table and
#    wall time of the burst's first large packed prefill: where C's remaining time goes.
# 2. B and C from three servers side by side in one ib_baseline run: step9 (triton-mv), step9mm (--kernels
#    triton-mm: the skinny Triton GEMM at batch 2..64 where hfkernels.MM_CONFIGS lists the shape) and step9r
#    (step9 launched again: the server-to-server spread). All with --overlap-schedule on.
set -u
START=$SECONDS
LIMIT=${1:-560}
. benchmarks/gpu/device_env.sh
M=$(forge_7b)
log "model $M; served C profiled"
FLAGS="--dtype bfloat16 --engine fast --cuda-graphs on --batching on --max-model-len 4608 --max-batch-size 64 --prefill-pack 32768 --prefill-attn fused --overlap-schedule on"
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
LEFT=$((LIMIT - (SECONDS - START) - 10))
HFSERVE_PROFILE=$OUT/profile.txt HFSERVE_STEP_LOG=$OUT/steps.log timeout "$LEFT" python3 benchmarks/gpu/ib_baseline.py "$M" \
  --out "$OUT/ib_c_prof.json" --no-naive --only throughput --deadline-s 100 --ours-min-s 30 \
  --server "prof={python} examples/hfserve/server.py $ARGS --kernels triton-mv" 2>&1 | grep -E "throughput|ready" | tail -3
python3 benchmarks/gpu/step_gaps.py "$OUT/steps.log" --min-batch 32
head -28 "$OUT/profile.txt.prefill" 2>/dev/null; head -22 "$OUT/profile.txt" 2>/dev/null
log "B, C: step9, step9mm, step9r"
ib_servers "$OUT/ib_ab.json" "${AB_ONLY:-decode,throughput}" 40 \
  "step9={python} examples/hfserve/server.py $ARGS --kernels triton-mv" \
  "step9mm={python} examples/hfserve/server.py $ARGS --kernels triton-mm" \
  "step9r={python} examples/hfserve/server.py $ARGS --kernels triton-mv" 2>&1 | grep -E "ready|throughput|decode|rror" | tail -12
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_ab.json"
log done
