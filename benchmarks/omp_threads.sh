#!/usr/bin/env bash
# Is the hfserve example's speed stable beside other tenants? One server per line, the bench's
# throughput scenario at scale 0.5, alternating torch threads 1 / 0 (0 = torch's default: one
# OpenMP thread per core), each knob set twice. Run it beside whatever else the machine does.
#   bash benchmarks/omp_threads.sh            (from the repository root, with .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
M=${M:-$HOME/.cache/infergoal/models/tiny-seed0-v1}
PORT=${PORT:-45123}
run() { # threads decode_loop batching
  PYTHONPATH=$PWD $PY examples/hfserve --model "$M" --port $PORT --served-model-name tiny --dtype float32 \
    --decode-loop "$2" --batching "$3" --max-batch-size 8 --kv-cache dynamic --attn eager --threads "$1" >/dev/null 2>&1 &
  local sp=$!
  for _ in $(seq 120); do curl -s "localhost:$PORT/v1/models" >/dev/null && break; sleep 0.5; done
  PYTHONPATH=$PWD $PY -m orchestrator.bench --url "http://127.0.0.1:$PORT" --model tiny --scenario throughput --scale 0.5 \
    --tokenizer "$M" --json 2>/dev/null | $PY -c "import json,sys; m=json.load(sys.stdin); m=m.get('metrics',m); \
print('threads=$1 decode_loop=$2 batching=$3', round(m['output_throughput'],1), 'tok/s')"
  kill $sp; wait $sp 2>/dev/null || true
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in 1 2; do
  run 1 generate off; run 1 manual on; run 0 generate off; run 0 manual on
done
