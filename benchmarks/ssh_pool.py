"""Wall time of one run's trials on a pool of two SSH hosts against one SSH host.

    PYTHONPATH=.:tests python benchmarks/ssh_pool.py [--rounds 2] [--trials 7] [--json out.json]

Two real sshd on loopback ports stand for two GPU boxes (tests/sshd_server.py). The same scripted
run (the torch-free fake target, whose speed is a knob and whose time is spent waiting, not
computing) goes once on `box1` and once on `box1,box2`, alternately; the wall time of each
session (from the store's `session` event) is compared for the same number of trials. The
baseline runs alone in both cases (every verdict needs it), so the best possible ratio is below 2.
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

VALUES = (7.5, 7.0, 6.5, 6.0, 5.5, 5.0, 4.5, 7.8, 7.6, 7.4)


def one_run(root: Path, servers: list[Sshd], hosts: str, trials: int) -> tuple[float, int]:
    root.mkdir(parents=True)
    state = root / ".infergoal"
    state.mkdir()
    (state / "known_hosts").write_text("".join(s.known_hosts_line() for s in servers))
    for i, s in enumerate(servers, 1):
        HostRegistry(state).add(s.spec(f"box{i}", workdir=root / f"remote{i}"))
    target = write_fake_target(root / "fake.toml", choices=(8.0, *VALUES))
    steps = root / "steps.json"
    steps.write_text(json.dumps([{"tpot_ms": v} for v in VALUES[: trials - 1]]))
    ws = Workspace(root, [f'host="{hosts}"', f'target="{target}"', f'proposer="scripted:{steps}"',
                          "gates.accuracy=false", "gates.integrity=false", "bench.scale=0.5",
                          "bench.baseline_repeats=1"])
    out = start_run(ws, parse_goal(f"beat the baseline by 95% on TPOT within {trials} trials"))
    store = Store(ws.db_url)
    wall = [e.data["wall_s"] for e in store.events(out.run_id, kind="session")][-1]
    return wall, len(store.list_trials(out.run_id))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--json", default="")
    a = p.parse_args()
    walls: dict[str, list[float]] = {"one": [], "two": []}
    with tempfile.TemporaryDirectory() as tmp:
        servers = [Sshd.start(Path(tmp) / f"sshd{i}") for i in (1, 2)]
        try:
            for r in range(a.rounds):
                for kind, hosts in (("one", "box1"), ("two", "box1,box2")):
                    wall, n = one_run(Path(tmp) / f"{kind}{r}", servers, hosts, a.trials)
                    assert n == a.trials, f"{kind}: {n} trials"
                    walls[kind].append(wall)
                    print(f"round {r} {kind:3s} host(s): {n} trials in {wall:6.1f} s", flush=True)
        finally:
            for s in servers:
                s.stop()
    one, two = statistics.median(walls["one"]), statistics.median(walls["two"])
    print(f"median wall: one host {one:.1f} s, two hosts {two:.1f} s, speedup {one / two:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(walls, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
