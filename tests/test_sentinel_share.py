"""Sentinels that cost little: the baseline is re-measured by count only while the re-measures stay within
the trust policy's `sentinel_share` of the run's trial time; a host whose state moved re-measures it
whatever the share (the bars on noise: tests/test_noisy_host.py)."""

from __future__ import annotations

from types import SimpleNamespace

import orchestrator.loop.controller as c
from orchestrator.hosts.measure import TrustPolicy
from orchestrator.loop.controller import Controller
from orchestrator.store import Store


class _Loop(Controller):
    """The real sentinel rule on a stored history; the host probe and the re-measure itself recorded, not run."""

    def __init__(self, ctx):
        super().__init__(ctx, SimpleNamespace(name="search"))
        self.sentinels = []

    def _baseline(self):
        t = [t for t in self.store.list_trials(self.ctx.run_id) if t.proposer in ("baseline", "sentinel")][-1]
        return SimpleNamespace(trial=t.number, host={})

    def _sentinel(self, reason):
        self.sentinels.append(reason)


def _ctx(rows, share=0.08):
    """rows: (proposer, seconds) after a baseline of 60 s."""
    store = Store("sqlite://")
    run = store.create_run("r", "g", {}, "h", {}, {}, "local", "search")
    for i, (proposer, secs) in enumerate([("baseline", 60.0), *rows]):
        t = store.create_trial(run.id, i, commit="", knobs={}, rationale="", proposer=proposer)
        store.finish_trial(t.id, "kept", score=1.0, timings={"trial": secs})
    return SimpleNamespace(store=store, run_id=run.id, on_step=lambda s: None, host=SimpleNamespace(),
                           trust=TrustPolicy(sentinel_share=share, probe_s=0.0))


def _check(ctx, moved=False, monkeypatch=None):
    loop = _Loop(ctx)
    monkeypatch.setattr(c, "idle_state", lambda host, s: {})
    monkeypatch.setattr(c, "state_change", lambda now, ref, policy: "host state moved" if moved else None)
    loop._sentinel_if_needed()
    return loop.sentinels


def test_a_count_sentinel_waits_while_it_would_pass_the_share(monkeypatch):
    # 4 trials of 30 s after a 60 s baseline: a 60 s sentinel would be 60 / 240 = 25% of the run
    assert _check(_ctx([("search", 30.0)] * 4), monkeypatch=monkeypatch) == []
    # without the limit it runs, as it always did
    assert _check(_ctx([("search", 30.0)] * 4, share=1.0), monkeypatch=monkeypatch) == ["4 trials since baseline #0"]


def test_a_count_sentinel_runs_once_the_run_has_time_for_it(monkeypatch):
    # 12 trials of 60 s: 60 / (60 + 720 + 60) = 7.1%, within 8%
    assert _check(_ctx([("search", 60.0)] * 12), monkeypatch=monkeypatch) == ["12 trials since baseline #0"]
    # a sentinel already spent counts: 60 + 60 of 900 s is 13%
    rows = [("search", 60.0)] * 6 + [("sentinel", 60.0)] + [("search", 60.0)] * 6
    assert _check(_ctx(rows), monkeypatch=monkeypatch) == []


def test_a_host_whose_state_moved_re_measures_whatever_the_share(monkeypatch):
    assert _check(_ctx([("search", 30.0)] * 4), moved=True, monkeypatch=monkeypatch) == ["host state moved"]
    assert _check(_ctx([("search", 30.0)]), moved=True, monkeypatch=monkeypatch) == ["host state moved"]
