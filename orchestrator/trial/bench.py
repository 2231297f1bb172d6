"""The bench step of one trial (`TrialBench`): every goal scenario measured, each measurement redone until
it can be trusted and stored as it is taken; a screen's short pass and the full bench continuing it; the
draw of prompts each measurement asks; where an SLO scenario's rate search starts (`reached_rate`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.bench.counts import count_violation
from orchestrator.bench.passes import join
from orchestrator.bench.prompts import derived_seed
from orchestrator.bench.slo import slo_measure
from orchestrator.config.goal import SLO_SCENARIO
from orchestrator.core.oneline import plain_number
from orchestrator.hosts import Proc
from orchestrator.hosts.measure import bench_trusted
from orchestrator.hosts.site import Site
from orchestrator.trial.context import TrialContext, TrialResult, objective_label

__all__ = ["TrialBench", "reached_rate"]


def reached_rate(store: Any, run_id: int, trial: Any, scenario: str) -> float | None:
    """The SLO rate (`slo_rate` of `scenario`) that `trial`'s knob set and commit reached in this run's
    newest finished trial of them (kept or discarded: a measurement the run used), or None.

    A paired round's half, a sentinel (the baseline's knobs), a retry or a re-run after a resume
    measures a server the run already searched: its rate search brackets around that rate instead
    of climbing from the scenario's start rate (`orchestrator.bench.rate.find_rate`'s `near`). Only
    where the steps go changes; each is measured and judged as before, so a server that moved is
    followed there."""
    for t in reversed(store.list_trials(run_id)):
        if t.id == trial.id or t.status not in ("kept", "discarded") or t.commit != trial.commit or t.knobs != trial.knobs:
            continue
        rates = [m.value for m in store.measurements(t.id) if m.scenario == scenario and m.metric == "slo_rate"]
        if rates and rates[-1] > 0:
            return rates[-1]
    return None



@dataclass
class TrialBench:
    """The bench step of one trial: every scenario, each measurement redone until it can be trusted."""

    ctx: TrialContext
    trial: Any
    base_url: str
    trial_dir: Path
    proc: Proc
    site: Site
    host_ref: dict[str, Any] | None
    caps: dict[str, Any] | None = None
    outputs: list[tuple[Any, list[Any]]] = field(default_factory=list)
    """(scenario, measured requests) of every measurement used: what the bench audit samples."""
    draw: int = 0
    """This trial's draw of prompts: every measurement's `Scenario.prompt_seed` follows from it (`prompt_seed`)."""
    firsts: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    """Goal scenario -> (result, host window) of its short pass's first requests (`Scenario.part`), which
    the full bench continues (`orchestrator.bench.passes`)."""
    gpus: int = 1
    """GPUs the trial's server took: `output_throughput_per_gpu` is the host's tok/s over them."""

    def prompt_seed(self, rep: int, attempt: int) -> int:
        """The prompts of measurement `rep`'s `attempt` (0 = first): the trial's draw for the first attempt of
        the first, one derived from it otherwise. Every measurement asks prompts no earlier one asked (each
        scenario has its own `seed` too), and two trials handed one draw ask alike, redone attempts included."""
        if rep == 0 and attempt == 0:
            return self.draw
        return derived_seed(self.draw, rep) if attempt == 0 else derived_seed(self.draw, rep, attempt)

    def screen(self, screen: Any, result: TrialResult) -> str | None:
        """The short pass of `screen`; an error, or None. Screened out: `result` holds the short pass."""
        short, t0 = TrialResult(), time.perf_counter()
        err = self.run(1, short, scenarios=screen.scenarios, tag=f"@{screen.fraction:g}", plan=screen.plan,
                       order=screen.order or None)
        if err:
            result.status_hint = short.status_hint
            return err
        why = screen.judge(short, time.perf_counter() - t0)
        if why:
            result.samples, result.metrics, result.host = short.samples, short.metrics, short.host
            result.screened, result.status_hint, result.error = True, "discarded", why
        return None

    def run(self, repeats: int, result: TrialResult, first_repeat: int = 0, scenarios: dict[str, Any] | None = None,
            tag: str = "", plan: Callable[..., tuple[Any, dict[str, float] | None]] | None = None,
            order: Sequence[str] | None = None) -> str | None:
        """Measure each goal scenario `repeats` times; return an error, or None. `scenarios` replaces the
        run's (a screen's short pass, stored as `NAME{tag}`), `order` the goal's order of them;
        `plan(goal scenario, the objectives measured so far, after_stop=a scenario before was stopped early)`:
        (the `StopRule` that scenario is stopped early by on the host (`Scenario.stop`), or None; None, or
        objective label -> value where it is not run at all and those values stand for it), a screen's
        (`orchestrator.trial.fidelity.Screen.plan`)."""
        ctx, store = self.ctx, self.ctx.store
        stopped = False
        for goal_name in order or ctx.goal.scenarios:
            name = goal_name + tag
            for rep in range(first_repeat, first_repeat + repeats):
                scenario = (scenarios or ctx.scenarios)[goal_name]
                # A continuation (the rest of a short pass) is the first repeat; any later one is whole and fresh.
                first = self.firsts.get(goal_name) if scenario.part is not None and scenario.part[0] > 0 else None
                if scenario.part is not None and scenario.part[0] > 0 and (first is None or rep != first_repeat):
                    scenario, first = ctx.scenarios[goal_name], None
                rule, skip = plan(goal_name, result.samples, after_stop=stopped) if plan is not None and first is None else (None, None)
                if skip is not None:  # certain to score under the bar: not run, its objectives at the values given
                    ctx.on_step(f"bench {name}: not run (out of reach of the screen's bar)")
                    for label, value in skip.items():
                        result.samples.setdefault(label, []).append(float(value))
                    stopped = True
                    break
                if rule is not None:  # travels with the scenario to the host's bench, which stops it there
                    scenario = scenario.model_copy(update={"stop": rule})
                label = f"bench {name}" + (f" #{rep + 1}" if repeats > 1 or rep else "")
                if rule is not None:
                    label += " (stopped once out of reach of the screen's bar)"
                if first is not None:
                    lo, hi = scenario.part
                    label += f" (requests {lo + 1}-{hi} of {hi}, after the short pass's {lo})" if hi > lo else \
                        f" (all {hi} requests measured in the short pass)"
                ctx.on_step(label)

                def bench_one(scenario: Any) -> Any:
                    return self.site.bench(self.base_url, ctx.target.served_model_name, scenario, tokenizer=ctx.tokenizer,
                                           tokenizer_dir=str(ctx.model_dir), api=ctx.target.api,
                                           timeout_s=ctx.request_timeout_s, capabilities=self.caps)

                slo = goal_name == SLO_SCENARIO and ctx.goal.slo is not None
                near = reached_rate(store, ctx.run_id, self.trial, name) if slo else None

                tries: list[int] = []

                def once(scenario: Any = scenario, label: str = label, slo: bool = slo, near: float | None = near,
                         tries: list[int] = tries, rep: int = rep, first: Any = first) -> Any:
                    # A fresh draw per attempt; a continuation asks the rest of its short pass's draw.
                    drawn = first[0].scenario.prompt_seed if first is not None else self.prompt_seed(rep, len(tries))
                    tries.append(drawn)
                    scenario = scenario.model_copy(update={"prompt_seed": drawn})
                    if slo:  # the rate search, every step a bench; near the rate this knob set already reached
                        return slo_measure(ctx.goal.slo, scenario, bench_one, ctx.rate, near=near,
                                           on_step=lambda st: ctx.on_step(f"{label}: {plain_number(st.rate)} req/s "
                                                                          f"{'ok' if st.passed else 'broke'}"))
                    return bench_one(scenario)

                def redo(attempt: int, reasons: list[str], name: str = name, label: str = label) -> None:
                    ctx.on_step(f"{label}: redo")
                    store.add_event(ctx.run_id, "measure.redo", f"{name}: redone ({'; '.join(reasons)})",
                                    data={"scenario": name, "attempt": attempt, "reasons": reasons}, trial_id=self.trial.id)

                if first is not None and scenario.measured_requests == 0:
                    # Nothing left: a one-wave scenario was measured whole by the short pass, once.
                    res, win, untrusted, attempts = None, first[1], [], 0
                else:
                    res, win, untrusted, attempts = bench_trusted(once, ctx.host, self.proc, ref=self.host_ref,
                                                                  policy=ctx.trust, on_redo=redo)
                    store.add_event(ctx.run_id, "measure.host", f"{name} #{rep}: load {win['load1']:.2f}, others' runnable "
                                    f"{win.get('foreign_load', float('nan')):.2f}/CPU, steal {win['steal']:.0%}, "
                                    f"client {win['client_cpu']:.0%}",
                                    data={"scenario": name, "repeat": rep, "attempts": attempts, "window": win,
                                          "untrusted": untrusted, **({"part": list(scenario.part)} if scenario.part else {}),
                                          "prompts": {"seed": scenario.seed, "prompt_seed": res.scenario.prompt_seed,
                                                      **({"redone_with": tries[:-1]} if len(tries) > 1 else {})}},
                                    trial_id=self.trial.id)
                if first is not None and not untrusted and (res is None or res.metrics.get("failed", 0) == 0):
                    # One measurement of the whole scenario: the short pass's requests and these, over both
                    # passes' records, as a single full bench computes it; meta["passes"] says which came from which.
                    lo = scenario.part[0]
                    res = join(ctx.scenarios[goal_name], [first[0]] + ([res] if res is not None else []),
                               labels=(f"short pass (requests 1-{lo}, before the gates)",
                                       f"continued (requests {lo + 1}-{scenario.part[1]}, after the gates)")[:1 if res is None else 2],
                               capabilities=self.caps)
                    scenario = res.scenario  # the whole scenario, with the draw its passes asked
                (self.trial_dir / f"bench-{name}-{rep}.json").write_text(res.to_json())
                if res.meta.get("slo_error"):  # no rate met the SLO: nothing to score, the trial does not count
                    store.add_measurements(self.trial.id, name, res.metrics, repeat=rep)
                    return res.meta["slo_error"]
                if res.metrics.get("failed", 0) > 0:
                    store.add_measurements(self.trial.id, name, res.metrics, repeat=rep)
                    reasons = ", ".join(f"{k}: {v}" for k, v in (res.failures or {}).items())
                    return f"{int(res.metrics['failed'])} of {scenario.measured_requests} requests failed in {name} ({reasons})"
                bad_counts = count_violation(res.metrics, goal_name)
                if bad_counts:  # outputs shorter/longer than asked, or usage that disagrees with the ids
                    store.add_measurements(self.trial.id, name, res.metrics, repeat=rep)
                    result.status_hint = "invalid"
                    return bad_counts
                if untrusted:  # never judged on: not stored as a measurement
                    return f"untrusted measurement in {name} after {attempts} attempts: {'; '.join(untrusted)}"
                if "output_throughput" in res.metrics:  # per host and per GPU, for goals and the report
                    res.metrics["output_throughput_per_gpu"] = res.metrics["output_throughput"] / self.gpus
                metrics = dict(res.metrics)
                if first is not None:  # which requests came from which pass, beside the numbers
                    metrics.update(short_pass_requests=float(first[0].scenario.measured_requests),
                                   continued_requests=float(len(res.requests) - first[0].scenario.measured_requests))
                store.add_measurements(self.trial.id, name, metrics, repeat=rep)
                if scenario.part is not None and scenario.part[0] == 0:
                    self.firsts[goal_name] = (res, win)  # the full bench may continue it; audited with it then
                else:
                    self.outputs.append((res.scenario, res.requests))  # with its draw: the audit asks its prompts
                result.host.append(win)
                result.metrics[goal_name] = dict(res.metrics)
                stopped = stopped or bool(res.metrics.get("stopped_early"))
                for o in ctx.goal.objectives:
                    if o.scenario == goal_name:
                        result.samples.setdefault(objective_label(goal_name, o.key), []).append(float(res.metrics[o.key]))
        return None
