#!/bin/bash
# Engine step 9 on the H200 (issue 24), one command from the repository root:
#   benchmarks/gpu/step9_run.sh LIMIT_S
# Step 9: a decode step's logprobs for every greedy row from one table (log-softmax, gather, top-k) read back
# with the ids in the step's one copy, instead of a log-softmax and a device->host read per row (the bench's and
# the gates' requests all ask for the chosen token's logprob: 64 of each per step at batch 64); the overlap
# schedule now runs for such requests too. Forges the 7B (cached while the machine stays warm), runs
# check_overlap.py with --logprobs 0 (engine only), then serves A-D from three servers side by side in one
# ib_baseline run: step8 = .before's hfserve (carried: `git archive af55305 examples/hfserve`) with the overlap
# schedule, step9a = this tree without it, step9 = this tree with it. Results in $OUT.
set -u
START=$SECONDS
LIMIT=${1:-560}
. benchmarks/gpu/device_env.sh
M=$(forge_7b)
log "model $M"
timeout 120 python3 benchmarks/gpu/check_overlap.py "$M" --n 64 --reps 1 --logprobs 0 --out "$OUT/check_overlap.json" \
  2>"$OUT/check_overlap.err" | grep -v "^hfserve"; grep -iE "error|Traceback" "$OUT/check_overlap.err" | head -5
log "served A-D: step8 (.before, overlap on), step9a (no overlap), step9"
FLAGS=${SERVE_FLAGS:-"--dtype bfloat16 --engine fast --cuda-graphs on --batching on --max-model-len 4608 --kernels triton-mv --max-batch-size 64 --prefill-pack 32768 --prefill-attn fused"}
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
ib_servers "$OUT/ib_ab.json" "${AB_ONLY:-prefill,decode,throughput,general}" 60 \
  "step8={python} .before/examples/hfserve/server.py $ARGS --overlap-schedule on" \
  "step9a={python} examples/hfserve/server.py $ARGS" \
  "step9={python} examples/hfserve/server.py $ARGS --overlap-schedule on" 2>&1 | tail -12
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_ab.json"
log done
