"""What the SSH host adds to a trial, against the local host, on the same target.

    PYTHONPATH=.:tests python benchmarks/ssh_overhead.py [--rounds 3] [--trials 4] [--json out.json]

Starts a real sshd on a loopback port (tests/sshd_server.py: generated host and user keys), then
runs the same short goal on the torch-free fake target alternately on `--host local` and on the
SSH host (A B A B ...), and reads each trial's step timings back from the store. Loopback has no
network latency: the difference is what the SSH path itself costs (a session per host call, the
host-side agent's Python start-up, manifest sync, the measurement worker round trips), not a WAN.
The first trial of each SSH run also pays for shipping the code and the model once; it is
reported apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from fake_target import write_fake_target  # noqa: E402
from sshd_server import Sshd  # noqa: E402

from orchestrator.config.goal import parse_goal  # noqa: E402
from orchestrator.config.workspace import Workspace  # noqa: E402
from orchestrator.hosts.registry import HostRegistry  # noqa: E402
from orchestrator.runs import start_run  # noqa: E402
from orchestrator.store import Store  # noqa: E402

STEPS = ("sync", "deploy", "gates", "bench", "teardown", "trial")


def one_run(root: Path, sshd: Sshd | None, trials: int) -> list[dict]:
    root.mkdir(parents=True)
    target = write_fake_target(root / "fake.toml", choices=(8.0, 7.9))
    steps = root / "steps.json"
    steps.write_text(json.dumps([{"tpot_ms": 7.9}] * trials))
    extra = ['host="local"']
    if sshd is not None:
        state = root / ".infergoal"
        state.mkdir()
        (state / "known_hosts").write_text(sshd.known_hosts_line())
        HostRegistry(state).add(sshd.spec("box", workdir=root / "remote"))
        extra = ['host="box"']
    ws = Workspace(root, [f'target="{target}"', f'proposer="scripted:{steps}"', "gates.accuracy=false",
                          "gates.integrity=false", "bench.scale=0.5", "bench.baseline_repeats=1", *extra])
    out = start_run(ws, parse_goal(f"beat the baseline by 90% on TPOT within {trials} trials"))
    return [dict(t.timings) for t in Store(ws.db_url).list_trials(out.run_id)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--json", default="")
    a = p.parse_args()
    rows: dict[str, list[dict]] = {"local": [], "ssh": [], "ssh_first": []}
    with tempfile.TemporaryDirectory() as tmp:
        sshd = Sshd.start(Path(tmp) / "sshd")
        try:
            for r in range(a.rounds):
                rows["local"] += one_run(Path(tmp) / f"local{r}", None, a.trials)[1:]
                ssh = one_run(Path(tmp) / f"ssh{r}", sshd, a.trials)
                rows["ssh_first"].append(ssh[0])
                rows["ssh"] += ssh[1:]
        finally:
            sshd.stop()
    table = {kind: {s: statistics.median(t.get(s, 0.0) for t in ts) for s in STEPS} for kind, ts in rows.items()}
    print(f"median seconds per trial step ({a.rounds} rounds x {a.trials - 1} trials after the baseline)")
    print(f"{'step':10s} {'local':>8s} {'ssh':>8s} {'added':>8s} {'ssh 1st':>8s}")
    for s in STEPS:
        lo, ss, first = table["local"][s], table["ssh"][s], table["ssh_first"][s]
        print(f"{s:10s} {lo:8.3f} {ss:8.3f} {ss - lo:+8.3f} {first:8.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"median": table, "raw": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
