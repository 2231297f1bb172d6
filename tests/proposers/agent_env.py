"""An engine repo for agent tests: the bench's torch-free fake server, committed in a fresh git repo.

The repo also holds a `gates/` folder and held-out data, so tests can check the agent cannot
reach them. `tpot_ms` is a knob; the agent's "structural change" edits the server's code so
each token costs half the knob's time, which the controller then measures as a ~2x TPOT gain.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import git
from fake_target import target_head

from orchestrator.agent.config import AgentConfig
from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import PACKAGE_ROOT
from orchestrator.hosts import get_host
from orchestrator.knowledge import KnowledgeBase
from orchestrator.targets import load_target
from orchestrator.trial.context import TrialContext

FAKESERVER = Path(__file__).resolve().parents[1] / "bench" / "fakeserver.py"
SLOW_LINE = "self.tpot_s = tpot_ms / 1000.0"
FAST_LINE = "self.tpot_s = tpot_ms / 8000.0  # decode eight tokens per step"


def make_engine_repo(tmp: Path) -> Path:
    repo_dir = tmp / "engine"
    (repo_dir / "gates" / "data").mkdir(parents=True)
    shutil.copy(FAKESERVER, repo_dir / "fakeserver.py")
    (repo_dir / "gates" / "thresholds.toml").write_text("kl_max = 0.01\n")
    (repo_dir / "gates" / "data" / "heldout.txt").write_text("secret held-out text\n")
    (repo_dir / ".gitignore").write_text("__pycache__/\n")
    repo = git.Repo.init(repo_dir)
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"])
    return repo_dir


def write_target(tmp: Path, repo_dir: Path) -> Path:
    t = tmp / "engine.toml"
    t.write_text(target_head("fake-engine", repo_dir) + '''launch = "{{ python }} {{ source }}/fakeserver.py --port {{ port }} --ttft-ms 5 --tpot-ms {{ tpot_ms }}"
[knobs.tpot_ms]
type = "categorical"
choices = [8.0, 6.0, 4.0]
default = 8.0
''')
    return t


def agent_config(base_url: str, **kw) -> AgentConfig:
    return AgentConfig(base_url=base_url, max_retries=3, retry_max_wait_s=0.2, request_timeout_s=20, **kw)


def make_ctx(tmp: Path, store, repo_dir: Path, goal: str = "beat the baseline by 50% on TPOT within 6 trials"):
    """A real TrialContext and KB for a run row, without starting anything."""
    target = load_target(write_target(tmp, repo_dir))
    spec = parse_goal(goal)
    run = store.create_run("agent test", spec.text, spec.model_dump(mode="json"), spec.digest,
                           target.model_dump(mode="json"), {}, "local", "claude")
    base = git.Repo(repo_dir).head.commit.hexsha
    ctx = TrialContext(run_id=run.id, goal=spec, target=target, host=get_host("local", state_dir=tmp / "state"),
                       store=store, model_dir=tmp, reference_dir=tmp, scenarios={}, run_dir=tmp / "runs" / str(run.id),
                       base_commit=base, source_dir=repo_dir)
    kb = KnowledgeBase([PACKAGE_ROOT / "knowledge_base"], write_dir=tmp / "kb")
    return ctx, kb
