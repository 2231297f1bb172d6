"""Targets: what is optimised — an engine's launch template, its knob space and its model."""

from orchestrator.targets.spec import Knob, TargetError, TargetSpec, load_target

__all__ = ["Knob", "TargetError", "TargetSpec", "load_target"]
