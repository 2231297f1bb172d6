"""The audit package's public surface, pinned (a rename is a deliberate act)."""

import orchestrator.review as audit
from orchestrator.report import html


def test_public_names():
    assert sorted(audit.__all__) == sorted([
        "HUMAN_ACTIONS", "LineageStep", "Why", "decide", "explain_run", "explain_trial", "export_run",
        "human_actions", "lineage", "record_action", "save_study", "select_trials", "study_name",
        "study_storage_url", "trial_value",
    ])
    assert all(hasattr(audit, name) for name in audit.__all__)
    assert html.__all__ == ["build_html_data", "write_html_report"]
