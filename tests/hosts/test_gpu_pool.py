"""The GPUs of one host as a pool: trials at once, each on its own GPUs, each GPU leased per trial.

Simulated GPU ids (`gpus = N` in the workspace): the servers are the bench's torch-free fake server
started through a wrapper that prints the `CUDA_VISIBLE_DEVICES` it was given, so each trial's log
says which GPUs its server saw. The leases are the real ones (flock files in a test folder).
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fake_target import FAKE_SERVER_DIR, target_head

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.hosts import get_host
from orchestrator.hosts.gpus import GpuPool, GpusBusy, plan_gpus, resolve_gpus
from orchestrator.hosts.runlease import LeaseHeld, run_identity
from orchestrator.remote import hostlock
from orchestrator.review.why import explain_trial
from orchestrator.runs import start_run
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def lease_dir(tmp_path, monkeypatch):
    d = tmp_path / "leases"
    monkeypatch.setenv("INFERGOAL_LEASE_DIR", str(d))
    return d


def _target(tmp_path: Path, tpot=(8.0, 6.0, 5.0, 4.0, 7.0), tp=(1,)) -> Path:
    wrap = tmp_path / "gpuwrap.py"
    # The server says which GPUs it was given, and holds a lock on each for as long as it lives:
    # a second live server on one of them cannot take it and says so (CLASH).
    wrap.write_text(textwrap.dedent('''
        import fcntl, os, runpy, sys
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
        print("CUDA_VISIBLE_DEVICES=" + gpus, flush=True)
        held = []
        for g in gpus.split(","):
            fd = os.open(os.path.join(sys.argv[1], "gpu-" + g), os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print("CLASH on GPU " + g, flush=True)
            held.append(fd)
        sys.argv = sys.argv[2:]
        runpy.run_path(sys.argv[0], run_name="__main__")
    '''))
    (tmp_path / "claims").mkdir()
    path = tmp_path / "fake-gpu.toml"
    path.write_text(target_head("fake-gpu", FAKE_SERVER_DIR) + f'''launch = "{{{{ python }}}} {wrap} {tmp_path / 'claims'} {{{{ source }}}}/fakeserver.py --port {{{{ port }}}} --ttft-ms 5 --tpot-ms {{{{ tpot_ms }}}}"
[parallel]
tensor = "tp"
[knobs.tpot_ms]
type = "categorical"
choices = {list(tpot)}
default = {tpot[0]}
[knobs.tp]
type = "categorical"
choices = {list(tp)}
default = {tp[0]}
''')
    return path


def _ws(tmp_path: Path, target: Path, steps: list[dict], gpus: str) -> Workspace:
    script = tmp_path / "steps.json"
    script.write_text(json.dumps(steps))
    return Workspace(tmp_path, [f"gpus={gpus}", f'target="{target}"', f'proposer="scripted:{script}"',
                                "gates.accuracy=false", "gates.integrity=false", "bench.scale=0.5", "bench.timeout_s=5"])


def _seen_gpus(trial) -> str:
    """The CUDA_VISIBLE_DEVICES the trial's server printed first thing."""
    line = Path(trial.log_path).read_text().splitlines()[0]
    assert line.startswith("CUDA_VISIBLE_DEVICES="), line
    return line.split("=", 1)[1]


def test_n_trials_on_n_simulated_gpus_none_used_twice_at_once(tmp_path):
    # Every candidate is slower than the baseline: none is kept, so no paired rounds follow the stop.
    target = _target(tmp_path, tpot=(4.0, 8.0, 7.0, 6.0, 5.0), tp=(1, 2, 4))
    steps = [{"tpot_ms": v, "tp": tp} for v, tp in ((5.0, 4), (8.0, 2), (7.0, 1), (6.0, 1), (5.0, 2), (8.0, 1))]
    ws = _ws(tmp_path, target, steps, "3")
    out = start_run(ws, parse_goal("beat the baseline by 90% on TPOT within 6 trials"))
    store = Store(ws.db_url)
    trials = store.list_trials(out.run_id)
    assert [t.number for t in trials] == list(range(len(trials))) and len(trials) >= 6, [(t.number, t.status) for t in trials]
    # Four GPUs on a host of three: refused before launch, in one line, and the run goes on.
    refused = trials[1]
    assert refused.status == "failed" and "not launched" in refused.error and "tp=4 needs 4 GPUs; the host has 3" in refused.error
    trials = [t for t in trials if t.id != refused.id]
    # A trial measured while the host's CPUs were busier than at the baseline (here: the sibling trials'
    # servers and benches on a small machine) is invalid and re-run, as on any shared host.
    assert all(t.status in ("kept", "discarded") or "untrusted" in (t.error or "") for t in trials), \
        [(t.number, t.status, t.error) for t in trials]
    events = {e.trial_id: e.data for e in store.events(out.run_id, kind="trial.gpus")}
    assert len(events) == len(trials), "every trial says which GPUs it ran on"
    for t in trials:
        gpus = events[t.id]["gpus"]
        assert _seen_gpus(t) == gpus, "the server saw the GPUs the record names, and only them"
        assert len(gpus.split(",")) == t.knobs["tp"], "a trial takes as many GPUs as its tensor size"
    # `why` and `show` say which GPUs a trial ran on; the baseline's too.
    assert explain_trial(store, out.run_id, 0).evidence["ran_on"] == f"GPU {events[trials[0].id]['gpus']} of local"
    shown = subprocess.run([sys.executable, "-m", "orchestrator.cli", "show", str(trials[1].number)], cwd=tmp_path,
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert f"ran on: GPU {events[trials[1].id]['gpus']} of local" in shown.stdout, shown.stdout + shown.stderr
    # No GPU used twice at once: no server found one of its GPUs locked by another live server.
    assert not [t.number for t in trials if "CLASH" in Path(t.log_path).read_text()]
    starts = sorted(t.started_at for t in trials[1:])
    ends = sorted(t.finished_at for t in trials[1:])
    assert starts[1] < ends[0], "trials ran at the same time (else the pool did nothing)"
    assert {g for e in events.values() for g in e["gpus"].split(",")} == {"0", "1", "2"}, "every GPU took trials"
    assert not hostlock.holders(), "every GPU lease released at the end"


def _holder(lease_dir: Path, gpu: str) -> subprocess.Popen:
    """A real process holding GPU `gpu`'s lease the way a trial does (another workspace's run)."""
    code = (f"import sys, time; from orchestrator.remote import hostlock; "
            f"hostlock.acquire({{'workspace': '/other/ws', 'run': 7, 'trial': 3}}, {gpu!r}); "
            "print('held', flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), INFERGOAL_LEASE_DIR=str(lease_dir)))
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_busy_gpu_is_refused_to_a_second_workspace_and_freed_when_its_holder_is_killed(tmp_path, lease_dir):
    holder = _holder(lease_dir, "1")
    try:
        pool = GpuPool(lambda g: get_host("local", state_dir=tmp_path / ".infergoal", gpus=g), ["0", "1"],
                       run_identity(tmp_path, 1), wait_s=0.5, poll_s=0.1)
        with pytest.raises(hostlock.Busy):  # the busy GPU itself: refused, naming its holder
            get_host("local", state_dir=tmp_path / ".infergoal", gpus="1").take_lease(run_identity(tmp_path, 1))
        assert pool.take(2) is None, "two GPUs wanted, one is another workspace's"
        slot = pool.take(1)
        assert slot is not None and slot.ids == ["0"], "the free GPU is taken, the busy one skipped"
        assert "run 7 trial #3 of /other/ws" in pool.held_by_others()
        pool.release(slot)
        with pytest.raises(GpusBusy, match="held by run 7 trial #3"):  # waited for, then named
            with pool.hold(2):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        # Killed -9: the kernel dropped its lock; GPU 1 is free at once, with nothing to expire.
        with pool.hold(2) as both:
            assert both.ids == ["0", "1"] and both.host.gpus == "0,1"
    finally:
        holder.kill()
        holder.wait(10)


def test_a_run_whose_gpus_are_all_held_is_refused_in_one_line(tmp_path, lease_dir):
    holders = [_holder(lease_dir, g) for g in ("0", "1")]
    try:
        ws = _ws(tmp_path, _target(tmp_path), [{"tpot_ms": 6.0}], "2")
        with pytest.raises(LeaseHeld, match=r"every GPU of the run \(0, 1\).*in use by run 7 trial #3 of /other/ws"):
            start_run(ws, parse_goal("beat the baseline by 90% on TPOT within 2 trials"))
        assert Store(ws.db_url).list_runs() == [], "refused before the run row"
        holders[1].kill()
        holders[1].wait(10)
        out = start_run(ws, parse_goal("beat the baseline by 90% on TPOT within 1 trials"))
        events = Store(ws.db_url).events(out.run_id, kind="trial.gpus")
        assert {e.data["gpus"] for e in events} == {"1"}, "the free GPU took every trial, the held one none"
    finally:
        for h in holders:
            h.kill()
            h.wait(10)


def test_the_gpus_setting_both_ways(tmp_path):
    host = get_host("local", state_dir=tmp_path / ".infergoal")
    assert plan_gpus(4, [host]).pool == {"0": "", "1": "", "2": "", "3": ""}
    assert plan_gpus([1, 3], [host]).per_trial == 2
    found = {"0": "NVIDIA H100 80GB HBM3", "1": "NVIDIA H100 80GB HBM3", "2": "NVIDIA A10G"}
    assert resolve_gpus("auto", {"0": "NVIDIA H100 80GB HBM3"}) == {"0": "NVIDIA H100 80GB HBM3"}
    assert resolve_gpus([0, 1], found) == {g: found[g] for g in "01"}
    with pytest.raises(Exception, match=r"different models.*gpus = \[0, 1\]"):  # A/B across card models is no A/B
        resolve_gpus("auto", found)
    with pytest.raises(Exception, match="has no GPU 5"):
        resolve_gpus([0, 5], found)
    with pytest.raises(Exception, match="applies to one host"):
        plan_gpus(2, [host, get_host("local", state_dir=tmp_path / ".infergoal", gpus="1")])


def test_a_throughput_per_gpu_goal_counts_the_gpus_and_the_report_shows_both(tmp_path):
    # The same server on two GPUs (tp=2) makes the same tok/s per host: half as many per GPU.
    target = _target(tmp_path, tpot=(8.0, 4.0), tp=(1, 2))
    ws = _ws(tmp_path, target, [{"tpot_ms": 8.0, "tp": 2}], "2")
    out = start_run(ws, parse_goal("improve throughput per GPU by 2x within 2 trials"))
    store = Store(ws.db_url)
    base, two = (store.get_trial_by_number(out.run_id, n) for n in (0, 1))
    for t, gpus in ((base, 1), (two, 2)):
        m = {x.metric: x.value for x in store.measurements(t.id) if x.scenario == "throughput"}
        assert m["output_throughput_per_gpu"] == pytest.approx(m["output_throughput"] / gpus)
    assert two.status == "discarded" and two.score < 0.75, (two.status, two.score)
    from orchestrator.report import write_report

    report = write_report(store, out.run_id, tmp_path / "report").read_text()
    assert "| throughput | trial | scenario | tok/s per host | GPUs | tok/s per GPU |" in report
    assert "| baseline | #0 | throughput |" in report and "| 1 |" in report


def test_a_pool_of_hosts_still_takes_one_trial_per_host(tmp_path, monkeypatch):
    """The HostPool path (a comma-separated `host`) without an SSH server: two hosts of this machine,
    each bound to its own GPU set, as two registered `--gpus` entries of one box would be."""
    import orchestrator.runs as runs

    state = tmp_path / ".infergoal"
    monkeypatch.setattr(runs, "get_hosts", lambda spec, **kw: [get_host("local", state_dir=state, gpus=g) for g in "01"])
    target = _target(tmp_path, tpot=(4.0, 8.0, 7.0, 6.0, 5.0))
    ws = _ws(tmp_path, target, [{"tpot_ms": v, "tp": 1} for v in (8.0, 7.0, 6.0, 5.0)], '"auto"')
    out = start_run(ws, parse_goal("beat the baseline by 90% on TPOT within 5 trials"))
    store = Store(ws.db_url)
    trials = store.list_trials(out.run_id)
    assert len(trials) == 5 and [t.number for t in trials] == list(range(5)), [(t.number, t.status) for t in trials]
    ran = {e.trial_id: e.data["host"] for e in store.events(out.run_id, kind="trial.gpus")}
    assert set(ran.values()) == {"local:gpu0", "local:gpu1"}, "both hosts took trials"
    assert not [t.number for t in trials if "CLASH" in Path(t.log_path).read_text()]
    assert sorted(t.started_at for t in trials[1:])[1] < sorted(t.finished_at for t in trials[1:])[0], "in parallel"


def test_gpus_are_found_from_nvidia_smi_and_cuda_visible_devices(monkeypatch):
    from orchestrator.hosts.gpus import detect_local, gpu_memory_bytes

    listing = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1b2c)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-3d4e)\n"
               "GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-5f60)\n")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert detect_local(lambda argv: listing) == {g: "NVIDIA H100 80GB HBM3" for g in "012"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert list(detect_local(lambda argv: listing)) == ["2", "0"], "the ids this process may use, no others"
    assert detect_local(lambda argv: None) == {"2": "", "0": ""}, "no nvidia-smi: the visible ids, models unknown"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert detect_local(lambda argv: None) == {}, "no GPU: one trial at a time, as always"
    assert gpu_memory_bytes({"gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15"]}) == 81559 * 1024**2
    assert gpu_memory_bytes({"gpus": []}) is None
