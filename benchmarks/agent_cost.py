"""What one agent trial sends to the Messages API, measured on the stub: request sizes per call.

A scripted agent does what a real one does for one trial on hfserve (reads server.py in two
pages, greps, edits, syntax-checks, calls run_trial) against the Messages API stub, through the
real `anthropic` client. The stub records each request body; this prints characters per call,
split into the cacheable prefix (system + tools) and the conversation, and a token estimate
(4 characters per token: real counts depend on the model's tokenizer; the stub cannot know them).

Run: PYTHONPATH=.:tests:tests/proposers python benchmarks/agent_cost.py  (the tests' agent helpers)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import git  # noqa: E402
from agent_env import agent_config, make_ctx  # noqa: E402
from messages_api import API_KEY, MessagesAPI, tool_use, turn  # noqa: E402

from orchestrator.agent.client import price_per_mtok  # noqa: E402
from orchestrator.proposers.agent import AgentProposer  # noqa: E402

ASSUMED_OUTPUT_TOKENS = 250  # a tool call plus a few sentences of reasoning
from orchestrator.store import Store  # noqa: E402


def main() -> None:
    os.environ["ANTHROPIC_API_KEY"] = API_KEY
    tmp = Path(tempfile.mkdtemp())
    repo_dir = tmp / "engine"
    repo_dir.mkdir()
    shutil.copy(ROOT / "examples" / "hfserve" / "hfserve" / "server.py", repo_dir / "fakeserver.py")
    repo = git.Repo.init(repo_dir)
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"])
    store = Store("sqlite://")
    ctx, kb = make_ctx(tmp, store, repo_dir)
    script = [
        turn(tool_use("read_file", path="fakeserver.py")),
        turn(tool_use("read_file", path="fakeserver.py", offset=170)),
        turn(tool_use("read_file", path="fakeserver.py", offset=340)),
        turn(tool_use("grep", pattern="def _decode_step|batch")),
        turn(tool_use("edit_file", path="fakeserver.py", old="import argparse", new="import argparse  # agent")),
        turn(tool_use("run_command", command="python -m py_compile fakeserver.py")),
        turn(tool_use("run_trial", knobs={}, rationale="r", prediction="p")),
    ]
    with MessagesAPI(script) as api:
        p = AgentProposer(agent_config(api.base_url))
        p.bind(ctx, kb)
        p.propose(store.list_trials(ctx.run_id), ctx.target)
    prefix = len(json.dumps(api.requests[0]["system"])) + len(json.dumps(api.requests[0]["tools"]))
    price_in, price_out = price_per_mtok(p.cfg)
    total, dollars, before = 0, 0.0, 0
    print("call  prefix_chars  conversation_chars")
    for i, body in enumerate(api.requests, 1):
        conv = len(json.dumps(body["messages"]))
        total += conv
        print(f"{i:4d}  {prefix:12d}  {conv:18d}")
        # Estimate with the breakpoints the proposer sets: the prefix and everything up to the
        # previous call are cache reads (0.1x), the new part a cache write (1.25x).
        cached = (prefix if i > 1 else 0) + before
        written = (prefix if i == 1 else 0) + conv - before
        dollars += ((0.1 * cached + 1.25 * written) / 4 * price_in + ASSUMED_OUTPUT_TOKENS * price_out) / 1e6
        before = conv
    calls = len(api.requests)
    print(f"one trial: {calls} calls; cacheable prefix {prefix} chars (~{prefix // 4} tokens) per call; "
          f"conversation {total} chars (~{total // 4} tokens) summed over calls")
    print(f"estimated cost of this first trial with {p.cfg.model} (${price_in:g}/${price_out:g} per Mtok, "
          f"4 chars/token, {ASSUMED_OUTPUT_TOKENS} output tokens/call): ${dollars:.3f}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
