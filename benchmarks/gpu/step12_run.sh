#!/bin/bash
# Engine steps 11 and 12 measured on the H200 (issue 24), one command from the repository root:
#   benchmarks/gpu/step12_run.sh LIMIT_S        (carry .whl: benchmarks/gpu/wheels.py)
# 1. mm_bench.py --glu-only (--mm-glu's launch against today's two, per row bucket), its winners pasted into this
#    machine's hfkernels.py (paste_tables.py); 2. mm_bench.py --fuse-only (--mm-norm's launches against today's, at
#    16 and 64 rows), pasted the same way: the servers below serve the launches just measured (the log prints the
#    tables: paste them here from the JSONs with the same tool). 3. The 7B forged (~155 s). 4. C three times in a row
#    (scenarios_c.toml) on step10lp's flags (lp1), with --mm-glu on (lpg) and with --mm-norm on --mm-glu on (lpn),
#    each logging its steps and (FILE.timeline) the arrivals and prefill passes; step_gaps.py per burst, and the
#    client's view beside it (--client).
set -u
START=$SECONDS
LIMIT=${1:-560}
. benchmarks/gpu/device_env.sh
log "gate/up + SwiGLU: one launch against two"
timeout 90 python3 benchmarks/gpu/mm_bench.py --glu-only --budget-s 45 --out "$OUT/glu.json" 2>&1 \
  | grep -E "GLU|SwiGLU|MmCfg|MM_GLU|rror" | tail -10
python3 benchmarks/gpu/paste_tables.py "$OUT/glu.json" | head -1
log "--mm-norm: the norms in the GEMMs' prologues, the residual adds in their epilogues"
timeout 120 python3 benchmarks/gpu/mm_bench.py --fuse-only --budget-s 65 --out "$OUT/fuse.json" 2>&1 \
  | grep -E "mm-norm|saves|MmCfg|MM_FUSE|rror" | tail -30
python3 benchmarks/gpu/paste_tables.py "$OUT/fuse.json" | head -1
M=$(forge_7b)
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
C3=throughput,throughput_2,throughput_3
log "model $M; C x3: lp1, lpg, lpn (steps and timeline logged)"
left=$((LIMIT - (SECONDS - START) - 10))
timeout "$left" python3 benchmarks/gpu/ib_baseline.py "$M" --out "$OUT/ib_c.json" --no-naive --only "$C3" \
  --scenarios benchmarks/gpu/scenarios_c.toml --deadline-s $((left - 25)) --ours-min-s 45 \
  --server "lp1=env HFSERVE_STEP_LOG=$OUT/steps_lp1.log {python} examples/hfserve/server.py $ARGS $LP" \
  --server "lpg=env HFSERVE_STEP_LOG=$OUT/steps_lpg.log {python} examples/hfserve/server.py $ARGS $LP --mm-glu on" \
  --server "lpn=env HFSERVE_STEP_LOG=$OUT/steps_lpn.log {python} examples/hfserve/server.py $ARGS $LP --mm-glu on --mm-norm on" \
  2>&1 | grep -E "ready|throughput|rror" | tail -12
cp -r /tmp/ib-baseline-* "$OUT/" 2>/dev/null
for v in lp1 lpg lpn; do echo "steps $v:"; python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log" --min-batch 32
  python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log" --client "$OUT/ib_c.json:$v"; done
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_c.json"
cp examples/hfserve/hfkernels.py "$OUT/hfkernels_served.py"
log done
