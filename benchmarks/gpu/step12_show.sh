#!/bin/bash
# Issue 24's Show run on the H200, after step12_run.sh on the same warm machine (the 7B cached, hfkernels.py as it
# pasted the measured tables), from the repository root:
#   benchmarks/gpu/step12_show.sh LIMIT_S "EXTRA SERVER FLAGS"     e.g. "--mm-glu on --mm-norm on" (what won)
#   benchmarks/gpu/step12_show.sh LIMIT_S auto    right after step12_one.sh on the same warm machine (its files in
#     PREV, default /tmp/o2): its sweeps pasted again (each call copies this tree's hfkernels.py over the machine's),
#     EXTRA = pick_flags.py's fastest C server, and the gate skipped where step12_one.sh's ran. No round trip here:
#     the command can be sent the moment the first returns, before the machine goes back (30 s idle).
# 1. The accuracy gate on the GPU for step10lp's flags plus EXTRA (gate_demo.py --honest-only: its generation check
#    decodes at batch > 1, where --mm-glu and --mm-norm act). 2. A-D side by side (scenarios_show.toml: A and C three
#    launches each, in a row) on step10lp's flags (lp) and with EXTRA (s12); ab_summary per scenario, headline.py's
#    figures for s12 (A over its three launches: the median of the three p50s is the one to quote).
set -u
START=$SECONDS
LIMIT=${1:-560}
EXTRA=${2:-}
. benchmarks/gpu/device_env.sh
PREV=${PREV:-/tmp/o2}
GATE=1
if [ "$EXTRA" = auto ]; then
  for j in "$PREV/glu.json" "$PREV/fuse.json"; do [ -f "$j" ] && python3 benchmarks/gpu/paste_tables.py "$j" | head -1; done
  EXTRA=$(python3 benchmarks/gpu/pick_flags.py "$PREV/ib_c.json") || EXTRA="--mm-glu on --mm-norm on --pdl on"
  [ -f "$PREV/gate_s12.json" ] && GATE=0
  log "auto: EXTRA='$EXTRA', gate $([ $GATE = 1 ] && echo here || echo "was step12_one's")"
fi
M=$(forge_7b)
GB=$(gate_batch)
G="--max-batch-size $GB --max-model-len 4608 --prefill-pack 32768 --overlap-schedule on $LP $EXTRA"
log "model $M; accuracy gate, step10lp's flags + '$EXTRA'"
[ "$GATE" = 1 ] && timeout 200 python3 benchmarks/gpu/gate_demo.py "$M" --out "$OUT/gate_s12.json" --honest-only \
  --flags "$G" 2>&1 | tail -12
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
log "A-D (A, C x3): lp, s12"
IB_SCENARIOS=benchmarks/gpu/scenarios_show.toml ib_servers "$OUT/ib_show.json" "" 90 \
  "$(LOG_TAG=show_ logged lp $LP)" "$(LOG_TAG=show_ logged s12 $LP $EXTRA)" 2>&1 \
  | grep -E "ready|prefill|decode:|throughput|general:|rror" | tail -20
python3 benchmarks/gpu/ab_summary.py "$OUT/ib_show.json"
log done
