"""The agent from the command line: a missing key is one clear line, steering is stored for the agent."""

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config.workspace import Workspace
from orchestrator.store import Store

runner = CliRunner()


def test_agent_without_a_key_is_refused_before_a_run_exists(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    for args in (["--agent", "claude"], ["--proposer", "hybrid"]):
        r = runner.invoke(app, ["-w", str(tmp_path), "goal", *args, "beat the baseline by 20% on TPOT"])
        assert r.exit_code == 2 and "needs an Anthropic API key: set ANTHROPIC_API_KEY" in r.output
    assert not Store(Workspace(tmp_path).db_url).list_runs(), "no run row for a refused start"
    r = runner.invoke(app, ["-w", str(tmp_path), "goal", "--agent", "gpt", "beat the baseline by 20% on TPOT"])
    assert r.exit_code == 2 and "unknown agent 'gpt'" in r.output


def test_steer_stores_a_message_for_the_agent(tmp_path):
    store = Store(Workspace(tmp_path).db_url)
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "claude")
    r = runner.invoke(app, ["-w", str(tmp_path), "steer", "leave the dtype alone"])
    assert r.exit_code == 0 and f"run {run.id}" in r.output
    assert [e.message for e in store.events(run.id, kind="steer")] == ["leave the dtype alone"]


def test_diff_shows_the_code_change_between_two_trials(tmp_path):
    import git
    from agent_env import make_engine_repo

    repo_dir = make_engine_repo(tmp_path)
    repo = git.Repo(repo_dir)
    base = repo.head.commit.hexsha
    (repo_dir / "fakeserver.py").write_text((repo_dir / "fakeserver.py").read_text() + "# faster\n")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "agent"])
    store = Store(Workspace(tmp_path).db_url)
    run = store.create_run("r", "g", {}, "h", {"source": str(repo_dir)}, {}, "local", "claude")
    store.create_trial(run.id, 0, commit=base, knobs={}, rationale="", proposer="baseline")
    store.create_trial(run.id, 1, commit=repo.head.commit.hexsha, knobs={}, rationale="", proposer="claude")
    r = runner.invoke(app, ["-w", str(tmp_path), "diff", "0", "1"])
    assert r.exit_code == 0 and "+# faster" in r.output and "fakeserver.py" in r.output
    r = runner.invoke(app, ["-w", str(tmp_path), "diff", "0", "7"])
    assert r.exit_code == 2 and "no trial #7" in r.output
