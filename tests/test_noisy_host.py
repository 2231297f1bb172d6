"""Speedups that survive a noisy host: real load (CPU burners the test owns) on the example target.

The load is switched on and off from the controller's step callback, so it lands exactly where the
test wants it: only while the baseline is measured, or only while a candidate is. Gates are off
(they have their own tests); the performance judging, the sentinels, the redo of untrusted
measurements and the paired A/B confirmation are all real.

Both sides run one torch thread (`hfserve_target.one_thread_target`): the test's own burners are
then the load it measures, not the erratic stalls of 2 OpenMP threads beside whatever else shares
the machine.
"""

import json
import sys
import threading

import pytest
from burners import Burners
from fake_target import write_fake_target
from hfserve_target import one_thread_target

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.hosts import site
from orchestrator.runs import start_run
from orchestrator.store import Store

# ~2.5 min for the two hfserve runs and the fake one on a quiet 2-core machine (more beside other jobs).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

BATCHED = {"decode_loop": "manual", "batching": "on", "max_batch_size": 8}
FAST = ["bench.scale=0.5", "bench.baseline_repeats=1", "gates.accuracy=false", "gates.integrity=false"]


def _hf_ws(tmp_path, name, steps):
    d = tmp_path / name
    d.mkdir()
    f = d / "steps.json"
    f.write_text(json.dumps(steps))
    return Workspace(d, [*FAST, f'proposer="scripted:{f}"', f'target="{one_thread_target(d)}"'])


def _measurable(out):
    """A host so busy that the bench client itself is saturated gives no number at all (by design):
    nothing can be asserted about speedups then, so the test says so instead of failing."""
    if "too busy to measure" in out.stop_reason:
        pytest.skip(f"host too busy to measure here: {out.stop_reason[:200]}")


def _paired(store, run_id):
    return [e.data for e in store.events(run_id, kind="paired")]


_STORES: dict[str, Store] = {}


def _trials(ws):
    """The run's trials, read by a step callback: one Store per workspace (opening one checks the
    schema, ~0.14 s, and ~4x that beside the GIL hog: 7.7 s of the saturated-client test's steps)."""
    store = _STORES.get(ws.db_url)
    if store is None:
        store = _STORES[ws.db_url] = Store(ws.db_url)
    run = store.latest_run()
    return store.list_trials(run.id) if run else []


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, tiny_model):
    """Load during a candidate only: the burners run through the batched candidate's first measurement
    and stop at its redo (or at its first step that is no bench). Its paired A/B at the stop runs
    with no burner of ours: it is also the module's quiet paired ratio (`quiet`)."""
    burn = Burners()
    ws = _hf_ws(tmp_path_factory.mktemp("mirror"), "m", [BATCHED])

    def on_step(step):
        trials = _trials(ws)
        if step.startswith("bench") and trials and trials[-1].proposer == "scripted" and burn.started == 0:
            burn.start()  # the candidate's first measurement only
        elif burn.running and not (step.startswith("bench") and not step.endswith("redo")):
            burn.stop()

    try:
        out = start_run(ws, parse_goal("improve throughput by 1.2x within 2 trials"), on_step=on_step)
    finally:
        burn.stop()
    _measurable(out)
    return ws, out, burn


@pytest.fixture(scope="module")
def quiet(mirror):
    """A quiet paired A/B of the baseline and the batched knob set: the candidate-only run's, whose
    rounds ran after the burners stopped (a run of its own for it was ~55 s of the module)."""
    ws, out, _ = mirror
    paired = _paired(Store(ws.db_url), out.run_id)
    assert out.stop_reason.startswith("GoalMet") and paired, out.stop_reason
    return paired[-1]


def _not_inflated(loaded: dict, quiet: dict) -> bool:
    """The loaded run's paired ratio is not above the quiet one's: by at most 25%, or by both of their own bootstrap
    intervals' spread where those are wider. The load sat on the baseline, so a verdict that used it reads the
    candidate faster than it is (the burners slow the baseline ~2x); the paired rounds re-measure both sides.
    Lower is not checked: two quiet paired estimates on a shared 2-core host differ with the others' load there
    (a fresh-clone CI run: 2.58 [2.41, 2.77] against the quiet 3.45 [3.18, 3.78], no burner running in either:
    contention cuts the batched candidate's gain more than the baseline's)."""
    spread = lambda p: max(p["hi"] / p["score"], p["score"] / p["lo"]) - 1  # noqa: E731
    return loaded["score"] / quiet["score"] - 1 < max(0.25, spread(loaded) + spread(quiet))


def test_load_during_the_baseline_only_gives_no_false_goal_met(tmp_path, quiet):
    burn = Burners()
    ws = _hf_ws(tmp_path, "loaded", [BATCHED])

    def on_step(step):
        trials = _trials(ws)
        if step.startswith("bench") and len(trials) == 1 and burn.started == 0:
            burn.start()  # the baseline's first measurement, and only it
        elif burn.running and (step.endswith("redo") or not step.startswith("bench")):
            burn.stop()

    # Out of reach for the truth (the quiet paired ratio), within reach of a baseline measured under load.
    goal = f"improve throughput by {quiet['score'] * 1.3:.2f}x within 2 trials"
    try:
        out = start_run(ws, parse_goal(goal), on_step=on_step)
    finally:
        burn.stop()
    store = Store(ws.db_url)
    assert burn.started == 1
    assert not out.stop_reason.startswith("GoalMet"), out.stop_reason
    _measurable(out)
    trials = store.list_trials(out.run_id)
    used = [e.data for e in store.events(out.run_id, kind="measure.host") if e.trial_id == trials[0].id]
    paired = _paired(store, out.run_id)
    # The load was seen: the baseline's measurement was refused and redone after it lifted (client
    # saturated), or used with the foreign load recorded for the sentinel / paired rounds to correct.
    assert used[0]["attempts"] > 1 or used[0]["window"]["foreign_load"] > 1.0, used
    if not paired:
        # No claim was started: the candidate did not screen as meeting a goal 1.3x past its true
        # ratio (the loaded baseline redone quietly, or slowed less than that; a fresh-clone CI run
        # took this path), so there is no paired verdict to check.
        cand = next(t for t in trials if t.proposer == "scripted")
        assert cand.score is not None and cand.score < quiet["score"] * 1.3, (cand.score, quiet, out.stop_reason)
        return
    reported = paired[-1]
    assert not reported["met"]
    assert _not_inflated(reported, quiet), (reported, quiet)
    assert "paired speedup" in out.stop_reason


def test_load_during_a_candidate_only_is_remeasured_not_discarded(mirror):
    ws, out, burn = mirror
    store = Store(ws.db_url)
    trials = store.list_trials(out.run_id)
    t1 = next(t for t in trials if t.proposer == "scripted")
    redo = [e for e in store.events(out.run_id, kind="measure.redo") if e.trial_id == t1.id]
    assert burn.started == 1 and redo, [e.message for e in store.events(out.run_id)]
    assert any(w in redo[0].message for w in ("busier", "lagged", "core")), redo[0].message
    # Not discarded: kept on a redone measurement, or (when other tenants kept the host busier than at
    # the baseline through every redo) invalid, then re-run against a fresh baseline and kept.
    retry = [t for t in trials if t.proposer == "retry" and t.knobs == t1.knobs]
    assert t1.status == "kept" or (t1.status == "invalid" and "untrusted" in t1.error and retry
                                   and retry[0].status == "kept"), (t1.status, t1.error, [(t.status, t.error) for t in retry])
    # Confirmed on paired rounds with no load of ours: the module's quiet reference (`quiet`).
    assert out.stop_reason.startswith("GoalMet") and _paired(store, out.run_id)[-1]["met"], out.stop_reason


class _GilHog:
    """A busy thread in the client's own process: its event loop wakes late, as when saturated."""

    def __init__(self) -> None:
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.started = 0

    def start(self) -> None:
        if self.thread:
            return
        self.started += 1
        self.old = sys.getswitchinterval()
        # The hog keeps the GIL 25 ms at a time. The client's loop then lags (median) 0.75-0.9x that when
        # the GIL changes hands promptly and 1.7-2.8x when it does not (measured at 20, 30 and 50 ms:
        # 14.8; 51; 46 and 92-142 ms), and each hogged measurement takes longer in proportion: at 50 ms
        # they were 95 of the test's 109 s once. 25 ms keeps the prompt case near twice the 10 ms limit.
        sys.setswitchinterval(0.025)
        self.stop_event.clear()
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        while not self.stop_event.is_set():
            pass

    def stop(self) -> None:
        if self.thread:
            self.stop_event.set()
            self.thread.join()
            self.thread = None
            sys.setswitchinterval(self.old)


def test_saturated_client_measurement_is_invalid_and_repeated(tmp_path, tiny_model, monkeypatch):
    # Both candidates are slower than the baseline (8 and 6 ms vs 4 ms): candidate 1 is discarded on
    # its measurement, candidate 2 (invalid: lagged on every attempt) is re-run by the loop against a
    # fresh baseline once the host is calm (a `retry`) and discarded there. So no winner is left for a
    # paired A/B at the stop (6 more servers, each round redone while the host is busier), which this
    # test does not judge. (With candidate 2 at 2 ms its retry was kept and confirmed at the stop.)
    target = write_fake_target(tmp_path / "fake.toml", choices=(4.0, 8.0, 6.0))
    f = tmp_path / "steps.json"
    f.write_text(json.dumps([{"tpot_ms": 8.0}, {"tpot_ms": 6.0}]))
    # The decode scenario at 16 output tokens (8 requests, 1 warm-up), not bench.scale 0.5's 32 (2 warm-up):
    # a hogged measurement lasts as many of the hog's GIL turns as the client's loop wakes for chunks;
    # the median lag it judges is the same. A clean one is 0.55 s at the baseline's 4 ms (over the
    # 0.3 s minimum, `TrustPolicy.min_seconds`), with the 8 requests `TrustPolicy.min_requests` asks.
    (tmp_path / "scenarios.toml").write_text(
        '[decode]\nprompt_tokens = 16\noutput_tokens = 16\nnum_requests = 8\nconcurrency = 1\nwarmup_requests = 1\n'
        'seed = 2\nprimary_metric = "tpot_ms_mean"\ndirection = "lower"\n')
    ws = Workspace(tmp_path, [f'target="{target}"', f'proposer="scripted:{f}"', "gates.accuracy=false",
                              "gates.integrity=false", "bench.scale=0.5", "bench.timeout_s=10",
                              'bench.scenarios="scenarios.toml"'])
    hog = _GilHog()
    # The hog runs while the client sends a measurement's requests (where the lag is judged), not through
    # the rest of its bench step: the host-state snapshots and /proc walks around it, starved of the GIL,
    # were most of each hogged attempt's 8-40 s (the requests themselves 1-3 s).
    bench, armed = site.run_scenario_sync, []

    def hogged_bench(*args, **kw):
        if armed:
            hog.start()
        try:
            return bench(*args, **kw)
        finally:
            hog.stop()
    monkeypatch.setattr(site, "run_scenario_sync", hogged_bench)

    def on_step(step):
        trials = _trials(ws)
        n = sum(1 for t in trials if t.proposer == "scripted") if trials and trials[-1].proposer == "scripted" else 0
        if not step.startswith("bench") or (n == 1 and step.endswith("redo")):
            armed.clear()
        elif (n == 1 and hog.started == 0) or n == 2:
            armed[:] = [True]  # candidate 1: its first measurement only; candidate 2: every attempt

    try:
        out = start_run(ws, parse_goal("beat the baseline by 90% on TPOT within 3 trials"), on_step=on_step)
    finally:
        hog.stop()
    store = Store(ws.db_url)
    t1, t2 = [t for t in store.list_trials(out.run_id) if t.proposer == "scripted"]
    redo1 = [e.message for e in store.events(out.run_id, kind="measure.redo") if e.trial_id == t1.id]
    assert redo1 and "lagged" in redo1[0], redo1
    used = [e.data for e in store.events(out.run_id, kind="measure.host") if e.trial_id == t1.id]
    assert used[0]["attempts"] == 2 and not used[0]["untrusted"]
    assert t1.status in ("kept", "discarded") and t1.score, "the repeated measurement was used"
    assert t2.status == "invalid" and "untrusted measurement" in t2.error and "lagged" in t2.error
    assert not store.measurements(t2.id), "an untrusted measurement is never stored as a result"
