"""The flags a step script's next command serves: the fastest candidate server of an ib_baseline run, as the flags its
command adds to the reference server's.

    python3 benchmarks/gpu/pick_flags.py IB_JSON [--ref lp1] [--scenario throughput]

Each server other than ``--ref`` whose launches of ``--scenario`` (throughput, throughput_2, ...: C's repeats) all
passed is ranked by the median of their ``duration_s`` (a burst's wall time); the best one's "--flag value" pairs that
the reference's command lacks (ports and the like aside) are printed on one line (the ranking on stderr). So a second command on the same warm
machine can start at once, without a round trip here (``step12_show.sh 555 auto``). Exit 2 with one line when the
file is missing or no candidate has all its launches ok.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

PER_LAUNCH = {"--port", "--model", "--served-model-name", "--device"}  # differ per launch, not per engine


def pairs(command: str) -> list[tuple[str, str]]:
    """A server command's ("--flag", "value") pairs, in order (a flag without a value: value "")."""
    toks = shlex.split(command)
    out = []
    for i, t in enumerate(toks):
        if t.startswith("--"):
            nxt = toks[i + 1] if i + 1 < len(toks) else ""
            out.append((t, "" if nxt.startswith("--") else nxt))
    return out


def rank(report: dict, ref: str, scenario: str) -> list[tuple[float, str]]:
    """(median duration_s of ``scenario``'s launches, server) for every candidate whose launches all passed, best first."""
    out = []
    for name, srv in report.get("servers", {}).items():
        if name == ref:
            continue
        runs = [s for key, s in (srv.get("scenarios") or {}).items()
                if key == scenario or key.startswith(f"{scenario}_")]
        if runs and all(s.get("ok") and (s.get("metrics") or {}).get("duration_s") for s in runs):
            out.append((statistics.median(s["metrics"]["duration_s"] for s in runs), name))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", help="ib_baseline.py --out JSON")
    ap.add_argument("--ref", default="lp1", help="the server the others extend (default lp1)")
    ap.add_argument("--scenario", default="throughput", help="the scenario whose launches rank them (default C's)")
    args = ap.parse_args(argv)
    try:
        report = json.loads(Path(args.report).read_text())
    except (OSError, ValueError) as exc:
        print(f"pick_flags: {exc}", file=sys.stderr)
        return 2
    ranked = rank(report, args.ref, args.scenario)
    if not ranked:
        print(f"pick_flags: no server but {args.ref} has all its {args.scenario} launches ok in {args.report}",
              file=sys.stderr)
        return 2
    servers = report["servers"]
    base = set(pairs(servers[args.ref]["command"])) if args.ref in servers else set()
    best = ranked[0][1]
    extra = [p for p in pairs(servers[best]["command"]) if p not in base and p[0] not in PER_LAUNCH]
    print("pick_flags: " + ", ".join(f"{n} {d:.3f} s" for d, n in ranked), file=sys.stderr)
    print(" ".join(f"{f} {v}".strip() for f, v in extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
