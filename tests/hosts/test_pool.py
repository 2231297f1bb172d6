"""Two SSH hosts run one run's trials in parallel; one host dies mid-run and no trial is lost.

The store is PostgreSQL when INFERGOAL_TEST_PG_URL is set (`.ci/run` starts one), else SQLite.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from fake_target import write_fake_target
from sshd_server import SSHD, Sshd

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.hosts.registry import HostRegistry
from orchestrator.runs import start_run
from orchestrator.store import Store

pytestmark = pytest.mark.slow  # a whole run over two hosts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def second_sshd(tmp_path):
    if SSHD is None:
        pytest.skip("OpenSSH server not installed (apt-get install -y openssh-server; .ci/run does it)")
    server = Sshd.start(tmp_path / "sshd2")
    yield server
    server.stop()


def _sweep(workdir: Path) -> None:
    # The dead host's servers are still running on this machine: stop them through its hostd.
    if workdir.exists():
        subprocess.run([sys.executable, "-m", "orchestrator.remote.hostd", "--workdir", str(workdir), "clean", "--all"],
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, timeout=60)


def test_two_hosts_in_parallel_one_dies_and_no_trial_is_lost(tmp_path, sshd, second_sshd):
    state = tmp_path / ".infergoal"
    state.mkdir()
    (state / "known_hosts").write_text(sshd.known_hosts_line() + second_sshd.known_hosts_line())
    reg = HostRegistry(state)
    reg.add(sshd.spec("box1", workdir=tmp_path / "remote1"))
    reg.add(second_sshd.spec("box2", workdir=tmp_path / "remote2"))
    # Every candidate is slower than the baseline (4 ms): none is kept, so no paired A/B of a winner
    # follows the stop (6 more servers over SSH). The test is about the pool and the lost host.
    target = write_fake_target(tmp_path / "fake.toml", choices=(4.0, 7.0, 6.0, 5.0, 8.0, 7.5, 6.5, 5.5))
    # A short path: runs.proposer is VARCHAR(64) on PostgreSQL, and it holds "scripted:PATH".
    steps = Path(tempfile.mkdtemp(prefix="ig")) / "steps.json"
    steps.write_text(json.dumps([{"tpot_ms": v} for v in (7.5, 7.0, 6.5, 6.0, 5.5, 5.0, 8.0)]))
    db = os.environ.get("INFERGOAL_TEST_PG_URL", "")
    ws = Workspace(tmp_path, ['host="box1,box2"', f'target="{target}"', f'proposer="scripted:{steps}"',
                              "gates.accuracy=false", "gates.integrity=false", "bench.scale=0.5", "bench.timeout_s=5",
                              *([f'db="{db}"'] if db else [])])
    store = Store(ws.db_url)
    killed = threading.Event()
    done = threading.Event()

    def kill_box2_mid_trial():
        # Once box2 runs its first trial, its sshd dies: the host is gone mid-trial.
        while not done.wait(0.3):
            ours = [e for e in store.events(kind="trial.host") if e.data.get("host_name") == "box2"
                    and e.run_id == (store.latest_run().id if store.latest_run() else None)]
            if len(ours) >= 1:
                second_sshd.stop()
                killed.set()
                return

    watcher = threading.Thread(target=kill_box2_mid_trial, daemon=True)
    watcher.start()
    try:
        out = start_run(ws, parse_goal("beat the baseline by 90% on TPOT within 7 trials"))
    finally:
        done.set()
        watcher.join()
        _sweep(tmp_path / "remote2")
    assert killed.is_set(), "box2 must die mid-run for this test to mean anything"
    trials = store.list_trials(out.run_id)
    assert [t.number for t in trials] == list(range(len(trials))), "no trial lost, none duplicated"
    assert all(t.status in ("kept", "discarded", "failed") for t in trials), [(t.number, t.status) for t in trials]
    failed = [t for t in trials if t.status == "failed"]
    assert len(failed) == 1 and "box2" in failed[0].error, [(t.number, t.status, t.error) for t in trials]
    assert [e.message for e in store.events(out.run_id, kind="host.lost")][0].startswith("box2 left the pool")
    hosts = {e.trial_id: e.data["host_name"] for e in store.events(out.run_id, kind="trial.host")}
    assert set(hosts.values()) == {"box1", "box2"}, "both hosts ran trials"
    after = [t for t in trials if t.number > failed[0].number + 1]
    assert after and all(hosts.get(t.id) == "box1" for t in after), "the run went on with the host that was left"
    assert out.stop_reason.startswith(("BudgetExhausted", "ProposerExhausted")), out.stop_reason
    # Trials ran at the same time: some trial started before the previous one finished.
    spans = sorted((t.started_at, t.finished_at) for t in trials[1:] if t.started_at and t.finished_at)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)), spans
