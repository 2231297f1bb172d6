"""Report fixtures: the review tests' run with every trial status (tests/review/review_runs.py)."""


import pytest
from review_runs import build_run  # noqa: E402

from orchestrator.store import Store  # noqa: E402


@pytest.fixture
def full_run(tmp_path):
    """(store, run id, folder): a finished run with every trial status, an agent's cost and a KB entry."""
    store = Store(f"sqlite:///{tmp_path / 'infergoal.db'}")
    yield store, build_run(store, tmp_path), tmp_path
    store.close()
