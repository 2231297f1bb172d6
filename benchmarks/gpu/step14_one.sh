#!/bin/bash
# Engine step 14 (--gc-freeze on) and --prefill-rounds 2 on the card lent, with that card's own ceilings, in ONE
# command on a fresh machine (issue 24; the sweeps' tables come from an earlier command on the same kind of card,
# committed JSONs, so no sweep runs here). From the repository root:
#   benchmarks/gpu/step14_one.sh LIMIT_S "GLU.json FUSE.json"     (carry .whl: benchmarks/gpu/wheels.py)
# 1. sol.py: this card's copy bandwidth and bf16 matrix rate ($OUT/sol.json; C's floor re-floored from it by
#    headline.py's ib_floors). 2. The tables pasted, the 7B forged. 3. C three times in a row on step 13's flags +
#    --gc-freeze on (lpnpg) and with --prefill-rounds 2 besides (lpnpgr), step logs kept. 4. The accuracy gate on step
#    10lp's flags (lp1) and on step 13's (lpnp: --gc-freeze and --prefill-rounds change no arithmetic), the same
#    model, one after the other: the drift of the steps against the step they extend.
set -u
START=$SECONDS
LIMIT=${1:-540}
TABLES=${2:-}
. benchmarks/gpu/device_env.sh
log "this card's ceilings"
timeout 60 python3 benchmarks/gpu/sol.py --scenarios benchmarks/gpu/scenarios_ib.toml --out "$OUT/sol.json" \
  2>&1 | grep -E "_per_s|gpu|_ms|tok_s|rror" | head -8
for j in $TABLES; do python3 benchmarks/gpu/paste_tables.py "$j" | head -1; done
M=$(forge_7b)
S13="--mm-glu on --mm-norm on --pdl on"
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
C3=throughput,throughput_2,throughput_3
log "model $M; C x3: lpnpg, lpnpgr (~120 s kept for the two gates)"
IB_SCENARIOS=benchmarks/gpu/scenarios_c.toml IB_RESERVE_S=130 ib_servers "$OUT/ib_c.json" "$C3" 45 \
  "$(logged lpnpg $LP $S13 --gc-freeze on)" "$(logged lpnpgr $LP $S13 --gc-freeze on --prefill-rounds 2)" \
  2>&1 | grep -E "ready|throughput|rror" | tail -8
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_c.json"
GB=$(gate_batch)
G="--max-batch-size $GB --max-model-len 4608 --prefill-pack 32768 --overlap-schedule on $LP"
for g in lp1 lpnp; do
  left=$((LIMIT - (SECONDS - START) - 5))
  [ "$left" -lt 45 ] && { log "no time left for the $g gate"; continue; }
  extra=""; [ "$g" = lpnp ] && extra="$S13"
  log "accuracy gate $g: '$G $extra' (${left}s left)"
  timeout "$left" python3 benchmarks/gpu/gate_demo.py "$M" --out "$OUT/gate_$g.json" --honest-only \
    --flags "$G $extra" 2>&1 | grep -E "status|rror" | tail -2
done
for g in lp1 lpnp; do python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['honest_fast_bf16']; m=r['metrics'] or {}
print(sys.argv[2], r['status'], {k: round(m[k], 6) for k in ('kl_mean', 'mean_abs_dlogprob', 'ppl_log_ratio', 'gen_nll_excess') if k in m})" \
  "$OUT/gate_$g.json" "$g" 2>/dev/null; done
python3 benchmarks/gpu/gate_rejudge.py "$OUT/gate_lpnp.json" --baseline "$OUT/gate_lp1.json"  # the loop's verdict
for v in lpnpg lpnpgr; do echo "steps $v:"; python3 benchmarks/gpu/step_gaps.py "$OUT/steps_$v.log" --min-batch 32; done
log done
