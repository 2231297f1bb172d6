"""Fixtures for the review tests: a finished run with every trial status, in a workspace."""

import pytest
from review_runs import build_run

from orchestrator.store import Store


@pytest.fixture
def finished_run(tmp_path):
    """(workspace root, store, run id): the ROWS run in `tmp_path/.infergoal/infergoal.db`."""
    state = tmp_path / ".infergoal"
    state.mkdir()
    store = Store(f"sqlite:///{state / 'infergoal.db'}")
    run_id = build_run(store, state)
    yield tmp_path, store, run_id
    store.close()
