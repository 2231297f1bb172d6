"""`infergoal shell` driven through a real pseudo-terminal (pexpect): start a goal, watch its
status, approve a trial, stop the run, resume it to the end; history and Tab completion work."""

import json
import os
import signal
import sys

import pytest
from fake_target import write_fake_target
from review_runs import add_measurements, build_run

from orchestrator.core.roles import LOOP_ADDED
from orchestrator.store import Store

pexpect = pytest.importorskip("pexpect")

PROMPT = "infergoal> "


@pytest.fixture
def shell(tmp_path, tiny_model):
    state = tmp_path / ".infergoal"
    state.mkdir()
    store = Store(f"sqlite:///{state / 'infergoal.db'}")
    build_run(store, state)  # run 1: finished, trial #9 waits for approval
    store.close()
    # Trial #1 (tpot 6 ms) does not come up while `hold` exists: the run is surely still going when
    # the test asks /status and /stop, however fast the machine is (a quiet one finished it first).
    hold = tmp_path / "hold"
    target = write_fake_target(tmp_path / "fake.toml", choices=(8.0, 6.0, 4.0, 7.9), ready_timeout_s=300,
                               extra_launch=f"{{% if tpot_ms == 6.0 %}} --hold-while {hold} {{% endif %}}")
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([{"tpot_ms": 6.0}, {"tpot_ms": 4.0}]))
    args = ["-m", "orchestrator.cli", "-w", str(tmp_path), "-o", f'target="{target}"', "-o", f'proposer="scripted:{steps}"',
            "-o", "gates.accuracy=false", "-o", "gates.integrity=false", "-o", "bench.scale=0.5", "-o", "bench.timeout_s=3",
            "shell"]
    child = pexpect.spawn(sys.executable, args, cwd=str(tmp_path), encoding="utf-8", timeout=180,
                          dimensions=(40, 200), env={"TERM": "dumb", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                                     "INFERGOAL_CACHE": str(tiny_model.parent.parent), "PYTHONPATH": ":".join(sys.path),
                                                     "INFERGOAL_LEASE_DIR": os.environ["INFERGOAL_LEASE_DIR"]})
    child.logfile_read = (tmp_path / "pty.log").open("w")  # what the terminal showed, for a failing run
    child.expect_exact(PROMPT)
    yield child, tmp_path
    if child.isalive():
        child.sendline("/quit")
        child.expect(pexpect.EOF, timeout=120)


@pytest.mark.slow  # launches (fake) servers
def test_goal_status_approve_stop_resume(shell):
    child, root = shell
    child.sendline("/run 1")
    child.expect_exact("run 1 finished")
    child.sendline("/approve 9")
    child.expect_exact("trial #9: kept")
    child.sendline("/why 9")
    child.expect(r"#9 kept \(decided by approval\): approved by \S+ at ")
    (root / "hold").touch()
    child.sendline("/goal beat the baseline by 40% on TPOT within 8 trials")
    child.expect_exact("run 2 started")
    child.expect(r"#0 measured 1\.000x")  # the baseline: measured, not kept
    child.sendline("/status")
    child.expect(r"run 2 running: \d+ of \S+ trials.*\[background: running\]")
    child.expect_exact(PROMPT)
    child.sendintr()  # Ctrl-C at the prompt clears the line; the background run goes on
    child.expect_exact("/quit leaves the shell, /stop stops the run")
    child.sendline("/status")
    child.expect(r"run 2 running: .*\[background: running\]")
    child.sendline("/stop")
    child.expect(r"run 2 stopped; /resume continues it")
    store = Store(f"sqlite:///{root / '.infergoal' / 'infergoal.db'}")
    assert store.get_run(2).status == "stopped"
    assert [t.number for t in store.list_trials(2) if t.status == "kept"] == [0], "stopped while #1 was coming up"
    (root / "hold").unlink()
    child.sendline("/resume")
    child.expect(r"#\d+ kept \d\.\d+x tpot_ms=4\.0", timeout=240)  # 8 -> 4 ms: about 2x
    child.expect(r"run 2 finished: (GoalMet|ProposerExhausted)", timeout=240)
    run = store.get_run(2)
    trials = store.list_trials(2)
    # The proposer's sequence; a sentinel the loop adds when the shared host's load moves is not part of it.
    own = [t for t in trials if t.proposer not in LOOP_ADDED]
    assert run.status == "finished" and [t.knobs["tpot_ms"] for t in own[:3]] == [8.0, 6.0, 4.0]
    assert len({t.number for t in trials}) == len(trials), "no trial duplicated by the stop/resume"
    kinds = [(e.kind, (e.data or {}).get("who")) for e in store.events() if e.kind in ("approve", "stop.request")]
    assert [k for k, _ in kinds] == ["approve", "stop.request"] and all(who for _, who in kinds)
    # Tab completes commands and trial numbers; the history is kept
    child.send("/wh\t")
    child.expect_exact("/why")
    child.send(" \t")  # trial numbers of run 2: several, so nothing is inserted; type one
    child.sendline("2")
    child.expect(r"#2 kept \(decided by ")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    history = (root / ".infergoal" / "shell_history").read_text()
    assert "/goal beat the baseline by 40% on TPOT within 8 trials" in history and "/approve 9" in history


def _prompt_only(tmp_path, **kw):
    """The shell over a real pty on `tmp_path`, no server, no run going."""
    return pexpect.spawn(sys.executable, ["-m", "orchestrator.cli", "-w", str(tmp_path), "shell"], cwd=str(tmp_path),
                         encoding="utf-8", timeout=60, dimensions=(40, 200),
                         env={"TERM": "dumb", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": ":".join(sys.path),
                              "INFERGOAL_LEASE_DIR": os.environ["INFERGOAL_LEASE_DIR"]}, **kw)


def test_prompt_completion_history_and_audit_without_a_run_going(tmp_path):
    # No server: the prompt alone, over a real pty, on a finished run with a trial waiting.
    state = tmp_path / ".infergoal"
    state.mkdir()
    store = Store(f"sqlite:///{state / 'infergoal.db'}")
    build_run(store, state)
    # Started with SIGINT ignored, as from a background job: Ctrl-C at the prompt still works.
    child = _prompt_only(tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    child.expect_exact(PROMPT)
    child.sendintr()
    child.expect_exact("/quit leaves the shell, /stop stops the run")
    child.expect_exact(PROMPT)
    child.send("/ap\t")
    child.expect_exact("/approve")  # completed from "/ap"
    child.sendline(" 9")
    child.expect_exact("trial #9: kept")
    child.sendline("/why 3")
    child.expect_exact("#3 discarded (decided by threshold): discarded: score 1.270x did not beat the threshold 1.299x")
    child.sendline("/why")
    child.expect_exact("run 1 finished: GoalMet")
    child.sendline("/steer leave the dtype alone")
    child.expect_exact("noted for run 1")
    child.sendline("/reject 2")
    child.expect_exact("is not waiting for approval (status: kept)")
    child.sendline("/bogus")
    child.expect_exact("unknown command 'bogus'")
    child.sendeof()
    child.expect(pexpect.EOF)
    steer = store.events(1, kind="steer")[-1]
    assert steer.message == "leave the dtype alone" and steer.data["who"]
    assert store.get_trial_by_number(1, 9).status == "kept"
    history = (state / "shell_history").read_text().splitlines()
    assert "/approve 9" in history and "/steer leave the dtype alone" in history
    store.close()


def test_trials_why_and_a_mistyped_why_then_quit(tmp_path):
    """/trials marks measurements, /why N answers in prose, `/why abc` is one error line
    naming /why (not /show), and /quit ends the shell with exit 0. ~3 s, no server."""
    state = tmp_path / ".infergoal"
    state.mkdir()
    store = Store(f"sqlite:///{state / 'infergoal.db'}")
    add_measurements(store, build_run(store, state))  # a finished run with a sentinel and a paired round
    store.close()
    child = _prompt_only(tmp_path)
    child.expect_exact(PROMPT)
    child.sendline("/trials")
    child.expect_exact(PROMPT)
    lines = [x.strip() for x in child.before.splitlines() if x.strip()][1:]  # what /trials printed, its echo left out
    assert lines[0].split()[:3] == ["#0", "measured", "1.000x"] and lines[0].endswith("tpot_ms=8.0")
    assert lines[1].split()[:2] == ["#1", "failed"]
    assert lines[8].startswith("↳#8 (confirm of #7) measured") and lines[10].startswith("↳#10 (sentinel of #0) measured")
    assert [x.split()[0] for x in lines] == [f"#{n}" for n in range(8)] + ["↳#8", "#9"] + [f"↳#{n}" for n in (10, 11, 12)]
    child.sendline("/why 1")
    child.expect_exact("#1 failed (decided by startup): ")
    child.expect_exact(PROMPT)
    assert "CUDA out of memory" in child.before
    child.sendline("/why abc")
    child.expect_exact(PROMPT)
    said = [x.strip() for x in child.before.splitlines() if x.strip()][1:]
    assert said == ["error: 'abc' is not a trial number; e.g. /why 3 (/trials lists them)"]
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and child.signalstatus is None
