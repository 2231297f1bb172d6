#!/bin/bash
# The fifteenth H200 session's last command (issue 24), from the repository root: benchmarks/gpu/step10c_run.sh LIMIT_S
# After cuDNN was left out of fused-batched's calls (step10_run.sh PATTN=0 measured step10lp best at C): A-D from
# step10lp launched twice (the launch-to-launch spread of C) and "step10f" (this tree with step 9's flags, --prefill-attn
# fused: the arrival rule alone, for D's TTFT); then the accuracy gate on the GPU for step10lp's flags (honest), and
# for step10kv's (honest + a dropped layer) with what is left of LIMIT.
set -u
START=$SECONDS
LIMIT=${1:-560}
. benchmarks/gpu/device_env.sh
M=$(forge_7b)
log "model $M; A-D: step10lp, step10lp again, step10f"
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
ib_servers "$OUT/ib_ab.json" "prefill,decode,throughput,general" 60 \
  "step10lp={python} examples/hfserve/server.py $ARGS $LP" \
  "step10lp2=env HFSERVE_STEP_LOG=$OUT/steps_step10lp2.log {python} examples/hfserve/server.py $ARGS $LP" \
  "step10f=env HFSERVE_STEP_LOG=$OUT/steps_step10f.log {python} examples/hfserve/server.py $ARGS --kernels triton-mv --prefill-attn fused" \
  2>&1 | grep -E "ready|prefill:|decode:|throughput:|general:|rror" | tail -16
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_ab.json"
G="--max-batch-size 64 --max-model-len 4608 --prefill-pack 32768 --overlap-schedule on $LP"
log "accuracy gate, step10lp's flags"
timeout $((LIMIT - (SECONDS - START) - 5)) python3 benchmarks/gpu/gate_demo.py "$M" --out "$OUT/gate_lp.json" \
  --honest-only --flags "$G" 2>&1 | tail -12
log "accuracy gate, step10kv's flags"
timeout $((LIMIT - (SECONDS - START) - 5)) python3 benchmarks/gpu/gate_demo.py "$M" --out "$OUT/gate_kv.json" \
  --flags "$G --kv-cache-dtype fp8" 2>&1 | tail -24
log done
