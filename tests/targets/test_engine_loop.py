"""Through the loop on the torch-free fake server: a flag the engine refuses is classified from its
log (`bad_flag`), a knob set breaking a constraint is recorded but never launched, and every
launched trial carries its engine fingerprint with the templated environment."""

import json

import pytest
from fake_target import write_fake_target
from own_trials import candidates

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.runs import start_run
from orchestrator.store import Store

pytestmark = pytest.mark.slow  # launches (fake) servers


def test_bad_flag_and_constraint_in_a_run(tmp_path, tiny_model):
    # A 4 ms baseline and a 2 ms winner (was 8 and 4: the same 2x): the winner is still kept and
    # confirmed by its paired A/B at the stop, and every bench (the baseline's two repeats, the six
    # paired halves) streams its tokens in half the time.
    target = write_fake_target(
        tmp_path / "fake.toml", choices=(4.0, 6.0, 2.0), extra_launch=" {{ flags }}",
        extra_knobs='[knobs.turbo]\ntype = "bool"\ndefault = false\nflag = "--turbo"\n'
                    '[env]\nFAKE_TPOT = "{{ tpot_ms }}"\n'
                    '[[constraints]]\nexpr = "tpot_ms != 6.0 or not turbo"\nmessage = "turbo needs 4 or 2 ms"\n',
    )
    steps = [{"turbo": True}, {"tpot_ms": 6.0, "turbo": True}, {"tpot_ms": 2.0}]
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    ws = Workspace(tmp_path, [f'target="{target}"', f'proposer="scripted:{tmp_path / "steps.json"}"',
                              "gates.accuracy=false", "gates.integrity=false", "bench.scale=0.5"])
    out = start_run(ws, parse_goal("beat the baseline by 40% on TPOT within 5 trials"))
    store = Store(ws.db_url)
    # The proposer's trials by position: on a busy host the loop adds its own (a baseline sentinel
    # when the host's state changed, a `retry`), which shift the trial numbers.
    t = dict(enumerate(candidates(store, out.run_id)))
    # fakeserver's argparse refuses --turbo: the log line says so, and so does the trial.
    assert t[1].status == "failed" and t[1].error.startswith("start-up failure (bad_flag): ")
    assert "unrecognized arguments: --turbo" in t[1].error and "ServerCrashed" in t[1].error
    assert t[2].status == "failed" and "constraint_violated, not launched" in t[2].error and "turbo needs" in t[2].error
    assert not t[2].launch_cmd and not (ws.run_dir(out.run_id) / f"trial-{t[2].number}").exists()
    assert t[3].status == "kept", [(x.number, x.proposer, x.status, x.error) for x in store.list_trials(out.run_id)]
    fp = json.loads((ws.run_dir(out.run_id) / f"trial-{t[3].number}" / "engine.json").read_text())
    assert fp["env"] == {"FAKE_TPOT": "2.0"} and fp["engine"] == "fake"
    assert {e.trial_id for e in store.events(out.run_id, kind="engine")} >= {t[0].id, t[1].id, t[3].id}
