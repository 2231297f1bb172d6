#!/bin/bash
# Served A, B and C of two hfserve trees side by side in one ib_baseline run (issue 24), with the prefill
# rope_store kernel timed both ways first; on the device machine, from the repository root:
#   benchmarks/gpu/ab_served.sh BEFORE_DIR LIMIT_S [LABEL_BEFORE] [LABEL_AFTER]
# BEFORE_DIR holds the "before" tree's examples/hfserve (carried: no git on the device), e.g. made here with
#   echo /.before/ >> .git/info/exclude; rm -rf .before; mkdir .before; git archive REF examples/hfserve | tar -x -C .before
# Both servers get the same flags (SERVE_FLAGS, default the fifth/sixth sessions' best setting); the
# working tree's server runs second; AFTER_FLAGS are appended to its flags only (argparse: the last one
# wins), so BEFORE_DIR "." with AFTER_FLAGS="--kernels triton-mv" serves one tree two ways.
# Results in $OUT: rope_rows.json, ib_ab.json (+ the servers' logs).
set -u
START=$SECONDS
BEFORE=${1:?BEFORE_DIR}; LIMIT=${2:-230}; LB=${3:-main}; LA=${4:-new}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ls .whl/*.whl >/dev/null 2>&1 && { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"; }
export PYTHONPATH=/tmp/site:$PWD
log() { echo "[$((SECONDS-START))s] $*"; }
M=${MODEL:-$(python3 -c "from orchestrator.models.forge import cached_model; print(cached_model('7b-peaked'))" | tail -1)}
log "model $M"
[ -z "${NO_ROPE:-}" ] && timeout 40 python3 benchmarks/gpu/rope_rows.py --out "$OUT/rope_rows.json"
FLAGS=${SERVE_FLAGS:-"--dtype bfloat16 --engine fast --cuda-graphs on --batching on --max-model-len 4608 --kernels triton --max-batch-size 64 --prefill-pack 32768 --prefill-attn fused"}
ARGS="--model {model} --port {port} --device {device} --served-model-name {name} $FLAGS"
LEFT=$((LIMIT - (SECONDS - START) - 10))
log "served A, B, C: $LB ($BEFORE) then $LA, ${LEFT}s"
timeout "$LEFT" python3 benchmarks/gpu/ib_baseline.py "$M" --out "$OUT/ib_ab.json" --no-naive \
  --only "${AB_ONLY:-prefill,decode,throughput}" --deadline-s $((LEFT - 25)) --ours-min-s 60 ${AB_EXTRA:-} \
  --server "$LB={python} $BEFORE/examples/hfserve/server.py $ARGS" --server "$LA={python} examples/hfserve/server.py $ARGS ${AFTER_FLAGS:-}"
cp -r /tmp/ib-baseline-* "$OUT/" 2>/dev/null
log done
