#!/bin/bash
# The warm time-to-best run (issue #23), beside run_step.sh. On the device machine, from the repository root:
#   benchmarks/gpu/warm_run.sh LIMIT_S small   # forge $SMALL_PRESET; goal_4x on it, cold, for a fixed budget:
#                                              # the run ends on its budget, so the knowledge base (kb/) gets its finding
#                                              # (stopped by the limit's SIGINT instead, it still writes its best
#                                              # kept trial, unconfirmed: a `hypothesis` the big run reads at 0.6 weight)
#   benchmarks/gpu/warm_run.sh LIMIT_S big     # forge $BIG_PRESET; copy that kb into the big workspace; the big run
#                                              # warm (a second `big` command resumes it until it stops)
# Each command copies the databases, the small run's kb (kb_small/) and the time-to-best figures to $OUT.
# A fresh machine has no small workspace: the `big` step then takes the kb from $KB_FROM (default
# benchmarks/gpu/state/kb_small, the kb_small/ a `small` command sent back, carried as untracked files).
# Environment (defaults for the H200):
#   SMALL_PRESET=2b-peaked BIG_PRESET=7b-peaked   forge presets (orchestrator/models/forge.py)
#   TARGET=examples/targets/hfserve_gpu.toml      its `model` line is replaced by forge:<preset> per phase
#   GOAL_FILE=benchmarks/gpu/goal_4x.toml         the small run's copy gets `trials = $SMALL_TRIALS`, `wall = $SMALL_WALL`
#   SMALL_TRIALS=6 SMALL_WALL=(what the command's limit leaves, minus the paired confirmation at the stop)
#   BIG_TRIALS= (empty: the goal's own)  SCENARIOS=benchmarks/gpu/scenarios.toml (empty: the built-in ones)
#   BENCH_SCALE= FLOORS= (a sol.json: the speed-of-light check)  WS_ROOT=/root  PY=python3  REPEATS=1
#   The small run is cold (`kb_seed = false`: not even the shipped seed's H200 finding); the big run reads the seed
#   (knowledge_base/findings/h200-hfserve-2b-batched-graphs.md, the 2B's finding committed with its evidence) and the copied kb.
#   SCREEN_FRACTION=0.25 (bench.screen_fraction: multi-fidelity; 0 = off, as on 2026-12-02)
#   EXTRA_TOML= (lines appended to each infergoal.toml; the CPU dry run's fake target turns the gates off there)
#   HOST=local; HOST=ssh: the trials go through an SSH host on this machine's loopback (issue #23 item 6): the
#     carried OpenSSH server in .sshd/ (benchmarks/gpu/sshd_bundle.sh) is started for the command, registered
#     in the workspace and named by its infergoal.toml's `host`; stopped at the end, its log to $OUT/sshd.log
#     (benchmarks/gpu/ssh_host.sh: SSH_HOST_NAME, SSH_RUN, SSHD_BUNDLE, SSHD_LOGLEVEL)
set -u
START=$SECONDS
LIMIT=${1:-585}; PHASE=${2:-small}
ROOT=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
case $PY in */*) PY=$(realpath -s "$PY") ;; esac  # a path (PY=.venv/bin/python): absolute, the loop runs in its workspace
SMALL_PRESET=${SMALL_PRESET:-2b-peaked}; BIG_PRESET=${BIG_PRESET:-7b-peaked}
TARGET=${TARGET:-$ROOT/examples/targets/hfserve_gpu.toml}
GOAL_FILE=${GOAL_FILE:-$ROOT/benchmarks/gpu/goal_4x.toml}
SCENARIOS=${SCENARIOS-$ROOT/benchmarks/gpu/scenarios.toml}
WS_ROOT=${WS_ROOT:-/root}
KB_FROM=${KB_FROM:-$ROOT/benchmarks/gpu/state/kb_small}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false GIT_PYTHON_REFRESH=quiet
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 || echo "wheel install failed"
  export PYTHONPATH=/tmp/site:$ROOT; WHEELS_SITE=/tmp/site
else
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
log() { echo "[$((SECONDS-START))s] $*"; }
HOST=${HOST:-local}; HOST_LINE=
if [ "$HOST" = ssh ]; then
  . "$ROOT/benchmarks/gpu/ssh_host.sh"; trap ssh_host_down EXIT; HOST_LINE="host = \"$SSH_HOST_NAME\""
elif [ "$HOST" != local ]; then echo "HOST must be local or ssh" >&2; exit 2; fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

forge() {  # forge (or reuse) a preset; a cached build with other training steps is dropped first
  $PY - "$1" <<'PY' 2>>"$OUT/step.log" | tail -1
import json, shutil, sys
from orchestrator.models.forge import PRESETS, cache_root, cached_model
preset = sys.argv[1]
for d in cache_root().glob(f"{preset}-*"):
    info = d / "infergoal_model.json"
    if info.exists() and json.loads(info.read_text())["train_steps"] != PRESETS[preset].train_steps:
        shutil.rmtree(d); print("dropped stale", d, file=sys.stderr)
print(cached_model(preset))
PY
}

workspace() {  # workspace() DIR PRESET TRIALS WALL: target, goal and infergoal.toml of one phase
  local ws=$1 preset=$2 trials=$3 wall=$4
  mkdir -p "$ws/.infergoal"
  # the target's relative `source` is relative to its own folder: made absolute for the copy
  sed -e "s|^model = .*|model = \"forge:$preset\"|" -e "s|^name = \"\(.*\)\"|name = \"\1-$preset\"|" \
      -e "s|^source = \"\([^/][^\"]*\)\"|source = \"$(cd "$(dirname "$TARGET")" && pwd)/\1\"|" "$TARGET" > "$ws/target.toml"
  sed -e "${trials:+s/^trials = .*/trials = $trials/}" -e "${wall:+s/^wall = .*/wall = \"${wall}s\"/}" \
      "$GOAL_FILE" > "$ws/goal.toml"
  cat > "$ws/infergoal.toml" <<TOML
${HOST_LINE}
target = "$ws/target.toml"
proposer = "search"
seed = 0
kb = "kb"
kb_seed = ${KB_SEED:-true}
[bench]
repeats = ${REPEATS:-1}
baseline_repeats = ${REPEATS:-1}
timeout_s = 300
screen_fraction = ${SCREEN_FRACTION:-0.25}
${SCENARIOS:+scenarios = \"$SCENARIOS\"}
${BENCH_SCALE:+scale = $BENCH_SCALE}
${FLOORS:+floors = \"$FLOORS\"}
${EXTRA_TOML:-}
TOML
}

has_run() {  # a run of this workspace that has not finished (never creates the database)
  [ -f "$1/.infergoal/infergoal.db" ] || { echo 0; return; }
  (cd "$1" && $PY -c "import sqlite3; print(sqlite3.connect('.infergoal/infergoal.db').execute(\"select count(*) from runs where status != 'finished'\").fetchone()[0])" 2>/dev/null) || echo 0
}

loop() {  # loop WS NAME: `infergoal goal` (or `resume`) in WS until the command's limit minus a margin
  local ws=$1 name=$2 left=$((LIMIT - (SECONDS - START) - 45)) cmd
  if [ "$(has_run "$ws")" = "0" ]; then cmd=(goal "$ws/goal.toml" --name "$name"); else cmd=(resume); fi
  if [ "$left" -le 60 ]; then log "no time left for the loop ($left s)"; return; fi
  log "loop in $ws: infergoal ${cmd[*]} for ${left}s"
  (cd "$ws" && timeout -s INT -k 25 "$left" $PY -m orchestrator.cli "${cmd[@]}" > "$OUT/loop_$name.log" 2>&1)
  log "loop exit $?"; tail -25 "$OUT/loop_$name.log"
  (cd "$ws" && $PY -m orchestrator.cli trials 2>&1 | tail -30)
}

SMALL_WS=$WS_ROOT/ttb-small; BIG_WS=$WS_ROOT/ttb-big
case $PHASE in
  small)
    log "forge $SMALL_PRESET"; MODEL=$(forge "$SMALL_PRESET"); log "model $MODEL"
    grep -hE '"(final_loss|heldout_top1_prob|build_seconds)"' "$MODEL/infergoal_model.json" 2>/dev/null
    # The run should end on its own budget: its finding is then confirmed or refuted by the paired
    # rounds at the stop. Stopped by `timeout -s INT` in those rounds, it still writes its best kept
    # trial as an unconfirmed finding (orchestrator/runs.py; SIGKILL, 25 s later, writes nothing): its wall budget leaves room for
    # the paired confirmation of its winner at the stop (3 rounds of two fresh servers).
    WALL=${SMALL_WALL:-$((LIMIT - (SECONDS - START) - 45 - ${PAIRED_RESERVE_S:-200}))}
    # cold: its own (empty) kb only, not the shipped seed, which holds a GPU run's finding (knowledge_base/findings/h200-*)
    KB_SEED=false workspace "$SMALL_WS" "$SMALL_PRESET" "${SMALL_TRIALS:-6}" "$WALL"
    if [ "$HOST" = ssh ]; then ssh_host_up "$SMALL_WS" || exit 1; fi
    log "small run: $SMALL_PRESET, trials ${SMALL_TRIALS:-6}, wall ${WALL}s"; grep -E "^(trials|wall)" "$SMALL_WS/goal.toml"
    loop "$SMALL_WS" "small-cold-$SMALL_PRESET"
    ls -la "$SMALL_WS/kb" "$SMALL_WS"/kb/* 2>/dev/null | tail -12
    if ! ls "$SMALL_WS"/kb/findings/*.md >/dev/null 2>&1; then log "NO FINDING in $SMALL_WS/kb: the big run would start cold"; fi
    DB=$SMALL_WS/.infergoal/infergoal.db
    ;;
  big)
    log "forge $BIG_PRESET"; MODEL=$(forge "$BIG_PRESET"); log "model $MODEL"
    workspace "$BIG_WS" "$BIG_PRESET" "${BIG_TRIALS:-}" ""
    if [ ! -f "$BIG_WS/.infergoal/infergoal.db" ]; then  # a fresh big workspace: it starts from the small run's kb
      rm -rf "$BIG_WS/kb"
      if [ -d "$SMALL_WS/kb" ]; then cp -r "$SMALL_WS/kb" "$BIG_WS/kb"; log "kb copied from $SMALL_WS/kb"
      elif [ -d "$KB_FROM" ]; then cp -r "$KB_FROM" "$BIG_WS/kb"; log "kb copied from $KB_FROM (carried)"
      else log "no kb to copy (neither $SMALL_WS/kb nor $KB_FROM): the big run starts from the shipped seed's findings only"; fi
      find "$BIG_WS/kb" -name '*.md' 2>/dev/null | head
    fi
    if [ "$HOST" = ssh ]; then ssh_host_up "$BIG_WS" || exit 1; fi
    loop "$BIG_WS" "big-warm-$BIG_PRESET"
    DB=$BIG_WS/.infergoal/infergoal.db
    ;;
  *) echo "phase must be small or big" >&2; exit 2 ;;
esac
cp "$DB" "$OUT/${PHASE}_run.db" 2>/dev/null
# Where each deploy's seconds went (hfserve prints `hfserve: startup imports … engine … listen … total`, the
# engine part broken down as `hfserve: engine tokenizer … cuda … load … build … capture … total`, and
# `infergoal: standby` where the deploy ran in a pre-imported interpreter).
WS=$SMALL_WS; [ "$PHASE" = big ] && WS=$BIG_WS
grep -H "hfserve: startup\|hfserve: engine\|hfserve: captured\|hfserve: loaded\|infergoal: standby" "$WS"/.infergoal/runs/*/trial-*/server.log > "$OUT/startup_${PHASE}.txt" 2>/dev/null
# The end of every server log with a traceback (a failed trial's cause stays on the device otherwise).
for f in $(grep -l "Traceback" "$WS"/.infergoal/runs/*/trial-*/server.log 2>/dev/null); do echo "== $f"; tail -40 "$f"; done \
  > "$OUT/server_errors_${PHASE}.txt" 2>/dev/null
[ -d "$SMALL_WS/kb" ] && rm -rf "$OUT/kb_small" && cp -r "$SMALL_WS/kb" "$OUT/kb_small"
if [ -f "$DB" ]; then
  $PY benchmarks/gpu/time_to_best.py "$OUT/${PHASE}_run.db" --out "$OUT/headline_${PHASE}.json" 2>&1 | head -8
fi
ls -la "$OUT"; log done
