"""The served decode step time from a fast engine's HFSERVE_STEP_LOG file, per batch (the engine's side of C's ITL).

    python benchmarks/gpu/step_gaps.py STEP_LOG [--min-batch 64]

The log has one ``batch time`` line per decode step and ``end`` whenever the batch emptied (a burst over).
Per burst: steps, the steps at the burst's largest batch, and the median / mean gap between consecutive steps
at that batch (ms): what the device did per step plus any time it waited for the host.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def bursts(text: str) -> list[list[tuple[int, float]]]:
    out, cur = [], []
    for line in text.splitlines():
        if line.strip() == "end":
            if cur:
                out.append(cur)
            cur = []
        elif line.strip():
            n, t = line.split()
            cur.append((int(n), float(t)))
    if cur:
        out.append(cur)
    return out


def summary(burst: list[tuple[int, float]]) -> dict:
    top = max(n for n, _ in burst)
    ts = [t for n, t in burst if n == top]
    gaps = sorted(b - a for a, b in zip(ts, ts[1:], strict=False))
    return {"steps": len(burst), "batch": top, "steps_at_batch": len(ts),
            "gap_ms_p50": round(gaps[len(gaps) // 2] * 1000, 3) if gaps else None,
            "gap_ms_mean": round(sum(gaps) / len(gaps) * 1000, 3) if gaps else None,
            "span_s": round(burst[-1][1] - burst[0][1], 4)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--min-batch", type=int, default=1, help="only bursts whose largest batch is at least this")
    a = ap.parse_args(argv)
    for b in bursts(Path(a.log).read_text()):
        s = summary(b)
        if s["batch"] >= a.min_batch:
            print(json.dumps(s))


if __name__ == "__main__":
    main()
