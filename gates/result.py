"""The one value every gate returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["GateResult", "Status"]

Status = Literal["pass", "fail", "drift", "remeasure"]


@dataclass(frozen=True)
class GateResult:
    """Outcome of one gate run.

    Attributes:
        gate: which gate produced it (``"accuracy"``, ``"integrity"``, ``"performance"``, ``"lock"``).
        status: ``"pass"``; ``"fail"``; ``"drift"`` (accuracy only: inside the hard limits but
            measurably different, so the controller marks the trial ``needs_approval``);
            ``"remeasure"`` (performance only: the result is inside the noise band).
        reason: one human-readable line; for a failure it names the metric, its value and the limit.
        details: JSON-serialisable measurements and sub-check records.
        duration_s: wall time the gate took.
    """

    gate: str
    status: Status
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        """True only for a clean pass (``drift`` and ``remeasure`` are not passes)."""
        return self.status == "pass"
