#!/bin/bash
# Engine steps 11-14 served A-D on the card lent (scenarios_ib.toml, one launch each), side by side with step 10's
# knobs (lp), each server's step log kept. Fills the rows that served_steps_h200.toml lacks (steps 11-13 were served
# only on an H100) and measures B with --pdl since the batch-1 pause (e171d11; s13, s14: expected at lp's ~4.04 ms).
# Most wanted first: a run cut by its deadline skips the last servers. From the repository root (carry .whl):
#   benchmarks/gpu/served_steps_run.sh LIMIT_S
# Then here: one [[run]] per server in benchmarks/gpu/served_steps_h200.toml (step = knobs = 11..14, lp: knobs = 10
# on step 14's tree) and python benchmarks/gpu/served_steps.py --md ... --plot ... (its checks hold these commands:
# tests/examples/test_gpu_scripts.py).
set -u
START=$SECONDS
LIMIT=${1:-360}
. benchmarks/gpu/device_env.sh
M=$(forge_7b)
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
S11="--mm-glu on"
S12="$S11 --mm-norm on"
S13="$S12 --pdl on"
S14="$S13 --gc-freeze on --prefill-rounds 2"
log "model $M; A-D one launch each: s14, s13, lp, s12, s11"
ib_servers "$OUT/ib_steps.json" "" 40 "$(logged s14 $LP $S14)" "$(logged s13 $LP $S13)" "$(logged lp $LP)" \
  "$(logged s12 $LP $S12)" "$(logged s11 $LP $S11)" 2>&1 | grep -E "ready|prefill|decode:|throughput|general:|rror" | tail -24
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_steps.json"
for v in s14 s13 lp; do echo "steps $v:"; python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log" | tail -6; done
log done
