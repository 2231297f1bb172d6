# Sourced (after START=$SECONDS) by the one-command GPU scripts step8_run.sh, served_c_diag.sh, kv_capacity.sh:
# the environment, the carried wheels (.whl/) installed into /tmp/site, PYTHONPATH, OUT, log() and forge_7b
# (the forged 7b-peaked model's folder, forged once per machine: ~155 s on the H200).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD
log() { echo "[$((SECONDS-START))s] $*"; }
forge_7b() { python3 -c "from orchestrator.models.forge import cached_model; print(cached_model('7b-peaked'))" \
  2>"$OUT/forge.err" | tail -1; }
