"""Persistence for infergoal: runs, trials, measurements, gate results and the audit log.

``Store(url)`` works on any SQLAlchemy URL (SQLite by default, PostgreSQL by URL) and hands
out frozen records; see :mod:`orchestrator.store.store` for the full contract.
"""

from . import records
from .database import SchemaTooNew, StoreError
from .records import *  # noqa: F403 - the records and their status vocabularies, as records.__all__ names them
from .store import DuplicateTrial, NotFound, Store

__all__ = [*records.__all__, "DuplicateTrial", "NotFound", "SchemaTooNew", "Store", "StoreError"]
