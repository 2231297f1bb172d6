#!/bin/bash
# Engine steps 11, 12 and 13 measured and gated in ONE command on the H200 (issue 24), for a session whose device
# starts are scarce: step12_run.sh's sweeps with shorter budgets (steps 11 and 12 launch by launch), C three times in a
# row on step10lp's flags (lp1), with --mm-glu on --mm-norm on (lpn) and with --pdl on besides (lpnp, step 13) -- in
# that order, then with --gc-freeze on besides (lpnpg: the collector's stall, docs/benchmarks.md), so a cut loses
# those first -- then the accuracy gate on lpnp's flags (--pdl changes no arithmetic: a
# race would show there), on lpn's if lpnp's server did not start, and on lp1's (the same model) with the time left. From the repository root:
#   benchmarks/gpu/step12_one.sh LIMIT_S        (carry .whl: benchmarks/gpu/wheels.py)
# The sweeps' winners are pasted into this machine's hfkernels.py (paste them here from the JSONs with
# paste_tables.py). A-D with the winning flags: step12_show.sh (a second command). Each server's first line (its
# readiness, "[lpnp] ready in ...") is kept in $OUT/ib_c.ready.
set -u
START=$SECONDS
LIMIT=${1:-560}
. benchmarks/gpu/device_env.sh
log "gate/up + SwiGLU: one launch against two"
timeout 75 python3 benchmarks/gpu/mm_bench.py --glu-only --budget-s 30 --out "$OUT/glu.json" 2>&1 \
  | grep -E "GLU|SwiGLU|MmCfg|MM_GLU|rror" | tail -10
python3 benchmarks/gpu/paste_tables.py "$OUT/glu.json" | head -1
log "--mm-norm: the norms in the GEMMs' prologues, the residual adds in their epilogues"
timeout 100 python3 benchmarks/gpu/mm_bench.py --fuse-only --budget-s 45 --out "$OUT/fuse.json" 2>&1 \
  | grep -E "mm-norm|saves|MmCfg|MM_FUSE|rror" | tail -30
python3 benchmarks/gpu/paste_tables.py "$OUT/fuse.json" | head -1
M=$(forge_7b)
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
C3=throughput,throughput_2,throughput_3
log "model $M; C x3: lp1, lpn, lpnp, lpnpg (steps and timeline logged)"
S13="--mm-glu on --mm-norm on --pdl on"  # ~90 s kept after the C runs for the lpnp gate (IB_RESERVE_S)
IB_SCENARIOS=benchmarks/gpu/scenarios_c.toml IB_RESERVE_S=100 ib_servers "$OUT/ib_c.json" "$C3" 45 \
  "$(logged lp1 $LP)" "$(logged lpn $LP --mm-glu on --mm-norm on)" "$(logged lpnp $LP $S13)" \
  "$(logged lpnpg $LP $S13 --gc-freeze on)" 2>&1 | grep -E "ready|throughput|rror" | tee "$OUT/ib_c.ready" | tail -12
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_c.json"
cp examples/hfserve/hfkernels.py "$OUT/hfkernels_served.py"
GB=$(gate_batch)
G="--max-batch-size $GB --max-model-len 4608 --prefill-pack 32768 --overlap-schedule on $LP --mm-glu on --mm-norm on"
grep -q "lpnp.*ready" "$OUT/ib_c.ready" 2>/dev/null && G="$G --pdl on"
left=$((LIMIT - (SECONDS - START) - 5))
log "accuracy gate on '$G' (${left}s left)"
timeout $((left > 240 ? 150 : left)) python3 benchmarks/gpu/gate_demo.py "$M" --out "$OUT/gate_s12.json" --honest-only \
  --flags "$G" 2>&1 | tail -12
# Then step 10lp's own flags on the same model, where time is left (~70 s on the H100): the gate's figures of the steps
# against the step they extend, not against another machine's model.
left=$((LIMIT - (SECONDS - START) - 5))
if [ "$left" -gt 90 ]; then
  log "accuracy gate on step 10lp's flags, the same model (${left}s left)"
  timeout "$left" python3 benchmarks/gpu/gate_demo.py "$M" --out "$OUT/gate_lp1.json" --honest-only \
    --flags "--max-batch-size $GB --max-model-len 4608 --prefill-pack 32768 --overlap-schedule on $LP" 2>&1 | tail -3
  for g in gate_s12 gate_lp1; do python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['honest_fast_bf16']; m=r['metrics'] or {}
print(sys.argv[2], r['status'], {k: round(m[k], 6) for k in ('kl_mean', 'mean_abs_dlogprob', 'ppl_log_ratio', 'gen_nll_excess') if k in m})" \
      "$OUT/$g.json" "$g" 2>/dev/null; done
fi
for v in lp1 lpn lpnp lpnpg; do echo "steps $v:"; python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log" --min-batch 32; done
log done
