"""Gate time per trial: the integrity + accuracy gates of two source trees, measured interleaved.

    PYTHONPATH=.:tests/gates python benchmarks/gate_time.py --before ../infergoal-main --after . [--rounds 4] [--knobs "--batching on"] [--model DIR]

Starts one server of the demo target (examples/hfserve on the forge's tiny model, the
baseline knobs unless ``--knobs``), then alternates A B A B: each round runs, in a fresh
subprocess run in that tree (its ``gates`` package first on the import path), one warm-up gate pass (the
controller loads the reference once per run, so its load is not a trial's cost) and then the
timed integrity + accuracy checks of one trial. Prints one line per round and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from gate_servers import SERVER, free_port, model_name, spawn, stop, wait_healthy  # noqa: E402

# Runs inside the subprocess, in the tree under test: `python -c` puts its working directory first on the path.
_CHILD = """
import json, sys, time
from gates import accuracy, integrity
url, name, model = sys.argv[2], sys.argv[3], sys.argv[4]
accuracy.check(url, served_model=name, reference_model_dir=model)  # warm-up: reference load
t0 = time.perf_counter()
i = integrity.check(url, served_model=name, tokenizer_dir=model)
t1 = time.perf_counter()
a = accuracy.check(url, served_model=name, reference_model_dir=model)
t2 = time.perf_counter()
print(json.dumps({"integrity_s": t1 - t0, "accuracy_s": t2 - t1, "total_s": t2 - t0,
                  "status": [i.status, a.status], "accuracy_timing_s": a.details.get("timing_s"),
                  "integrity_checks_s": {c["name"]: round(c["duration_s"], 3) for c in i.details["checks"]}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", required=True, help="source tree whose gates/ is 'before'")
    ap.add_argument("--after", default=str(ROOT), help="source tree whose gates/ is 'after'")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--knobs", default="", help="extra server arguments, e.g. '--batching on'")
    ap.add_argument("--model", default="", help="model folder (default: the forge's tiny model); the 7B on the GPU")
    args = ap.parse_args()
    from orchestrator.models import forge

    model = Path(args.model) if args.model else Path(forge.default_model())
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = spawn([sys.executable, str(SERVER), "--model", str(model), "--port", str(port),
                      "--served-model-name", "tiny", *args.knobs.split()], Path(tmp) / "server.log")
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, Path(tmp) / "server.log")
            name = model_name(url)
            times: dict[str, list[float]] = {"before": [], "after": []}
            for rnd in range(args.rounds):
                for label in ("before", "after"):
                    tree = str(Path(getattr(args, label)).resolve())
                    out = subprocess.run([sys.executable, "-c", _CHILD, tree, url, name, str(model)],
                                         capture_output=True, text=True, check=True, cwd=tree).stdout
                    row = json.loads(out.strip().splitlines()[-1])
                    times[label].append(row["total_s"])
                    print(f"round {rnd} {label}: integrity {row['integrity_s']:.2f} s, accuracy "
                          f"{row['accuracy_s']:.2f} s, total {row['total_s']:.2f} s {row['status']}", flush=True)
                    print(f"    integrity checks {row['integrity_checks_s']}", flush=True)
                    if row.get("accuracy_timing_s"):  # trees that record where the accuracy gate's seconds go
                        print(f"    accuracy timing {json.dumps(row['accuracy_timing_s'])}", flush=True)
        finally:
            stop(proc)
    for label, ts in times.items():
        print(f"{label}: median gate time per trial {statistics.median(ts):.2f} s over {len(ts)} rounds")


if __name__ == "__main__":
    main()
