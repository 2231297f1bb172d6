#!/bin/bash
# Trial turnaround on the GPU: one device command per part (docs/benchmarks.md, "Trial turnaround").
#   benchmarks/gpu/turnaround.sh deploy   # hfserve's deploy, from_pretrained vs safetensors, disk copy then /dev/shm copy
#   benchmarks/gpu/turnaround.sh gates    # gate time per trial, gates of .turnaround-before/ vs this tree
#   benchmarks/gpu/turnaround.sh same     # both loading paths on the GPU give the same logits (bf16 7B)
# The "before" gates: `mkdir -p .turnaround-before && git archive 8b099df gates | tar -x -C .turnaround-before`
# here before the run (an untracked folder travels with the tree). KNOBS overrides the server's knobs.
set -u
ROOT=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false GIT_PYTHON_REFRESH=quiet
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$ROOT
MODEL=$(python3 -c "from orchestrator.models.forge import cached_model; print(cached_model('7b-peaked'))" 2>>"$OUT/step.log" | tail -1)
echo "model $MODEL"
KNOBS=${KNOBS:---device cuda --dtype bfloat16}
case ${1:-deploy} in
  deploy)
    python3 benchmarks/deploy_time.py --model "$MODEL" --rounds 3 --knobs "$KNOBS" | tee "$OUT/deploy_disk.jsonl"
    SHM=$(python3 -c "
import sys, time
from orchestrator.hosts.modelcache import DEFAULT_ROOT, cached_copy
t = time.perf_counter(); p = cached_copy('$MODEL', DEFAULT_ROOT)
print(f'copy to {p}: {time.perf_counter() - t:.1f}s', file=sys.stderr); print(p)" 2> >(tee -a "$OUT/deploy_shm.txt" >&2))
    python3 benchmarks/deploy_time.py --model "$SHM" --rounds 3 --knobs "$KNOBS" | tee "$OUT/deploy_shm.jsonl" ;;
  same)
    python3 - "$MODEL" <<'PY' | tee "$OUT/same.txt"
import sys, time, torch
sys.path.insert(0, "examples/hfserve")
from loading import load_model
ids = torch.randint(4, 30000, (2, 300), generator=torch.Generator().manual_seed(0)).cuda()
out = {}
for how in ("fast", "hf", "fast"):
    m, path = load_model(sys.argv[1], dtype=torch.bfloat16, device="cuda", how=how)
    with torch.inference_mode():
        out.setdefault(how, []).append(m(ids).logits.float().cpu())
    del m; torch.cuda.empty_cache()
a, b = out["fast"][0], out["hf"][0]
print("logits equal:", torch.equal(a, b), "max |diff|:", float((a - b).abs().max()),
      "fast twice equal:", torch.equal(out["fast"][0], out["fast"][1]))
PY
    ;;
  gates)
    python3 benchmarks/gate_time.py --before .turnaround-before --after . --rounds 2 --model "$MODEL" \
      --knobs "$KNOBS" 2>>"$OUT/step.log" | tee "$OUT/gates.txt" ;;
esac
