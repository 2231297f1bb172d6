"""The agent's tools: every escape route is refused as an error result, the gates stay intact."""

import os

import pytest
from agent_env import SLOW_LINE, make_ctx, make_engine_repo

from orchestrator.agent.sandbox import EngineWorktree
from orchestrator.agent.schema import tool_schema
from orchestrator.agent.tools import Toolbox, TrialRequest, load_skills
from orchestrator.config.workspace import PACKAGE_ROOT
from orchestrator.store import Store


@pytest.fixture
def box(tmp_path):
    repo = make_engine_repo(tmp_path)
    store = Store("sqlite://")
    ctx, kb = make_ctx(tmp_path, store, repo)
    wt = EngineWorktree(repo, repo, ctx.base_commit, tmp_path / "wt", "infergoal/test", command_timeout_s=5)
    return Toolbox(wt, store=store, run_id=ctx.run_id, target=ctx.target, kb=kb, skills=load_skills(PACKAGE_ROOT / "skills"))


def _err(box, tool, **args):
    result, is_error = box.call(tool, args)
    assert is_error, f"{tool}({args}) should have been refused, got: {result}"
    return result


def test_schemas_are_plain_dicts_from_the_typed_methods(box):
    schemas = {s["name"]: s for s in box.schemas()}
    assert set(schemas) == set(Toolbox.TOOLS)
    edit = schemas["edit_file"]["input_schema"]
    assert edit["required"] == ["path", "old", "new"] and edit["properties"]["old"]["type"] == "string"
    assert tool_schema(Toolbox.trial_details)["input_schema"]["properties"]["number"]["type"] == "integer"


def test_files_inside_the_worktree_work(box):
    assert "fakeserver.py" in box.call("list_files", {})[0]
    assert "gates" not in box.call("list_files", {})[0], "protected folders are not even listed"
    out, err = box.call("edit_file", {"path": "fakeserver.py", "old": SLOW_LINE, "new": SLOW_LINE.replace("1000.0", "2000.0")})
    assert not err and "tpot_ms / 2000.0" in (box.wt.root / "fakeserver.py").read_text()
    assert "fakeserver.py:" in box.call("grep", {"pattern": "2000"})[0]
    box.call("write_file", {"path": "pkg/new.py", "content": "X = 1\n"})
    assert (box.wt.root / "pkg" / "new.py").read_text() == "X = 1\n"


@pytest.mark.parametrize("path", ["../outside.txt", "pkg/../../outside.txt", "/etc/passwd", "~/x"])
def test_path_escapes_are_refused(box, path):
    assert "refused" in _err(box, "write_file", path=path, content="x")
    assert "refused" in _err(box, "read_file", path=path)


def test_symlinks_out_of_the_worktree_are_refused(box, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    os.symlink(secret, box.wt.root / "link.txt")
    os.symlink(tmp_path, box.wt.root / "linkdir")
    assert "symlink" in _err(box, "read_file", path="link.txt")
    assert "symlink" in _err(box, "write_file", path="linkdir/x.txt", content="x")
    assert "symlink" in _err(box, "edit_file", path="link.txt", old="outside", new="inside")
    assert secret.read_text() == "outside"


@pytest.mark.parametrize("path", ["gates/thresholds.toml", "gates/data/heldout.txt", "gates/new.py", ".git/config"])
def test_gate_files_and_accuracy_data_are_refused(box, path):
    before = (box.wt.root / path).read_text() if (box.wt.root / path).is_file() else None
    assert "refused" in _err(box, "write_file", path=path, content="loosened")
    assert "refused" in _err(box, "read_file", path=path)
    after = (box.wt.root / path).read_text() if (box.wt.root / path).is_file() else None
    assert before == after


@pytest.mark.parametrize("command", [
    "echo x > {outside}", "cp fakeserver.py ../stolen.py", "cat ~/.bashrc", "echo x > $HOME/x",
])
def test_commands_writing_outside_are_refused(box, command, tmp_path):
    outside = tmp_path / "escape.txt"  # this test's own, beside the worktree: no file an earlier run left counts
    assert "refused" in _err(box, "run_command", command=command.format(outside=outside))
    assert not outside.exists() and not (tmp_path / "stolen.py").exists()


def test_a_command_that_edits_the_gates_is_undone(box):
    out, err = box.call("run_command", {"command": "echo loosened >> gates/thresholds.toml; echo new > gates/extra.py; echo ok"})
    assert "refused and undone" in out and "gates/thresholds.toml" in out
    assert (box.wt.root / "gates" / "thresholds.toml").read_text() == "kl_max = 0.01\n"
    assert not (box.wt.root / "gates" / "extra.py").exists()


def test_commands_run_with_a_timeout_truncated_output_and_no_api_key(box, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-must-not-leak")
    out, err = box.call("run_command", {"command": "env; python -c 'print(1+1)'"})
    assert not err and "2" in out and "sk-must-not-leak" not in out
    out, _ = box.call("run_command", {"command": "sleep 30", "timeout_s": 0.5})
    assert "killed after" in out
    out, _ = box.call("run_command", {"command": "python -c \"print('y' * 20000)\""})
    assert "characters cut" in out and len(out) < 9000


def test_tool_errors_come_back_as_results_not_exceptions(box):
    assert "not found" in _err(box, "edit_file", path="fakeserver.py", old="no such text", new="x")
    assert "unknown tool" in _err(box, "rm_rf")
    assert "unknown argument" in _err(box, "read_file", path="fakeserver.py", colour="red")
    assert "must be a JSON integer" in _err(box, "trial_details", number="one")
    assert "bad regular expression" in _err(box, "grep", pattern="(")
    assert "unknown knob" in _err(box, "run_trial", knobs={"warp": 9}, rationale="r", prediction="p")
    assert "not one of" in _err(box, "run_trial", knobs={"tpot_ms": 1.0}, rationale="r", prediction="p")
    req, err = box.call("run_trial", {"knobs": {"tpot_ms": 4.0}, "rationale": "faster", "prediction": "tpot halves"})
    assert not err and isinstance(req, TrialRequest) and req.knobs == {"tpot_ms": 4.0}


def test_history_knowledge_and_skills(box):
    assert "No trials yet" in box.call("trial_history", {})[0]
    found, _ = box.call("search_knowledge", {"query": "accuracy"})
    assert "accuracy" in found
    entry_id = found.splitlines()[0].split()[1]
    assert not box.call("read_knowledge", {"entry_id": entry_id})[1]
    assert "batch" in box.call("load_skill", {"name": "batching-decode"})[0].lower()
    assert "no skill" in _err(box, "load_skill", name="nope")


def test_commit_contains_the_edits_and_never_the_gates(box):
    box.call("edit_file", {"path": "fakeserver.py", "old": SLOW_LINE, "new": SLOW_LINE.replace("1000.0", "2000.0")})
    commit = box.wt.commit("halve the decode cost")
    assert commit and commit != box.wt.base_commit
    c = box.wt.repo.commit(commit)
    assert c.message.strip() == "halve the decode cost" and list(c.stats.files) == ["fakeserver.py"]
    assert box.wt.commit("nothing new") == commit, "no change, no new commit"
