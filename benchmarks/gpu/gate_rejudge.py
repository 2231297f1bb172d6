"""The loop's verdict on gate_demo.py results, on the CPU: each candidate judged against a baseline's gate runs.

    python benchmarks/gpu/gate_rejudge.py CAND.json [CAND.json ...] --baseline BASE.json [--baseline ...] [--json]

gate_demo.py prints the accuracy gate's verdict against the absolute limits of gates/thresholds.toml, which the
honest bf16 7B itself crosses (mean |dlogprob| 0.017-0.018 against the soft 0.015: "drift"). The loop judges a
candidate the way "without accuracy loss" reads: against what its baseline measured (gates.accuracy.soft_limits:
a soft limit is raised to the baseline's worst value x (1 + [accuracy.baseline] tolerance) where that is higher;
the hard limits stay absolute). This re-judges the stored metrics of each CAND (its ``honest_fast_bf16`` run) with
the metrics of the BASE runs as the baseline, through gates.accuracy.judge itself: one line per candidate
(``--json``: a list). Pass as the baseline the gate of the step a candidate extends, on the same model and card
(the GPU tool's step14 experiment gates lp1 and lpnp one after the other for this). Exit 2 with one line when a file
is missing or holds no honest server's metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

from gates import accuracy  # noqa: E402
from gates.thresholds import section  # noqa: E402

RUN = "honest_fast_bf16"


def metrics_of(path: str | Path) -> dict[str, float]:
    """The honest server's gate metrics stored in a gate_demo.py JSON (ValueError when there are none)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    m = (doc.get(RUN) or {}).get("metrics") if isinstance(doc, dict) else None
    if not m:
        raise ValueError(f"{path}: no '{RUN}' metrics (a gate_demo.py result with the honest server's run?)")
    return m


def rejudge(candidates: list[str | Path], baselines: list[str | Path],
            cfg: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each candidate's absolute verdict and the loop's (against ``baselines``), as gates.accuracy.judge gives them."""
    cfg = cfg if cfg is not None else section(None, "accuracy")
    base = [metrics_of(b) for b in baselines]
    out = []
    for c in candidates:
        m = metrics_of(c)
        absolute = accuracy.judge(m, cfg)
        loop = accuracy.judge(m, cfg, baseline=base)
        out.append({"candidate": str(c), "absolute": absolute[0], "loop": loop[0], "reason": loop[1],
                    "limits": {k: v[0] for k, v in accuracy.soft_limits(cfg, base).items()},
                    "baselines": [str(b) for b in baselines]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("candidates", nargs="+", help="gate_demo.py JSONs to judge")
    ap.add_argument("--baseline", action="append", required=True, help="gate_demo.py JSON of the baseline (repeatable)")
    ap.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    args = ap.parse_args(argv)
    try:
        res = rejudge(args.candidates, args.baseline)
    except ValueError as exc:
        print(f"gate_rejudge: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for r in res:
            print(f"{r['candidate']}: {r['loop']} against the baseline (absolute limits: {r['absolute']}) -- {r['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
