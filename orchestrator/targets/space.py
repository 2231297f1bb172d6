"""The knob space's structure: conditional knobs (`when`) and constraints between knobs.

Both are evaluated before launch. A conditional knob exists only while the knobs it names have
the given values (Optuna's define-by-run: the proposer asks for it only then); a constraint is a
jinja2 expression over the active knobs, so a combination the engine refuses at start-up
(`max_num_batched_tokens (512) is smaller than max_model_len (1024)`) is never deployed.
"""

from __future__ import annotations

from typing import Any

import jinja2

from orchestrator.targets.base import ConstraintViolated, Knob, Target, TargetError

__all__ = ["active_only", "check_constraints", "check_space", "is_active"]

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


def is_active(knob: Knob, values: dict[str, Any]) -> bool:
    """Whether `knob` exists given the (earlier) knobs' `values`; a missing parent means no."""
    for parent, want in knob.when.items():
        if parent not in values:
            return False
        allowed = want if isinstance(want, list) else [want]
        if values[parent] not in allowed:
            return False
    return True


def active_only(target: Target, values: dict[str, Any]) -> dict[str, Any]:
    """`values` restricted to the knobs active under them, in declaration order."""
    out: dict[str, Any] = {}
    for name, knob in target.knobs.items():
        if name in values and is_active(knob, out):
            out[name] = values[name]
    return out


def _context(target: Target, knobs: dict[str, Any]) -> dict[str, Any]:
    return {name: knobs.get(name) for name in target.knobs}


def check_constraints(target: Target, knobs: dict[str, Any]) -> None:
    """Raise `ConstraintViolated` naming the first constraint these active knobs break."""
    if target.variants:  # the engine as a knob: the chosen engine's own constraints
        sub, own = target.resolve(knobs)
        check_constraints(sub, own)
    ctx = _context(target, knobs)
    for c in target.constraints:
        try:
            ok = _ENV.compile_expression(c.expr, undefined_to_none=False)(**ctx)
        except (jinja2.TemplateError, TypeError) as e:
            raise TargetError(f"target {target.name}: constraint {c.expr!r} cannot be evaluated: {e}") from None
        if not ok:
            shown = ", ".join(f"{k}={ctx[k]!r}" for k in target.knobs if k in c.expr and k in knobs)
            raise ConstraintViolated(f"constraint {c.expr!r} broken by {shown or 'these knobs'}" + (f": {c.message}" if c.message else ""))


def check_space(target: Target, where: str) -> None:
    """Load-time checks: `when` names earlier knobs with possible values, constraints compile,
    flag pairs belong to bools, and the defaults satisfy every constraint (trial #0 must start)."""
    seen: dict[str, Knob] = {}
    for name, knob in target.knobs.items():
        for parent, want in knob.when.items():
            if parent not in seen:
                raise TargetError(f"{where}: knobs.{name}.when names {parent!r}, which is not a knob declared before it")
            p = seen[parent]
            possible = [True, False] if p.type == "bool" else list(p.choices or [])
            for v in want if isinstance(want, list) else [want]:
                if possible and v not in possible:
                    raise TargetError(f"{where}: knobs.{name}.when: {parent} can never be {v!r} (choices {possible})")
        if knob.false_flag and knob.type != "bool":
            raise TargetError(f"{where}: knobs.{name}: `false_flag` is only for bool knobs")
        seen[name] = knob
    for c in target.constraints:
        try:
            _ENV.compile_expression(c.expr)
        except jinja2.TemplateSyntaxError as e:
            raise TargetError(f"{where}: constraint {c.expr!r} is not a valid expression: {e}") from None
    try:
        check_constraints(target, target.baseline_knobs())
    except TargetError as e:
        raise TargetError(f"{where}: the knobs' defaults (the baseline) break a constraint: {e}") from None
