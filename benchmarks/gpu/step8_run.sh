#!/bin/bash
# Engine step 8 on the H200 (issue 24), one command from the repository root:
#   benchmarks/gpu/step8_run.sh LIMIT_S
# Forges the 7B (cached while the machine stays warm), runs check_overlap.py (engine only: the overlap
# schedule's step time and tokens), then serves A-D from three servers side by side in one ib_baseline run:
# step7 = .before's hfserve (carried: `git archive cd83eee examples/hfserve`, before the batched prefill
# attention), step8a = this tree without the overlap schedule, step8 = this tree with it. Same flags
# otherwise (SERVE_FLAGS). Results in $OUT: check_overlap.json, ib_ab.json, the servers' logs.
set -u
START=$SECONDS
LIMIT=${1:-560}
. benchmarks/gpu/device_env.sh
M=$(forge_7b)
log "model $M"
timeout 150 python3 benchmarks/gpu/check_overlap.py "$M" --n 64 --out "$OUT/check_overlap.json" 2>"$OUT/check_overlap.err" \
  | grep -v "^hfserve"; grep -iE "error|Traceback" "$OUT/check_overlap.err" | head -5
log "served A-D: step7 (.before), step8a (no overlap), step8"
FLAGS=${SERVE_FLAGS:-"--dtype bfloat16 --engine fast --cuda-graphs on --batching on --max-model-len 4608 --kernels triton-mv --max-batch-size 64 --prefill-pack 32768 --prefill-attn fused"}
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
ib_servers "$OUT/ib_ab.json" "${AB_ONLY:-prefill,decode,throughput,general}" 60 \
  "step7={python} .before/examples/hfserve/server.py $ARGS" \
  "step8a={python} examples/hfserve/server.py $ARGS" \
  "step8={python} examples/hfserve/server.py $ARGS --overlap-schedule on" 2>&1 | tail -12
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_ab.json"
log done
