"""Print an ib_baseline JSON's key numbers per server and scenario, one line each (for a command's output tail).

    python benchmarks/gpu/ab_summary.py ib_ab.json
"""

from __future__ import annotations

import json
import sys

KEYS = ("ttft_ms_p50", "ttft_ms_mean", "tpot_ms_p50", "tpot_ms_mean", "itl_ms_p50", "output_throughput",
        "request_throughput", "duration_s")


def lines(report: dict) -> list[str]:
    out = []
    for name, srv in report.get("servers", {}).items():
        for scen, s in (srv.get("scenarios") or {}).items():
            m = s.get("metrics") or {}
            vals = " ".join(f"{k}={m[k]:.4g}" for k in KEYS if isinstance(m.get(k), (int, float)))
            out.append(f"{name} {scen} ok={s.get('ok')} n={s.get('num_requests')} {vals}")
    return out


if __name__ == "__main__":
    print("\n".join(lines(json.loads(open(sys.argv[1]).read()))))
