"""Contracts change only by a person: the loop proposes, `infergoal kb approve/reject` decides, finished_run."""

import json

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.knowledge import KnowledgeBase, parse_entry
from orchestrator.knowledge.approval import ApprovalError, propose_contract
from orchestrator.store import Store

runner = CliRunner()
CONTRACT = {"id": "contract-openai-stream-usage", "kind": "contract", "title": "Streams end with a usage chunk",
            "applies_to": {"engine": "*"}, "evidence": []}


def _ws(tmp_path):
    (tmp_path / "infergoal.toml").write_text('kb = "kb"\n')
    return tmp_path


def _cli(ws, *args):
    return runner.invoke(app, ["-w", str(ws), "kb", *args])


def test_proposal_is_pending_and_not_a_contract_until_approved(tmp_path):
    ws = _ws(tmp_path)
    (ws / ".infergoal").mkdir()
    store = Store(f"sqlite:///{ws / '.infergoal' / 'infergoal.db'}")  # the workspace's own store, as the CLI opens it
    path = propose_contract(ws / "kb", dict(CONTRACT), "\nEvery stream ends with usage.\n", reason="seen in run 3", store=store)
    assert parse_entry(path).status == "pending"
    kb = KnowledgeBase([ws / "kb"], write_dir=ws / "kb")
    assert CONTRACT["id"] not in kb.entries  # the loop's proposal is not read as a contract
    r = _cli(ws, "list", "--pending")
    assert r.exit_code == 0 and CONTRACT["id"] in r.output

    r = _cli(ws, "approve", CONTRACT["id"])
    assert r.exit_code == 0, r.output
    e = parse_entry(ws / "kb" / "contracts" / f"{CONTRACT['id']}.md")
    assert e.status == "confirmed" and e.meta["approved_by"]
    assert CONTRACT["id"] in KnowledgeBase([ws / "kb"], write_dir=ws / "kb").entries
    kinds = [ev.kind for ev in store.events(kind=None)]
    assert kinds == ["kb.propose", "kb.approve"]
    assert store.events(kind="kb.approve")[0].data["id"] == CONTRACT["id"]
    assert _cli(ws, "lint").exit_code == 0


def test_reject_and_unknown_ids_are_clear(tmp_path):
    ws = _ws(tmp_path)
    propose_contract(ws / "kb", dict(CONTRACT), "\nx\n", reason="r")
    r = _cli(ws, "approve", "contract-nope")
    assert r.exit_code == 2 and "no pending proposal" in r.output and CONTRACT["id"] in r.output
    r = _cli(ws, "reject", CONTRACT["id"], "--reason", "not general")
    assert r.exit_code == 0
    assert not (ws / "kb" / "pending" / f"{CONTRACT['id']}.md").exists()
    store = Store(f"sqlite:///{ws / '.infergoal' / 'infergoal.db'}")
    assert store.events(kind="kb.reject")[0].data["reason"] == "not general"
    with pytest.raises(ApprovalError, match="contract"):
        propose_contract(ws / "kb", {"id": "finding-x", "kind": "finding"}, "", reason="r")


def test_list_show_export_lint(tmp_path):
    ws = _ws(tmp_path)
    r = _cli(ws, "list", "--kind", "contract")
    assert r.exit_code == 0 and "contract-accuracy-is-gated" in r.output and "finding-" not in r.output
    assert "accuracy gate" in _cli(ws, "show", "contract-accuracy-is-gated").output
    assert _cli(ws, "show", "nope").exit_code == 2
    out = ws / "kb.json"
    assert _cli(ws, "export", "--out", str(out)).exit_code == 0
    ids = {e["id"] for e in json.loads(out.read_text())}
    assert "contract-accuracy-is-gated" in ids
    (ws / "kb" / "findings").mkdir(parents=True)
    (ws / "kb" / "findings" / "bad.md").write_text("---\nid: f\nkind: finding\ntitle: t\n---\nno status\n")
    r = _cli(ws, "lint")
    assert r.exit_code == 1 and "missing status" in r.output and "needs evidence" in r.output
