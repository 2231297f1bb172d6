"""Targets: what is optimised — an engine's launch template, its knob space and its model."""

from orchestrator.targets.base import ConstraintViolated, Knob, KnobRule, TargetError
from orchestrator.targets.spec import TargetSpec, load_target

__all__ = ["ConstraintViolated", "Knob", "KnobRule", "TargetError", "TargetSpec", "load_target"]
