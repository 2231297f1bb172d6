#!/bin/bash
# One 10-minute command of the GPU run, on the device machine, from the repository root:
#   benchmarks/gpu/run_step.sh LIMIT_S [check] [steps] [ib] [demo] [profile] [noloop]
# Installs the carried wheels (.whl/), forges the 7b-peaked model (cached while the machine
# stays warm), optionally runs the engine check / speed of light, the per-engine-step profile
# (steps: profile_best.py --steps, table + plot; STEPS_ONLY=4,5 profiles those steps only), IB's baseline (ib: our server with IB_BEST_EXTRA,
# the naive server in its own IB_NAIVE_BUDGET_S window), the gate demo and the best trial's profile,
# then drives the loop (`infergoal goal $GOAL_FILE`, default goal.toml, or `resume` when the database has a
# run; FLOORS=sol.json turns the speed-of-light check on) until LIMIT_S
# minus a margin, and copies the database, logs and JSON results to $OUT.
set -u
START=$SECONDS
LIMIT=${1:-560}; shift
ROOT=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false GIT_PYTHON_REFRESH=quiet
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$ROOT
log() { echo "[$((SECONDS-START))s] $*"; }
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
log forge
# The cache key has no recipe in it: drop a cached 7b-peaked built with other training steps.
python3 -c "
import json, shutil
from orchestrator.models.forge import PRESETS, cache_root
for d in cache_root().glob('7b-peaked-*'):
    info = d / 'infergoal_model.json'
    if info.exists() and json.loads(info.read_text())['train_steps'] != PRESETS['7b-peaked'].train_steps:
        shutil.rmtree(d); print('dropped stale', d)
" 2>>"$OUT/step.log"
MODEL=$(python3 -c "from orchestrator.models.forge import cached_model; print(cached_model('7b-peaked'))" 2>>"$OUT/step.log" | tail -1)
log "model $MODEL"; cat "$MODEL/infergoal_model.json" 2>/dev/null | grep -E "loss|top1|build"
for what in "$@"; do
  case $what in
    check) log sol; python3 benchmarks/gpu/sol.py --config "$MODEL/config.json" --out "$OUT/sol.json" 2>>"$OUT/step.log" | tail -25
           log check; python3 benchmarks/gpu/check_engine.py "$MODEL" --out "$OUT/check.json" 2>>"$OUT/step.log" | tail -30 ;;
    demo) log demo; python3 benchmarks/gpu/gate_demo.py "$MODEL" --out "$OUT/gate_demo.json" 2>>"$OUT/step.log" | tail -40 ;;
    steps) log "profile per engine step (engine_steps.json): table + %-of-floor plot"
           timeout "${STEPS_TIMEOUT_S:-150}" python3 benchmarks/gpu/profile_best.py "$MODEL" \
             --steps benchmarks/gpu/engine_steps.json ${STEPS_ONLY:+--only "$STEPS_ONLY"} --out "$OUT/profile_steps.json" \
             --md "$OUT/profile_steps.md" --plot "$OUT/profile_steps.svg" 2>>"$OUT/step.log" | tail -30 ;;
    ib) log "ib baseline: our best setting and InferenceBench's naive server, full-size scenarios"
        python3 benchmarks/gpu/ib_baseline.py "$MODEL" --out "$OUT/ib_baseline.json" --headline "$OUT/headline.json" \
          --deadline-s "${IB_DEADLINE_S:-$((LIMIT - (SECONDS - START) - 60))}" --best-extra "${IB_BEST_EXTRA:-}" \
          --naive-budget-s "${IB_NAIVE_BUDGET_S:-200}" 2>>"$OUT/step.log" | tail -30 ;;
    profile) log profile; python3 benchmarks/gpu/profile_best.py "$MODEL" --db /root/g13ws/.infergoal/infergoal.db \
               --out "$OUT/profile.json" 2>>"$OUT/step.log" | tail -40 ;;
  esac
done
WS=/root/g13ws; mkdir -p "$WS/.infergoal"
if [ ! -f "$WS/.infergoal/infergoal.db" ] && [ -f "$ROOT/benchmarks/gpu/state/infergoal.db" ]; then
  cp "$ROOT/benchmarks/gpu/state/infergoal.db" "$WS/.infergoal/"; log "database restored from the carried copy"
fi
cat > "$WS/infergoal.toml" <<TOML
target = "$ROOT/examples/targets/hfserve_gpu.toml"
proposer = "search"
seed = 0
kb = "kb"
[bench]
repeats = 1
baseline_repeats = 1
timeout_s = 300
screen_fraction = ${SCREEN_FRACTION:-0.25}
scenarios = "$ROOT/benchmarks/gpu/scenarios.toml"
${FLOORS:+floors = \"$FLOORS\"}
TOML
RESERVE=0; case " $* " in *" post-demo "*) RESERVE=70 ;; esac
LEFT=$((LIMIT - (SECONDS - START) - 40 - RESERVE))
case " $* " in *" noloop "*) LEFT=0 ;; esac  # the steps only, no loop
cd "$WS"
HAS_RUN=$(python3 -c "import sqlite3; print(sqlite3.connect('.infergoal/infergoal.db').execute(\"select count(*) from runs where status != 'finished'\").fetchone()[0])" 2>/dev/null || echo 0)
if [ "$LEFT" -gt 60 ]; then
  if [ "$HAS_RUN" = "0" ]; then CMD=(goal "${GOAL_FILE:-$ROOT/benchmarks/gpu/goal.toml}" --name "${RUN_NAME:-h200-7b}"); else CMD=(resume); fi
  log "loop: infergoal ${CMD[*]} for ${LEFT}s"
  timeout -s INT -k 25 "$LEFT" python3 -m orchestrator.cli "${CMD[@]}" > "$OUT/loop.log" 2>&1
  log "loop exit $?"; tail -30 "$OUT/loop.log"
fi
python3 -m orchestrator.cli trials 2>&1 | tail -45
cp .infergoal/infergoal.db "$OUT/" 2>/dev/null
if [ "$RESERVE" -gt 0 ]; then
  cd "$ROOT"; log "demo: the accuracy gate on a dropped layer"
  timeout 65 python3 benchmarks/gpu/gate_demo.py "$MODEL" --dropped-only --out "$OUT/gate_demo.json" 2>>"$OUT/step.log" | tail -20
  cd "$WS"
fi
if grep -q "baseline trial failed" "$OUT/loop.log" 2>/dev/null; then  # say why, for the next command
  python3 - "$MODEL" <<'PY' 2>&1 | tail -8
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok("apple river seven quantum lamp", return_tensors="pt").input_ids.cuda()
for dt in (torch.bfloat16, torch.float16):
    m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=dt, device_map="cuda")
    lg = m(ids).logits
    out = m.generate(ids, max_new_tokens=6, do_sample=False)
    print(dt, "nan", bool(lg.isnan().any()), "absmax", float(lg.float().abs().max()), out[0, -6:].tolist(), repr(tok.decode(out[0, -6:])))
    del m; torch.cuda.empty_cache()
PY
fi
cp .infergoal/infergoal.db "$OUT/" 2>/dev/null
tar czf "$OUT/runs.tgz" --exclude='*.safetensors' .infergoal/runs 2>/dev/null
ls -la "$OUT"; log done
