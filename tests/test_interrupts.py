"""A SIGINT is never lost while a run is driven (`orchestrator.core.interrupts`).

Python swallows an exception raised inside an at-fork callback (logging registers one that runs in
the parent after every `subprocess.Popen`): a SIGINT that lands there is printed as "Exception
ignored" and is gone. A full test run hit it: the run's server was being spawned when `/stop`'s
SIGINT arrived, and the run then waited for a server that never became healthy.
"""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.core import interrupts
from orchestrator.hosts.local import LocalHost

ROOT = Path(__file__).resolve().parents[1]

# A process that gets SIGINT inside an at-fork callback (deterministically: the callback sends it),
# then waits for a server that never becomes healthy, with the real LocalHost.wait_healthy.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from orchestrator.core import interrupts
    from orchestrator.hosts.local import LocalHost

    def swallowing():  # SIGINT arrives inside an at-fork callback, where exceptions are ignored
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)

    host = LocalHost(sys.argv[2])
    with (interrupts.installed() if sys.argv[1] == "installed" else open(os.devnull)):
        os.register_at_fork(after_in_parent=swallowing)
        proc = host.start(["sleep", "30"], env=None, cwd=None, log_path=os.path.join(sys.argv[2], "log"))
        t0 = time.monotonic()
        try:
            host.wait_healthy("http://127.0.0.1:9/health", 8.0, proc)
        except KeyboardInterrupt:
            print(f"interrupted after {time.monotonic() - t0:.1f} s", flush=True)
        except Exception as e:
            print(f"not interrupted: {type(e).__name__}", flush=True)
        finally:
            host.stop(proc, grace_s=1)
""")


@pytest.mark.parametrize("mode", ["installed", "plain"])
def test_a_sigint_swallowed_while_spawning_the_server_still_stops_the_wait(tmp_path, mode):
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert "Exception ignored" in out.stderr  # the interrupt really was swallowed in both modes
    if mode == "installed":
        assert out.stdout.startswith("interrupted after"), out
        assert float(out.stdout.split()[2]) < 2.0
    else:  # Python's own handler: the wait runs to its timeout (what the fix is for)
        assert out.stdout.startswith("not interrupted: ServerTimeout"), out


def test_check_raises_once_and_never_during_the_clean_up_of_an_interrupt():
    with interrupts.installed():
        interrupts.check()  # nothing pending
        try:
            interrupts._handler(2, None)
        except KeyboardInterrupt:
            interrupts.check()  # clean-up while the interrupt is handled: not raised again
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()  # swallowed somewhere (here: by the except above): raised again, once
        interrupts.check()
    with interrupts.installed():
        pass
    interrupts._pending = True
    with interrupts.installed():
        interrupts.check()  # a new run starts with nothing pending


def test_the_health_wait_raises_a_swallowed_interrupt_at_once(tmp_path):
    host = LocalHost(tmp_path)
    proc = host.start(["sleep", "30"], env=None, cwd=None, log_path=tmp_path / "log")
    try:
        with interrupts.installed():
            interrupts._pending = True
            t0 = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                host.wait_healthy("http://127.0.0.1:9/health", 30.0, proc)
            assert time.monotonic() - t0 < 1.0
    finally:
        host.stop(proc, grace_s=1)


TERM_CHILD = textwrap.dedent("""
    import sys, time
    from orchestrator.core import interrupts

    with interrupts.installed():
        try:
            print("ready", flush=True)
            time.sleep(30)
        except KeyboardInterrupt:
            print("stopped cleanly", flush=True)  # the clean stop: the run is marked, its knowledge written
            time.sleep(30 if sys.argv[1] == "hang" else 0)
""")


@pytest.mark.parametrize("mode", ["clean", "hang"])
def test_sigterm_stops_a_run_as_sigint_does_and_a_second_one_ends_it(mode):
    """SIGTERM (a supervisor's stop, `timeout` without `-s INT`) is the same clean stop as SIGINT; one
    that comes while the stop is being handled (the shell's escalation) ends the process at once."""
    import signal

    p = subprocess.Popen([sys.executable, "-c", TERM_CHILD, mode], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        assert p.stdout.readline().strip() == "stopped cleanly"
        if mode == "hang":
            time.sleep(0.2)
            p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == (-signal.SIGTERM if mode == "hang" else 0)
    finally:
        p.kill()
