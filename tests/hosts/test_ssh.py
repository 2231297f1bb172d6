"""SSHHost against a real OpenSSH server on loopback: keys, sync, launch, gates and bench on the host.

The sshd fixture (tests/sshd_server.py) logs in to this machine exactly as to a GPU box; the
host's Python is this venv's, the host's work dir a temporary folder, and the code the gates
and bench run from is the copy SSHHost ships there.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_groups import group_alive
from sshd_server import SSHD, Sshd, keygen
from typer.testing import CliRunner

from gates.lock import GateTampered
from orchestrator.bench import builtin_scenarios
from orchestrator.cli import app
from orchestrator.hosts import HostError, ServerCrashed, ServerTimeout, get_host
from orchestrator.hosts.ssh import SSHHost
from orchestrator.hosts.sshconn import (
    HostAuthFailed,
    HostKeyChanged,
    HostKeyUnknown,
    SSHConnection,
    trust_host,
)

FAKE = Path(__file__).resolve().parents[1] / "bench"


def test_cli_add_refuses_an_unknown_key_until_trusted(tmp_path, sshd):
    r = CliRunner()
    base = ["-w", str(tmp_path), "hosts"]
    url = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}"
    res = r.invoke(app, [*base, "add", "gpu", url, "--key", str(sshd.user_key), "--python", sys.executable,
                         "--workdir", str(tmp_path / "remote")])
    assert res.exit_code == 0 and "hosts trust gpu" in res.output
    res = r.invoke(app, [*base, "check", "gpu"])
    assert res.exit_code == 2 and "not in" in res.output and "infergoal hosts trust gpu" in res.output
    assert not (tmp_path / "remote").exists(), "nothing ran on a host whose key is unknown"
    res = r.invoke(app, [*base, "trust", "gpu"])
    assert res.exit_code == 0 and "SHA256:" in res.output
    res = r.invoke(app, [*base, "check", "gpu", "--json"])
    assert res.exit_code == 0, res.output
    fp = json.loads(res.output)
    assert fp["python"] == ".".join(map(str, sys.version_info[:3])) and fp["gpu_count"] == 0 and fp["disk_free_gb"] > 0
    res = r.invoke(app, [*base, "list", "--json"])
    assert [h["name"] for h in json.loads(res.output)] == ["gpu"]
    assert r.invoke(app, [*base, "remove", "gpu"]).exit_code == 0
    with pytest.raises(HostError, match="unknown host 'gpu'"):
        get_host("gpu", state_dir=tmp_path / ".infergoal")


def test_changed_host_key_is_refused_and_trust_replaces_it(tmp_path, sshd):
    other = keygen(tmp_path / "impostor")
    kind, blob = Path(f"{other}.pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    host = SSHHost(sshd.spec("box", workdir=tmp_path / "remote"), state_dir=tmp_path, known_hosts=kh)
    with pytest.raises(HostKeyChanged, match=r"changed: expected SHA256:.*infergoal hosts trust box"):
        host.fingerprint()
    fingerprint, replaced = trust_host(host.spec, kh)
    assert replaced is not None and replaced != fingerprint
    assert host.fingerprint()["host_name"] == "box"
    host.close()


def test_unknown_host_key_is_refused(tmp_path, sshd):
    host = SSHHost(sshd.spec("box", workdir=tmp_path / "remote"), state_dir=tmp_path)
    with pytest.raises(HostKeyUnknown, match="infergoal hosts trust box"):
        host.free_port()


def test_a_key_the_host_refuses(tmp_path, sshd):
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd.known_hosts_line())
    stranger = keygen(tmp_path / "stranger")
    host = SSHHost(sshd.spec("box", workdir=tmp_path / "remote", key=stranger), state_dir=tmp_path, known_hosts=kh)
    t0 = time.monotonic()
    with pytest.raises(HostAuthFailed, match="refused the login.*authorized_keys"):
        host.free_port()
    assert host.conn.reconnects == 0, "a refused key is not retried"
    assert time.monotonic() - t0 < 30


def test_sync_sends_only_what_changed(tmp_path, box):
    tree = tmp_path / "engine"
    shutil.copytree(FAKE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    site = box.site()
    remote = site.place(tree)
    first = site.last_sync
    assert first.files_sent == len([p for p in tree.rglob("*") if p.is_file()]) and first.bytes_sent > 0
    assert site.place(tree) == remote and site.last_sync.files_sent == 0, "nothing changed, nothing sent"
    (tree / "fakeserver.py").write_text((tree / "fakeserver.py").read_text() + "\n# a candidate's edit\n")
    (tree / "new.txt").write_text("added")
    (tree / "conftest.py").unlink()
    site.place(tree)
    assert (site.last_sync.files_sent, site.last_sync.files_deleted) == (2, 1)
    assert Path(remote, "new.txt").read_text() == "added" and not Path(remote, "conftest.py").exists()
    assert Path(remote, "fakeserver.py").read_text().endswith("# a candidate's edit\n")
    # Another commit's tree starts on the host as a copy of the last one: only its diff travels.
    second = tmp_path / "engine2"
    shutil.copytree(tree, second)
    (second / "new.txt").write_text("changed in the next commit")
    remote2 = site.place(second)
    assert remote2 != remote and site.last_sync.files_sent == 1
    assert Path(remote2, "new.txt").read_text() == "changed in the next commit"


def test_a_model_the_host_has_at_the_same_path_is_used_there_else_synced_once(tmp_path, box, monkeypatch):
    # The same machine (this sshd) sees the orchestrator's model folder as it is: nothing travels
    # (a 7B is 14.5 GB). A host whose folder differs (names, sizes, mtimes) gets the synced copy.
    model = tmp_path / "models" / "tiny-seed0-v1"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 4096)
    site = box.site()
    assert site.place(model, kind="model") == str(model) and site.last_sync.bytes_sent == 0
    assert site.facts()["model_hash"].startswith("stat:")
    assert not (tmp_path / "remote" / "models").exists()
    site2 = get_host("box", state_dir=tmp_path / ".infergoal").site()
    monkeypatch.setattr("orchestrator.hosts.sshsite.manifest_key", lambda _: "another-machine")
    there = site2.place(model, kind="model")
    assert Path(there).parent == tmp_path / "remote" / "models" and site2.last_sync.bytes_sent > 4096
    assert Path(there, "model.safetensors").read_bytes() == b"w" * 4096
    site2.host.close()


@pytest.mark.slow  # launches servers on the host
def test_launch_health_gates_bench_logs_and_fingerprint_on_the_host(tmp_path, box):
    site = box.site()
    src = site.place(FAKE)
    port = box.free_port()
    # A shell parent and its python child: stopping must take the whole group down.
    argv = ["bash", "-c", f"echo hello from the host; exec {sys.executable} {src}/fakeserver.py --port {port} "
                          "--ttft-ms 5 --tpot-ms 4 & wait"]
    local_log = tmp_path / "runs" / "1" / "trial-0" / "server.log"
    proc = box.start(argv, env={"MARK": "x"}, cwd=src, log_path=local_log)
    try:
        assert box.wait_healthy(f"http://127.0.0.1:{port}/health", 30, proc) < 30
        group, listeners = box.group_pids(proc), box.listening_pids(port)
        assert len(group) >= 2 and listeners and listeners <= group
        assert proc.log_path.startswith(str(tmp_path / "remote" / "logs")), "the log is kept on the host"
        assert Path(tmp_path / "remote" / "servers" / f"{proc.pgid}.json").is_file(), "pidfile on the host"
        site.verify_gates()
        res = site.bench(f"http://127.0.0.1:{port}", "fake", builtin_scenarios(0.5)["decode"], tokenizer=None,
                         tokenizer_dir="", api="completions", timeout_s=10)
        assert res.metrics["failed"] == 0 and 3.5 < res.metrics["tpot_ms_p50"] < 20
        assert "hello from the host" in box.log_tail(proc)
    finally:
        box.stop(proc, grace_s=5)
    assert not box.alive(proc) and not box.group_pids(proc) and not box.listening_pids(port)
    assert "hello from the host" in local_log.read_text(), "the log is fetched next to the trial's files"
    fp = site.facts()
    assert {"hostname", "python", "gpu_count", "torch", "engine_tree", "host"} <= set(fp) and fp["engine_tree"]
    # Anything that edits the host's copy of the gates (a candidate runs as the same user there)
    # stops the run at the next trial.
    thresholds = tmp_path / "remote" / "code" / "gates" / "thresholds.toml"
    thresholds.write_text(thresholds.read_text() + "\n# loosened\n")
    with pytest.raises(GateTampered, match="on host box.*thresholds.toml"):
        site.verify_gates()


@pytest.mark.slow  # launches servers on the host
def test_server_that_never_becomes_healthy_or_crashes(tmp_path, box):
    code = "import time; print('still loading weights', flush=True); time.sleep(600)"
    proc = box.start([sys.executable, "-c", code], env=None, cwd=None, log_path=tmp_path / "a" / "b" / "hang.log")
    with pytest.raises(ServerTimeout, match="(?s)not healthy.*still loading weights"):
        box.wait_healthy(f"http://127.0.0.1:{box.free_port()}/health", 2, proc)
    box.stop(proc, grace_s=2)
    assert not box.alive(proc)
    proc = box.start([sys.executable, "-c", "print('CUDA out of memory'); raise SystemExit(1)"], env=None, cwd=None,
                     log_path=tmp_path / "a" / "b" / "crash.log")
    with pytest.raises(ServerCrashed, match="CUDA out of memory"):
        box.wait_healthy(f"http://127.0.0.1:{box.free_port()}/health", 30, proc)


ORCHESTRATOR = """
import os, sys
from orchestrator.hosts import get_host
host = get_host("box", state_dir=sys.argv[1])
proc = host.start([sys.executable, "-c", "import time; time.sleep(600)"], env=None, cwd=None, log_path=sys.argv[2])
print(proc.pgid, flush=True)
os.kill(os.getpid(), 9)
"""



@pytest.mark.slow  # launches servers on the host
def test_hosts_clean_after_kill_minus_9_stops_only_our_servers(tmp_path, ws, sshd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", ORCHESTRATOR, str(ws / ".infergoal"), str(tmp_path / "x" / "y" / "s.log")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == -9, out.stderr
    ours = int(out.stdout.split()[0])
    # Another workspace's server on the same host, and a process nobody launched through infergoal.
    theirs_state = tmp_path / "other" / ".infergoal"
    theirs_state.mkdir(parents=True)
    shutil.copy(ws / ".infergoal" / "known_hosts", theirs_state / "known_hosts")
    other = SSHHost(sshd.spec("box", workdir=tmp_path / "remote"), state_dir=theirs_state)
    theirs = other.start([sys.executable, "-c", "import time; time.sleep(600)"], env=None, cwd=None,
                         log_path=tmp_path / "o" / "p" / "s.log")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        assert group_alive(ours), "a detached server outlives its orchestrator"
        res = CliRunner().invoke(app, ["-w", str(ws), "hosts", "clean", "box", "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["killed"] == [ours]
        deadline = time.monotonic() + 10
        while group_alive(ours) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not group_alive(ours)
        assert group_alive(theirs.pgid) and bystander.poll() is None, "only this workspace's servers are stopped"
        assert json.loads(CliRunner().invoke(app, ["-w", str(ws), "hosts", "clean", "box", "--json"]).output)["killed"] == []
    finally:
        other.stop(theirs, grace_s=2)
        other.close()
        bystander.kill()
        bystander.wait()


def test_a_host_that_failed_a_whole_retry_cycle_fails_the_next_calls_at_once(tmp_path):
    # A host that died: the first call waits out its retries (here 3 attempts: 0.5 + 1 s of backoff);
    # the calls after it (stop the server, fetch its log) try once each instead of waiting again.
    if SSHD is None:
        pytest.skip("OpenSSH server not installed")
    server = Sshd.start(tmp_path / "sshd")
    (tmp_path / "known_hosts").write_text(server.known_hosts_line())
    conn = SSHConnection(server.spec("box", workdir=tmp_path / "remote"), tmp_path / "known_hosts", attempts=3)
    try:
        assert conn.exec("echo up")[:2] == (0, b"up\n") and not conn.down
        server.stop()
        t0 = time.monotonic()
        with pytest.raises(HostError, match="after 3 attempts"):
            conn.exec("true")
        assert time.monotonic() - t0 >= 1.5 and conn.down
        for call in (lambda: conn.exec("true"), lambda: conn.open_stream("cat")):
            t0 = time.monotonic()
            with pytest.raises((HostError, OSError)):
                call()
            assert time.monotonic() - t0 < 1.0, "a host that is down is tried once, without backoff"
        assert "after 1 attempt)" in str(pytest.raises(HostError, conn.exec, "true").value)
        # The mark lapses after down_s: a host back from a reboot gets the whole retry cycle again.
        conn.down_s = 0.0
        assert not conn.down
        t0 = time.monotonic()
        with pytest.raises(HostError, match="after 3 attempts"):
            conn.exec("true")
        assert time.monotonic() - t0 >= 1.5
    finally:
        conn.close()
        server.stop()


def test_public_surface():
    import orchestrator.hosts as hosts_pkg
    import orchestrator.hosts.ssh as ssh
    import orchestrator.hosts.sshconn as sshconn
    import orchestrator.loop.pool as pool

    assert hosts_pkg.__all__ == ["Host", "HostError", "LocalHost", "Proc", "ServerCrashed", "ServerTimeout", "get_host", "get_hosts",
                                 "host_gpus", "on_gpus"]
    assert ssh.__all__ == ["PACKAGE_ROOT", "RemoteLease", "SSHHost", "owner_id"]
    assert sorted(sshconn.__all__) == ["ConnectionLost", "HostAuthFailed", "HostKeyChanged", "HostKeyUnknown", "HostSpec",
                                       "SSHConnection", "parse_ssh_url", "remote_cmd", "trust_host"]
    assert pool.__all__ == ["GpusHeld", "HostPool", "NoHostsLeft", "PoolController"]
