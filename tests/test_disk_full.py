"""A full disk stops the run with a clear message and loses nothing; resume continues it.

Needs root to mount a tiny tmpfs for the workspace (skipped otherwise). The store sits on
another disk, as it would when only the artifacts' volume fills up.
"""

import errno
import json
import subprocess

import pytest
from fake_target import write_fake_target

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.runs import resume_run, start_run
from orchestrator.store import Store

pytestmark = pytest.mark.slow  # launches (fake) servers


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_stops_cleanly_and_resume_loses_nothing(small_fs, tmp_path, tiny_model):
    # A 4 ms baseline and slower candidates: each is discarded on its measurement, so no paired A/B
    # (three rounds, six more launches, ~14 s) follows the stop; the test judges the trials, not a speedup.
    target = write_fake_target(tmp_path / "fake.toml", choices=(4.0, 6.0, 5.0, 8.0))
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([{"tpot_ms": 6.0}, {"tpot_ms": 5.0}, {"tpot_ms": 8.0}]))
    ws = Workspace(small_fs, [f'target="{target}"', f'proposer="scripted:{steps}"', f'db="sqlite:///{tmp_path / "ig.db"}"',
                              f'kb="{tmp_path / "kb"}"', "gates.accuracy=false", "gates.integrity=false", "bench.scale=0.5"])
    goal = parse_goal("beat the baseline by 90% on TPOT within 4 trials")

    with pytest.raises(OSError) as e:
        start_run(ws, goal)
    assert e.value.errno == errno.ENOSPC and "free space, then `infergoal resume`" in str(e.value)
    store = Store(ws.db_url)
    run = store.latest_run()
    assert run.status == "stopped" and "disk full" in run.stop_reason
    before = store.list_trials(run.id)
    assert before and before[-1].status == "running", "the interrupted trial is left for resume"

    subprocess.run(["mount", "-o", "remount,size=16m", str(small_fs)], check=True)  # the user frees space
    out = resume_run(ws)
    trials = store.list_trials(run.id)
    assert [t.number for t in trials] == list(range(len(trials)))
    assert all(t.status in ("kept", "discarded") for t in trials)
    assert [t.knobs for t in trials[: len(before)]] == [t.knobs for t in before], "no trial lost or replaced"
    assert out.stop_reason.startswith(("ProposerExhausted", "BudgetExhausted"))
