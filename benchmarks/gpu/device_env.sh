# Sourced (after START=$SECONDS and LIMIT) by the one-command GPU scripts (step8/9/9b/10_run.sh, served_c_diag.sh,
# kv_capacity.sh): the environment, the carried wheels (.whl/) installed into /tmp/site, PYTHONPATH, OUT, log(),
# forge_7b (the forged 7b-peaked model's folder, forged once per machine: ~155 s on the H200) and ib_servers.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD
log() { echo "[$((SECONDS-START))s] $*"; }
# The step scripts' servers: the 7B at batch 64 with the overlap schedule (FLAGS) and step 10lp's kernels (LP); each
# step adds its own flags after them.
FLAGS="--dtype bfloat16 --engine fast --cuda-graphs on --batching on --max-model-len 4608 --max-batch-size 64 --prefill-pack 32768 --overlap-schedule on"
LP="--kernels triton-mm --prefill-attn fused-batched --decode-attn lowp"
forge_7b() { python3 -c "from orchestrator.models.forge import cached_model; print(cached_model('7b-peaked'))" \
  2>"$OUT/forge.err" | tail -1; }
# ib_servers JSON ONLY MIN_S NAME=CMD...: the scenarios ONLY (e.g. prefill,decode,throughput,general; empty: all of the
# file's) from the servers side by side in one ib_baseline run over the model $M, within what is left of the script's
# LIMIT less IB_RESERVE_S (default 10: the seconds kept for what follows); IB_SCENARIOS: another scenarios file
# (default ib_baseline's scenarios_ib.toml). The servers' logs are copied to $OUT. The step scripts' A/B runs.
ib_servers() {
  local json=$1 only=$2 min_s=$3 left=$((LIMIT - (SECONDS - START) - ${IB_RESERVE_S:-10})) servers=()
  shift 3
  for s in "$@"; do servers+=(--server "$s"); done
  timeout "$left" python3 benchmarks/gpu/ib_baseline.py "$M" --out "$json" --no-naive ${only:+--only "$only"} \
    ${IB_SCENARIOS:+--scenarios "$IB_SCENARIOS"} --deadline-s $((left - 25)) --ours-min-s "$min_s" "${servers[@]}"
  cp -r /tmp/ib-baseline-* "$OUT/" 2>/dev/null
}
# logged NAME [VAR=VALUE ...] FLAGS...: ib_servers' NAME=CMD for hfserve over $ARGS (the script's) and FLAGS, its step
# log in $OUT/steps_${LOG_TAG}NAME.log (step_gaps.py reads it), with VAR=VALUE in its environment besides.
logged() {
  local name=$1 env=""
  shift
  while [ $# -gt 0 ] && [[ $1 != --* ]]; do env="$env $1"; shift; done
  echo "$name=env$env HFSERVE_STEP_LOG=$OUT/steps_${LOG_TAG:-}$name.log {python} examples/hfserve/server.py $ARGS $*"
}
# gate_batch: the server batch the accuracy gate runs at: 64, or 32 on a card under 100 GB (an H100: the float32
# reference, 28 GB, does not fit beside a batch-64 server, 54 GB).
gate_batch() {
  local mb
  mb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  if [ "${mb:-0}" -lt 100000 ]; then echo 32; else echo 64; fi
}
