"""The garbage collector's pauses inside served bursts, with and without ``--gc-freeze on`` (hfserve, CPU).

    python benchmarks/gc_pause.py [--bursts 8] [--requests 32] [--out gc_pause.json]

Two hfserve fast-engine servers on the forged tiny model (``--batching on --overlap-schedule on``), one with
``--gc-freeze on``, each given the same bursts (``--requests`` streaming requests of 64 prompt / 48 output tokens at
once, ``--bursts`` times, through benchmarks/gpu/ib_baseline.py: the project's bench, the real HTTP client) with
HFSERVE_STEP_LOG set; step_gaps.py reads back each burst's decode steps and the collector's passes of >= 1 ms
(the timeline's ``G`` lines). Per server: the full (generation-2) passes and their longest, every pass's total,
and each burst's longest step gap. Why it matters: on the H100 (2026-12-05) one C burst in three had a single
decode step of 211-277 ms with ~5 ms of the engine thread's CPU in it -- the thread waiting for the GIL -- which
is what a full pass over a served process's heap costs (~85 ms over 230k objects on this box's CPU with torch and
transformers imported, before any model). Ratios on this box only; the GPU's numbers come from the step scripts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import step_gaps  # noqa: E402

FLAGS = ("--engine fast --batching on --max-batch-size {n} --prefill-pack 4096 --overlap-schedule on "
         "--max-model-len 512 --dtype float32")


def scenarios(bursts: int, requests: int) -> str:
    """A scenarios file of ``bursts`` identical bursts (each its own seed)."""
    return "".join(f"[b{i}]\nprompt_tokens = 64\noutput_tokens = 48\nnum_requests = {requests}\n"
                   f"concurrency = {requests}\nwarmup_requests = 0\nseed = {i + 1}\n\n" for i in range(bursts))


def read(log: Path, requests: int) -> dict:
    """One server's bursts: each one's longest step gap and the collector's passes, and their totals."""
    bs = step_gaps.bursts(log.read_text()) if log.exists() else []
    tl_path = Path(f"{log}.timeline")
    tls = step_gaps.timelines(tl_path.read_text()) if tl_path.exists() else []
    rows = []
    for i, b in enumerate(bs):
        s = step_gaps.summary(b)
        if s["batch"] < requests // 2:
            continue
        gcs = tls[i]["gc"] if len(tls) == len(bs) else []
        rows.append({"gap_ms_p50": s["gap_ms_p50"], "gap_ms_max": s["gap_ms_max"],
                     "gc_full": [round(d, 1) for g, _, d in gcs if g == 2],
                     "gc_ms": round(sum(d for _, _, d in gcs), 1)})
    full = [d for r in rows for d in r["gc_full"]]
    return {"bursts": rows, "full_passes": len(full), "full_ms_max": max(full, default=0.0),
            "gc_ms_total": round(sum(r["gc_ms"] for r in rows), 1),
            "gap_ms_max": max((r["gap_ms_max"] for r in rows), default=None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--model", default="", help="model folder (default: the forged tiny model)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.model:
        model = Path(args.model)
    else:
        from orchestrator.models.forge import default_model

        model = default_model()
    work = Path(tempfile.mkdtemp(prefix="gc-pause-"))
    (work / "scen.toml").write_text(scenarios(args.bursts, args.requests))
    flags = FLAGS.format(n=args.requests)
    servers = []
    for name, extra in (("off", ""), ("on", " --gc-freeze on")):
        servers += ["--server", f"{name}=env HFSERVE_STEP_LOG={work}/steps_{name}.log {{python}} "
                    f"examples/hfserve --model {{model}} --port {{port}} --device {{device}} "
                    f"--served-model-name {{name}} {flags}{extra}"]
    cmd = [sys.executable, str(ROOT / "benchmarks/gpu/ib_baseline.py"), str(model), "--out", str(work / "ib.json"),
           "--no-naive", "--device", "cpu", "--scenarios", str(work / "scen.toml"), "--ours-min-s", "0",
           "--deadline-s", "900", *servers]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        print(f"gc_pause: ib_baseline failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return 1
    res = {"model": str(model), "bursts": args.bursts, "requests": args.requests, "flags": flags,
           **{name: read(work / f"steps_{name}.log", args.requests) for name in ("off", "on")}}
    for name in ("off", "on"):
        s = res[name]
        print(f"--gc-freeze {name}: {len(s['bursts'])} bursts, {s['full_passes']} full passes (longest "
              f"{s['full_ms_max']:.1f} ms), all passes {s['gc_ms_total']:.1f} ms, longest step gap {s['gap_ms_max']} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
