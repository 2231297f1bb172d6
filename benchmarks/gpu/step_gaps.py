"""The served decode step time from a fast engine's HFSERVE_STEP_LOG file, per batch (the engine's side of C's ITL).

    python benchmarks/gpu/step_gaps.py STEP_LOG [--min-batch 64]

The log has one ``batch time thread_cpu [busy_ms idle_ms]`` line per decode step (the engine thread's CPU clock;
the device times with CUDA graphs) and
``end`` whenever the batch emptied (a burst over).
Per burst: steps, the steps at the burst's largest batch, and the median / mean gap between consecutive steps
at that batch (ms): what the device did per step plus any time it waited for the host.
With ``STEP_LOG.timeline`` beside it (the same engine's job arrivals ``J time`` and packed prefill passes
``P prompts tokens start end device_ms``, flushed with the same bursts) each burst also gets its timeline from
its first arrival: the arrivals' spread, every prefill pass (wall and device ms), the first and the last step, and
the garbage collector's passes of 1 ms or more (``G generation start ms``; ``gc_ms``: [generation, start, ms]).
``--client IB_JSON:LABEL`` sets each scenario of that ib_baseline.py report's server LABEL (its requests' clock)
beside the burst it made: from the client's first send to its last token, on the one clock of the host.
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
            f = line.split()
            cur.append((int(f[0]), *(float(x) for x in f[1:5])))
    if cur:
        out.append(cur)
    return out


def _p50(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return round(xs[len(xs) // 2], 3) if xs else None


def summary(burst: list[tuple]) -> dict:
    """The burst's step gaps at its largest batch, the engine thread's CPU time per step, and with device
    times (CUDA graphs) the graph's own time (busy) and the device's wait before each step (idle), ms."""
    top = max(r[0] for r in burst)
    at = [r for r in burst if r[0] == top]
    pairs = list(zip(at, at[1:], strict=False))
    gaps = [(b[1] - a[1]) * 1000 for a, b in pairs]
    out = {"steps": len(burst), "batch": top, "steps_at_batch": len(at), "gap_ms_p50": _p50(gaps),
           "gap_ms_mean": round(sum(gaps) / len(gaps), 3) if gaps else None,
           "gap_ms_max": round(max(gaps), 3) if gaps else None,
           "span_s": round(burst[-1][1] - burst[0][1], 4)}
    if all(len(r) >= 3 for r in at):
        out["engine_cpu_ms_p50"] = _p50([(b[2] - a[2]) * 1000 for a, b in pairs])
    if all(len(r) == 5 for r in at):
        out.update(busy_ms_p50=_p50([r[3] for r in at]), idle_ms_p50=_p50([r[4] for r in at[1:]]),
                   idle_ms_mean=round(sum(r[4] for r in at[1:]) / max(len(at) - 1, 1), 3))
    return out


def timelines(text: str) -> list[dict]:
    """The timeline file's bursts: arrivals (``J``) and packed prefill passes (``P``), one dict per ``end``."""
    out, cur = [], {"jobs": [], "passes": [], "gc": []}
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "end":
            out.append(cur)
            cur = {"jobs": [], "passes": [], "gc": []}
        elif f[0] == "J":
            cur["jobs"].append(float(f[1]))
        elif f[0] == "P":
            cur["passes"].append((int(f[1]), int(f[2]), float(f[3]), float(f[4]), float(f[5])))
        elif f[0] == "G":  # a garbage collector pass of >= 1 ms: generation, start, ms
            cur["gc"].append((int(f[1]), float(f[2]), float(f[3])))
    return out


def _pass_rows(passes: list[tuple], ms) -> list[dict]:
    """The timeline's prefill passes as rows: prompts, tokens, start (``ms(start)``), wall and device ms."""
    return [{"prompts": n, "tokens": k, "start_ms": ms(a), "wall_ms": round((b - a) * 1000, 2), "device_ms": d}
            for n, k, a, b, d in passes]


def timeline(burst: list[tuple], tl: dict) -> dict:
    """Where a burst's time went, ms from its first arrival: the arrivals' spread, each prefill pass (prompts,
    tokens, start, wall and device ms; device -1 off the GPU), the first step's start and the last one's."""
    t0 = min(tl["jobs"] + [p[2] for p in tl["passes"]] + [burst[0][1]])
    ms = lambda t: round((t - t0) * 1000, 2)  # noqa: E731
    return {"jobs": len(tl["jobs"]), "last_job_ms": ms(max(tl["jobs"])) if tl["jobs"] else None,
            "passes": _pass_rows(tl["passes"], ms),
            "prefill_wall_ms": round(sum(b - a for _, _, a, b, _ in tl["passes"]) * 1000, 2),
            "first_step_ms": ms(burst[0][1]), "last_step_ms": ms(burst[-1][1]),
            "gc_ms": [[g, ms(a), round(d, 2)] for g, a, d in tl.get("gc", [])]}


def joint(burst: list[tuple], tl: dict, clock: dict) -> dict:
    """A burst from both ends, ms after the client's start (ib_baseline.py's ``clock``; one host, one monotonic
    clock): the requests' sends, their arrivals at the engine, the prefill passes, the first step, the first step
    at the burst's largest batch, the last step, and the client's first tokens (first, median, last) and last token."""
    o = clock["origin_s"]
    ms = lambda t: round((t - o) * 1000, 2)  # noqa: E731
    got = lambda k: sorted(x for x in clock[k] if x is not None)  # noqa: E731
    sent, first, last = got("sent_ms"), got("first_ms"), got("last_ms")
    top = max(r[0] for r in burst)
    # Jobs that made no decode step (a scoring pass, a one-token request) are flushed with the next burst:
    # only what came after the client's start is this scenario's.
    jobs = [t for t in tl["jobs"] if t >= o]
    passes = [p for p in tl["passes"] if p[2] >= o]
    return {"sent_ms": [sent[0], sent[-1]] if sent else None,
            "arrived_ms": [ms(min(jobs)), ms(max(jobs))] if jobs else None,
            "passes": _pass_rows(passes, ms),
            "first_step_ms": ms(burst[0][1]), "top_batch": top,
            "top_first_step_ms": ms(next(r[1] for r in burst if r[0] == top)), "last_step_ms": ms(burst[-1][1]),
            "first_token_ms": [first[0], first[len(first) // 2], first[-1]] if first else None,
            "last_token_ms": last[-1] if last else None}


def client_bursts(bs: list[list[tuple]], tls: list[dict], scenarios: dict) -> list[dict]:
    """Each scenario of one server in an ib_baseline.py report that has a ``clock``, with the burst of the step log
    whose first step falls within its run (and its timeline): :func:`joint`. Scenarios without a burst are left out."""
    out = []
    for name, sc in scenarios.items():
        c = sc.get("clock") if isinstance(sc, dict) else None
        ends = [x for x in (c or {}).get("last_ms", []) if x is not None]
        if not c or not ends:
            continue
        lo, hi = c["origin_s"], c["origin_s"] + max(ends) / 1000
        for i, b in enumerate(bs):
            if lo <= b[0][1] <= hi and len(tls) == len(bs):
                out.append({"scenario": name, **joint(b, tls[i], c)})
                break
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--min-batch", type=int, default=1, help="only bursts whose largest batch is at least this")
    ap.add_argument("--client", metavar="IB_JSON:LABEL", help="also each scenario of server LABEL in that "
                    "ib_baseline.py report, from the client's start to its last token beside the engine's log")
    a = ap.parse_args(argv)
    tl_path = Path(f"{a.log}.timeline")
    tls = timelines(tl_path.read_text()) if tl_path.exists() else []
    if not Path(a.log).is_file():
        ap.error(f"no step log at {a.log} (the server's HFSERVE_STEP_LOG file)")
    bs = bursts(Path(a.log).read_text())
    if a.client:
        path, _, label = a.client.rpartition(":")
        try:
            report = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            ap.error(f"--client {a.client}: cannot read {path!r} as an ib_baseline.py report ({exc.__class__.__name__})")
        scen = (report.get("servers", {}).get(label) or {}).get("scenarios") if isinstance(report, dict) else None
        if not isinstance(scen, dict):
            ap.error(f"--client {a.client}: no server {label!r} in that report")
        for row in client_bursts(bs, tls, scen):
            print(json.dumps(row))
        return
    for i, b in enumerate(bs):
        s = summary(b)
        if s["batch"] >= a.min_batch:
            if len(tls) == len(bs):  # flushed together: the i-th of each is the same burst
                s["timeline"] = timeline(b, tls[i])
            print(json.dumps(s))


if __name__ == "__main__":
    main()
