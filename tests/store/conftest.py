"""Store fixtures: one backend parameter drives every store test.

Backends: a SQLite file in ``tmp_path``, SQLite in memory, and PostgreSQL when
``INFERGOAL_TEST_PG_URL`` is set (``.ci/start_postgres.sh`` starts one and prints the URL).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from orchestrator.store import Store
from orchestrator.store.tables import Base

PG_ENV = "INFERGOAL_TEST_PG_URL"


@dataclass
class Backend:
    """A database to test against; ``open()`` returns a new Store on it, closed at teardown."""

    name: str
    url: str
    persistent: bool
    opened: list[Store] = field(default_factory=list)

    def open(self, **kwargs: float) -> Store:
        store = Store(self.url, **kwargs)
        self.opened.append(store)
        return store


def _wipe(url: str) -> None:
    # PostgreSQL outlives the test: start each test from empty tables.
    engine = create_engine(url)
    try:
        Base.metadata.drop_all(engine)
    finally:
        engine.dispose()


@pytest.fixture(
    params=[
        "sqlite-file",
        "sqlite-memory",
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each store backend in turn."""
    if request.param == "sqlite-file":
        b = Backend("sqlite-file", f"sqlite:///{tmp_path / 'nested' / 'dir' / 'infergoal.db'}", True)
    elif request.param == "sqlite-memory":
        b = Backend("sqlite-memory", "sqlite://", False)
    else:
        url = os.environ.get(PG_ENV)
        if not url:
            pytest.skip(f"set {PG_ENV} (e.g. from .ci/start_postgres.sh) to test PostgreSQL")
        _wipe(url)
        b = Backend("postgresql", url, True)
    yield b
    for store in b.opened:
        store.close()
    if b.name == "postgresql":
        _wipe(b.url)


@pytest.fixture
def store(backend: Backend) -> Store:
    """An open, empty store on the current backend."""
    return backend.open()
