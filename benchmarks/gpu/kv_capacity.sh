#!/bin/bash
# Does the KV pool's capacity per slot slow C's batch-64 decode step? (issue 24), from the repository root:
#   benchmarks/gpu/kv_capacity.sh LIMIT_S
# The served C decoded at 8.4-8.7 ms per step (HFSERVE_STEP_LOG) where check_overlap.py's engine alone ran
# the same graph at 5.9 ms; the server's pool holds 4608 positions per slot (40 GB for 66 slots), the check's
# 704 (6 GB). check_overlap at capacities 704..4608, then the served C at --max-model-len 1024 (steps logged).
set -u
START=$SECONDS
LIMIT=${1:-400}
. benchmarks/gpu/device_env.sh
M=$(forge_7b)
log "model $M"
for cap in ${CAPS:-704 4608 1280 2304}; do
  timeout 90 python3 benchmarks/gpu/check_overlap.py "$M" --n 64 --reps 1 --max-model-len "$cap" \
    --out "$OUT/cap_$cap.json" 2>"$OUT/cap_$cap.err" | grep -v "^hfserve"; log "capacity $cap done"
done
FLAGS="--dtype bfloat16 --engine fast --cuda-graphs on --batching on --max-model-len ${SERVE_LEN:-1024} --kernels triton-mv --max-batch-size 64 --prefill-pack 32768 --prefill-attn fused --overlap-schedule on"
LEFT=$((LIMIT - (SECONDS - START) - 10))
HFSERVE_STEP_LOG=$OUT/steps_len.log timeout "$LEFT" python3 benchmarks/gpu/ib_baseline.py "$M" --out "$OUT/ib_c_len.json" \
  --no-naive --only throughput --deadline-s $((LEFT - 20)) --ours-min-s 30 \
  --server "len={python} examples/hfserve/server.py --model {model} --port {port} --device {device} --served-model-name {name} $FLAGS" \
  2>&1 | grep -E "throughput|ready" | tail -3
python3 benchmarks/gpu/step_gaps.py "$OUT/steps_len.log" --min-batch 32
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_c_len.json"
log done
