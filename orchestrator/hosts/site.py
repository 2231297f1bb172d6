"""Where measurement runs: the seam between a trial and the host its server runs on.

A trial asks its host for a `Site`, then places the engine tree and the model, verifies the
gate files, runs the gates and the bench through it. `LocalSite` does all of that in this
process (the host is this machine); `orchestrator.hosts.ssh.RemoteSite` syncs the trees to the
host and runs the gates and the bench there, next to the server, so a WAN never sits inside
the numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from gates import GateResult, accuracy, audit, integrity
from gates.lock import verify
from orchestrator.bench import Scenario, ScenarioResult, run_scenario_sync
from orchestrator.remote.modelcache import cached_copy

__all__ = ["LocalSite", "Site"]


class Site(Protocol):
    """What a trial needs from the place its server runs."""

    python: str | None
    """Python that runs the engine there (None = this interpreter)."""

    def place(self, path: str | Path, *, kind: str = "tree") -> str:
        """Make the local folder `path` available there; return its path there.

        `kind`: "tree" (the engine's source, may change every trial) or "model" / "reference" /
        "tokenizer" (fixed for the run)."""
        ...

    def verify_gates(self) -> None:
        """Re-hash the gate files the gates will run from; raise GateTampered on any difference."""
        ...

    def integrity(self, base_url: str, **kw: Any) -> GateResult: ...

    def accuracy(self, base_url: str, **kw: Any) -> GateResult: ...

    def audit(self, **kw: Any) -> GateResult:
        """Score measured requests' outputs with the reference (`gates.audit.check`), where it is loaded."""
        ...

    def bench(self, base_url: str, model: str, scenario: Scenario, *, tokenizer: Any, tokenizer_dir: str,
              api: str, timeout_s: float, capabilities: dict[str, Any] | None = None) -> ScenarioResult: ...

    def facts(self) -> dict[str, Any]:
        """What this trial ran on (host fingerprint, engine tree digest, model hash); {} when local."""
        ...


class LocalSite:
    """Everything in this process: paths are used as they are, except the model where the host keeps
    a RAM-backed copy of it (`model_cache`: orchestrator.remote.modelcache)."""

    python = None

    def __init__(self, model_cache: Path | None = None) -> None:
        self.model_cache = model_cache

    def place(self, path: str | Path, *, kind: str = "tree") -> str:
        if kind == "model" and self.model_cache is not None:
            return str(cached_copy(path, self.model_cache))
        return str(path)

    def verify_gates(self) -> None:
        verify()

    def integrity(self, base_url: str, **kw: Any) -> GateResult:
        return integrity.check(base_url, **kw)

    def accuracy(self, base_url: str, **kw: Any) -> GateResult:
        return accuracy.check(base_url, **kw)

    def audit(self, **kw: Any) -> GateResult:
        return audit.check(**kw)

    def bench(self, base_url: str, model: str, scenario: Scenario, *, tokenizer: Any, tokenizer_dir: str,
              api: str, timeout_s: float, capabilities: dict[str, Any] | None = None) -> ScenarioResult:
        return run_scenario_sync(base_url, model, scenario, tokenizer=tokenizer, api=api, timeout_s=timeout_s,
                                 capabilities=capabilities)

    def facts(self) -> dict[str, Any]:
        return {}
