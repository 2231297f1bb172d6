"""infergoal's immutable gate suite: integrity, accuracy and performance gates.

Every file in this package (code, ``thresholds.toml``, the held-out text in ``data/``) is hashed
into ``gates.lock``; :func:`verify_lock` refuses to go on when any of them changed. Submodules:
:mod:`gates.accuracy`, :mod:`gates.integrity`, :mod:`gates.performance`, :mod:`gates.diffscan`,
:mod:`gates.lock`. Heavy dependencies (torch, transformers) load only when a gate runs.
"""

from __future__ import annotations

from gates.lock import GateTampered, relock
from gates.lock import verify as verify_lock
from gates.result import GateResult, Status
from gates.thresholds import load_thresholds

__all__ = ["GateResult", "GateTampered", "Status", "load_thresholds", "relock", "verify_lock"]
