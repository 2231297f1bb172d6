"""Reviewing runs: per-trial decisions (why), lineage, trial queries, exports, the Optuna study, and
the human actions of the audit log.

Everything here reads the store alone (never logs), so the answers hold after the run's
files are gone and on any machine that can reach the database.
"""

from orchestrator.review.actions import HUMAN_ACTIONS, decide, human_actions, record_action
from orchestrator.review.export import export_run
from orchestrator.review.lineage import LineageStep, lineage
from orchestrator.review.query import select_trials, trial_value
from orchestrator.review.study import save_study, study_name, study_storage_url
from orchestrator.review.why import Why, explain_run, explain_trial

__all__ = [
    "HUMAN_ACTIONS",
    "LineageStep",
    "Why",
    "decide",
    "explain_run",
    "explain_trial",
    "export_run",
    "human_actions",
    "lineage",
    "record_action",
    "save_study",
    "select_trials",
    "study_name",
    "study_storage_url",
    "trial_value",
]
