"""A mistake gives one `error:` line and a non-zero exit; data commands take --json.

Each listed defect is checked both ways where it is a check (the mistake refused, the right use
still working). CliRunner in-process; one real subprocess for the missing workspace.
"""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import git
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.cli.shell import Shell
from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.core.exitcodes import EXIT_CODES
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _cli(ws, *args):
    r = runner.invoke(app, ["-w", str(ws), *args], env={"COLUMNS": "200"})
    assert "Traceback" not in r.output, r.output
    return r


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _one_error(r, *needles: str) -> str:
    assert r.exit_code == EXIT_CODES["bad_input"], r.output
    lines = _lines(r.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _run_with_trials(ws: Path) -> tuple[Store, int, list[str]]:
    """A run whose engine source is a git repo with two commits, as trials #0 and #1."""
    src = ws / "engine"
    repo = git.Repo.init(src)
    commits = []
    for text in ("a = 1\n", "a = 2\n"):
        (src / "engine.py").write_text(text)
        repo.index.add(["engine.py"])
        commits.append(repo.index.commit(f"engine {text.strip()}",
                                         author=git.Actor("t", "t@t"), committer=git.Actor("t", "t@t")).hexsha)
    (ws / ".infergoal").mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{ws / '.infergoal' / 'infergoal.db'}")
    g = parse_goal("beat the baseline by 20% on TPOT within 3 trials")
    run = store.create_run("r", g.text, g.model_dump(mode="json"), g.digest, {"name": "t", "source": str(src)}, {}, "local", "search")
    for n, c in enumerate(commits):
        store.create_trial(run.id, n, commit=c, knobs={}, rationale="", proposer="search")
    return store, run.id, commits


def test_missing_workspace_is_an_error_naming_it_and_init(tmp_path):
    """A real subprocess: `-w /nonexistent status` no longer says "no runs yet" and exits 0."""
    missing = tmp_path / "nonexistent"
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "-w", str(missing), "status"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == EXIT_CODES["bad_input"] and r.stdout == ""
    assert _lines(r.stderr) == [f"error: workspace {missing} does not exist; make one with `infergoal init {missing}`, "
                                "or point -w at an existing one"]
    assert not missing.exists(), "the refusal creates nothing"
    # The other way: an existing folder with no runs still answers, exit 0.
    r = _cli(tmp_path, "status")
    assert r.exit_code == 0 and "no runs yet" in r.output
    for cmd in (["trials"], ["why"], ["kb", "list"], ["report"]):
        _one_error(_cli(missing, *cmd), "does not exist", "infergoal init")


def test_why_with_a_word_is_one_error_line(tmp_path):
    _one_error(_cli(tmp_path, "why", "abc"), "'abc' is not a trial number", "infergoal trials")
    _one_error(_cli(tmp_path, "why", "-3"))  # an option-like word: still one line
    # Other usage mistakes, click's four lines before: one line naming the --help to read.
    _one_error(_cli(tmp_path, "show", "abc"), "show --help")
    _one_error(_cli(tmp_path, "frobnicate"), "No such command")
    _one_error(_cli(tmp_path, "status", "--bogus"), "--bogus", "status --help")
    # The right use: a number reaches the store (here: no run yet, the usual line).
    _run_with_trials(tmp_path)
    r = _cli(tmp_path, "why", "1")
    assert r.exit_code == 0 and "run 1 trial #1" in r.output, r.output
    r = runner.invoke(app, [])  # no arguments at all: the help, as before
    assert "Usage" in r.output and "goal" in r.output


def test_shell_why_hint_names_why(tmp_path):
    _run_with_trials(tmp_path)
    out = io.StringIO()
    sh = Shell(Workspace(tmp_path), stdout=out)
    sh.onecmd(sh.precmd("/why abc"))
    sh.onecmd(sh.precmd("/approve x"))
    sh.onecmd(sh.precmd("/show"))
    lines = out.getvalue().splitlines()
    assert lines[0] == "error: 'abc' is not a trial number; e.g. /why 3 (/trials lists them)"
    assert "/approve 3" in lines[1] and "/show 3" in lines[2]
    assert "/show" not in lines[0]
    before = len(out.getvalue().splitlines())
    sh.onecmd(sh.precmd("/why 1"))
    assert out.getvalue().splitlines()[before].startswith("#1 ")  # the sentence first, then its facts


def test_diff_takes_json(tmp_path):
    _, rid, commits = _run_with_trials(tmp_path)
    r = _cli(tmp_path, "diff", "0", "1", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["run"] == rid and (data["a"], data["b"]) == (0, 1) and [data["commit_a"], data["commit_b"]] == commits
    assert "-a = 1" in data["diff"] and "+a = 2" in data["diff"]
    r = _cli(tmp_path, "diff", "0", "1")  # plain text, as before
    assert r.exit_code == 0 and "+a = 2" in r.output
    _one_error(_cli(tmp_path, "diff", "0", "7"), "no trial #7")
    r = _cli(tmp_path, "diff", "0", "7", "--json")  # under --json the error is also JSON on stdout
    assert r.exit_code == 2 and r.stdout.startswith("{") and json.loads(r.stdout)["error"].startswith("run 1 has no trial #7")


def test_report_of_a_missing_run_names_the_runs_there(tmp_path):
    r = _cli(tmp_path, "report", "--run", "42")  # no run at all: start one
    assert r.exit_code == 2 and "infergoal goal" in r.output
    _run_with_trials(tmp_path)
    for cmd in (["report", "--run", "42"], ["trials", "--run", "42"], ["why", "--run", "42"]):
        line = _one_error(_cli(tmp_path, *cmd), "no run 42 in this workspace; its runs are 1", "infergoal status")
        assert "infergoal goal" not in line


def test_kb_search_explains_its_weights_and_options(tmp_path):
    r = _cli(tmp_path, "kb", "search", "--help")
    for option, words in (("--engine", "Engine to rank for"), ("--model", "Model to rank for"), ("--kind", "Only this kind"),
                          ("--json", "JSON")):
        assert option in r.output and words in r.output, r.output
    assert "[w]" in r.output
    r = _cli(tmp_path, "kb", "search", "batching")
    lines = _lines(r.output)
    assert r.exit_code == 0 and lines[0].startswith("[w] = fit of the entry's setting") and "confirmed 1" in lines[0]
    assert len(lines) > 1 and all("[" in line for line in lines[1:])
    hits = json.loads(_cli(tmp_path, "kb", "search", "batching", "--json").output)
    assert hits and all(0 < h["weight"] <= 1 and {"id", "kind", "status", "title"} <= set(h) for h in hits)
    assert [h["id"] for h in hits] == [line.split()[0] for line in lines[1:]]
    listed = json.loads(_cli(tmp_path, "kb", "list", "--json").output)
    one = json.loads(_cli(tmp_path, "kb", "show", listed[0]["id"], "--json").output)
    assert one["id"] == listed[0]["id"] and one["body"]
    r = _cli(tmp_path, "kb", "search", "zzzz-no-such-word")  # no hits: no legend, the usual line
    assert _lines(r.output) == ["(no matching entries)"]


def test_a_global_option_after_the_command_says_where_it_goes(tmp_path):
    r = runner.invoke(app, ["goal", "-w", str(tmp_path), "improve throughput by 2x within 2 trials"])
    _one_error(r, "-w is a global option: put it before the command", "-w ... goal ...")
    r = runner.invoke(app, ["kb", "show", "--workspace", str(tmp_path), "some-id"])
    _one_error(r, "--workspace is a global option", "kb show ...")
    r = runner.invoke(app, ["kb", "show", "--bogus", "x"])  # not a global option: the usual line
    _one_error(r, "No such option: --bogus", "kb show --help")


def test_an_unknown_model_preset_is_bad_input_naming_the_presets(tmp_path):
    r = _cli(tmp_path, "model", "make", str(tmp_path / "m"), "--preset", "bogus")
    _one_error(r, "unknown preset 'bogus'", "tiny", "small")
    assert "internal error" not in r.output and not (tmp_path / "m").exists()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bench_against_no_server_is_one_error_line_not_a_table_of_zeros(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    r = _cli(tmp_path, "bench", "--url", url, "--model", "m", "--scenario", "decode")
    _one_error(r, f"cannot reach {url}", "connection refused", "check --url")
    assert "achieved_rate" not in r.output


def test_bench_whose_every_request_fails_says_so_in_one_line(tmp_path):
    """A server that answers, but 404 to every request (a wrong path): refused as bad input, not zeros."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NotFound(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST  # noqa: N815

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/wrong"
        r = _cli(tmp_path, "bench", "--url", url, "--model", "m", "--scenario", "decode", "--num-requests", "3",
                 "--warmup-requests", "0")
    finally:
        server.shutdown()
    _one_error(r, f"every request to {url} failed", "check --url")


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    """`infergoal kb show ID | head -40` when head has gone: no `error: Broken pipe`, the SIGPIPE status."""
    listed = json.loads(_cli(tmp_path, "kb", "list", "--json").output)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: every write is EPIPE
    p = subprocess.run([sys.executable, "-m", "orchestrator.cli", "-w", str(tmp_path), "kb", "show", listed[0]["id"]],
                       stdout=write, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)},
                       timeout=120)
    os.close(write)
    assert p.stderr == "" and p.returncode == 141, (p.returncode, p.stderr)


def test_a_speedup_without_its_unit_is_echoed_as_typed_with_the_expected_form(tmp_path):
    """`by 1.5 within 2 trials` was echoed as 'improve throughput by 1 5' with no word on what was wrong."""
    r = _cli(tmp_path, "goal", "improve throughput by 1.5 within 2 trials")
    line = _lines(r.output)[0]  # the accepted forms follow it
    assert r.exit_code == EXIT_CODES["bad_input"] and line.startswith("error: could not understand 'improve throughput by 1.5'")
    assert "'by 1.5x' (a ratio) or 'by 50%'" in line and "1 5" not in line
    assert parse_goal("improve throughput by 1.5x within 2 trials").objectives[0].value == 0.5  # with its unit: accepted


def test_a_copied_target_whose_source_is_gone_is_refused_before_any_model_or_run(tmp_path):
    """examples/targets/hfserve.toml copied elsewhere: `source = "../hfserve"` names nothing there. Refused
    at once (bad input, no run row), not after the model build when the baseline launches."""
    copy = tmp_path / "mine" / "hfserve.toml"
    copy.parent.mkdir()
    copy.write_text((ROOT / "examples" / "targets" / "hfserve.toml").read_text())
    r = runner.invoke(app, ["-w", str(tmp_path / "ws"), "-o", 'model_cache="/nonexistent"', "goal",
                            "improve throughput by 2x within 2 trials", "-t", str(copy)])
    assert r.exit_code == EXIT_CODES["bad_input"], r.output
    assert f"source {tmp_path / 'hfserve'} is not a folder" in r.output and "fix `source`" in r.output
    db = tmp_path / "ws" / ".infergoal" / "infergoal.db"
    assert not db.exists() or Store(f"sqlite:///{db}").latest_run() is None


_TARGET = """name = "t"
source = "{source}"
prefix = "{prefix}"
launch = "{{{{ python }}}} {{{{ source }}}}/server.py --port {{{{ port }}}}"
"""


def test_target_paths_and_commands_are_checked_both_ways(tmp_path):
    import pytest

    from orchestrator.targets import TargetError, load_target
    from orchestrator.targets.spec import check_paths

    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "server.py").write_text("")

    def target(name, source, prefix=""):
        path = tmp_path / f"{name}.toml"
        path.write_text(_TARGET.format(source=source, prefix=prefix))
        return load_target(path)

    check_paths(target("good", engine, "taskset -c 0"), local=True)  # its files and its launcher found: accepted
    with pytest.raises(TargetError, match="names .*/server.py, which does not exist under source"):
        check_paths(target("no_server", tmp_path), local=True)
    with pytest.raises(TargetError, match="starts 'no-such-launcher-xyz', which is not on PATH here"):
        check_paths(target("no_launcher", engine, "no-such-launcher-xyz -c 0"), local=True)
    check_paths(target("remote", engine, "no-such-launcher-xyz -c 0"), local=False)  # a remote host's programs are its own
