#!/bin/bash
# Where C's burst goes on the H200 (issue 24), one command from the repository root: benchmarks/gpu/step11c_run.sh LIMIT_S
# Carry .whl (benchmarks/gpu/wheels.py). First mm_bench.py --glu-only (~80 s: gate/up + SwiGLU in one launch
# against today's two, per batch bucket; it prints MM_GLU_CONFIGS), then the 7B is forged (~155 s). C three times
# in a row per server (scenarios_c.toml: the launch spread side by side): step10lp's flags (lp1), the same with
# --mm-glu on (lpg: MM_GLU_CONFIGS as committed) and with --prefill-rounds 2 (lp2), each logging its decode steps
# and (HFSERVE_STEP_LOG's FILE.timeline) each job's arrival and each packed prefill pass with its wall and device
# time; then step10lp's flags under HFSERVE_PROFILE (lpprof: the kernel tables of the burst's packed prefill pass
# and of 10 batch-64 steps). step_gaps.py --client sets each burst's
# engine log beside the client's requests (ib_baseline.py's per-request clock): send, arrival, passes, steps, tokens.
set -u
START=$SECONDS
LIMIT=${1:-560}
. benchmarks/gpu/device_env.sh
log "gate/up + SwiGLU: one launch against two"
timeout 120 python3 benchmarks/gpu/mm_bench.py --glu-only --budget-s 60 --out "$OUT/glu.json" 2>&1 \
  | grep -E "GLU|SwiGLU|MmCfg|MM_GLU|rror" | tail -10
M=$(forge_7b)
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
C3=throughput,throughput_2,throughput_3
log "model $M; C x3: lp1, lpg, lp2 (steps and timeline logged), lpprof (profiled)"
left=$((LIMIT - (SECONDS - START) - 10))
timeout "$left" python3 benchmarks/gpu/ib_baseline.py "$M" --out "$OUT/ib_c.json" --no-naive --only "$C3" \
  --scenarios benchmarks/gpu/scenarios_c.toml --deadline-s $((left - 25)) --ours-min-s 45 \
  --server "lp1=env HFSERVE_STEP_LOG=$OUT/steps_lp1.log {python} examples/hfserve/server.py $ARGS $LP" \
  --server "lpg=env HFSERVE_STEP_LOG=$OUT/steps_lpg.log {python} examples/hfserve/server.py $ARGS $LP --mm-glu on" \
  --server "lp2=env HFSERVE_STEP_LOG=$OUT/steps_lp2.log {python} examples/hfserve/server.py $ARGS $LP --prefill-rounds 2" \
  --server "lpprof=env HFSERVE_PROFILE=$OUT/profile_lp.txt {python} examples/hfserve/server.py $ARGS $LP" \
  2>&1 | grep -E "ready|throughput|rror" | tail -16
cp -r /tmp/ib-baseline-* "$OUT/" 2>/dev/null
for v in lp1 lpg lp2; do echo "steps $v:"; python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log" --min-batch 32
  python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log" --client "$OUT/ib_c.json:$v"; done
head -24 "$OUT/profile_lp.txt.prefill" 2>/dev/null | cut -c1-60,100-200
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_c.json"
log done
