#!/bin/bash
# Where C's served decode step goes on the H200 (issue 24), one command from the repository root:
#   benchmarks/gpu/served_c_diag.sh LIMIT_S
# 1. engine_host_step.py on this host's CPUs (the real server and client, the GPU step a stub of --gpu-ms):
#    does the server's streaming of 64 streams keep up with a 5.9 ms step here, plain and overlapped?
# 2. mm_bench.py (random weights): the batch 16-64 GEMMs and decode attention configs against today's.
# 3. The 7B's served C from two servers (overlap on / off), each logging its decode steps (HFSERVE_STEP_LOG):
#    the engine's step gaps beside the client's ITL, and each graph step's own device time and the device's
#    wait before it; the "on" server also profiles 10 of its batch-64 steps (HFSERVE_PROFILE: kernel table).
#    NO_HOST=1 / NO_MM=1 skip parts 1 / 2.
set -u
START=$SECONDS
LIMIT=${1:-560}
. benchmarks/gpu/device_env.sh
[ -n "${NO_HOST:-}" ] || { log "host step (CPU, stub GPU)"; timeout 150 python3 benchmarks/engine_host_step.py --batch 64 1 --gpu-ms 5.9 4.1 --steps 128 --before examples/hfserve \
  --launch-us 20 --after-flags "--overlap-schedule on" --json "$OUT/host_step.json" 2>"$OUT/host_step.err" | tail -6; }
[ -n "${NO_MM:-}" ] || { log "mm_bench"; timeout 170 python3 benchmarks/gpu/mm_bench.py --out "$OUT/mm.json" \
  --budget-s "${MM_BUDGET_S:-110}" > "$OUT/mm.log" 2>&1; tail -45 "$OUT/mm.log"; }
M=$(forge_7b)
log "model $M; served C, overlap off then on, steps logged"
FLAGS="--dtype bfloat16 --engine fast --cuda-graphs on --batching on --max-model-len 4608 --kernels triton-mv --max-batch-size 64 --prefill-pack 32768 --prefill-attn fused"
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
LEFT=$((LIMIT - (SECONDS - START) - 10))
HFSERVE_PROFILE=$OUT/profile_on.txt HFSERVE_STEP_LOG=$OUT/steps_on.log timeout "$LEFT" python3 benchmarks/gpu/ib_baseline.py "$M" --out "$OUT/ib_c_on.json" \
  --no-naive --only throughput --deadline-s $((LEFT / 2 - 10)) --ours-min-s 30 \
  --server "on={python} examples/hfserve/server.py $ARGS --overlap-schedule on" 2>&1 | grep -E "throughput|ready" | tail -3
for v in on; do echo "steps $v:"; python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log" --min-batch 32; done; head -40 "$OUT/profile_on.txt" 2>/dev/null
LEFT=$((LIMIT - (SECONDS - START) - 10))
HFSERVE_STEP_LOG=$OUT/steps_off.log timeout "$LEFT" python3 benchmarks/gpu/ib_baseline.py "$M" --out "$OUT/ib_c_off.json" \
  --no-naive --only throughput --deadline-s $((LEFT - 25)) --ours-min-s 30 \
  --server "off={python} examples/hfserve/server.py $ARGS" 2>&1 | grep -E "throughput|ready" | tail -3
for v in off; do echo "steps $v:"; python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log" --min-batch 32; done
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_c_off.json"; python3 benchmarks/gpu/ab_summary.py "$OUT/ib_c_on.json"
cp -r /tmp/ib-baseline-* "$OUT/" 2>/dev/null
log done
