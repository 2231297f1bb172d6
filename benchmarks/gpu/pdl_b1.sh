#!/bin/bash
# --pdl on at batch 1 (B, 512/512 c1) on the card lent: step 10lp's flags (lp), with --pdl on (lpp), and with --pdl on
# but no L2 prefetch of W before the wait (lpp0: HFSERVE_PDL_PREFETCH=0), one ib_baseline run, step logs kept (the
# graph's device time per step: step_gaps.py). From the repository root (carry .whl):
#   benchmarks/gpu/pdl_b1.sh LIMIT_S
set -u
START=$SECONDS
LIMIT=${1:-400}
. benchmarks/gpu/device_env.sh
M=$(forge_7b)
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
log "model $M; B: lp, lpp, lpp0"
ib_servers "$OUT/ib_b.json" decode 30 "$(logged lp $LP)" "$(logged lpp $LP --pdl on)" \
  "$(logged lpp0 HFSERVE_PDL_PREFETCH=0 $LP --pdl on)" 2>&1 | grep -E "ready|decode|rror" | tail -8
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_b.json"
for v in lp lpp lpp0; do echo "steps $v:"; python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log"; done
log done
