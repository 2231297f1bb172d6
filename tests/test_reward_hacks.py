"""Through the whole loop: candidates that win on the metric by cheating are never the best.

A test-only target adds a `variant` knob to the real hfserve server: `half` serves the model
with half its layers dropped (genuinely faster, genuinely broken), `constant` puts a cheating
proxy in front of the server (answers ignore the prompt), `cache` a proxy replaying the reply of
any earlier prompt of the same length (35x "faster" on a bench of equal-length prompts), `split`
a proxy that scores prompts with the full model but generates with the half one. The scripted
proposer tries them all before an honest batching candidate. The gates must reject every cheat,
the store must say why, and the best candidate must be the honest one.
"""

import json
from pathlib import Path

import pytest
from fake_target import target_head
from own_trials import candidates

from orchestrator.config.goal import parse_goal
from orchestrator.config.workspace import Workspace
from orchestrator.report import write_report
from orchestrator.runs import start_run
from orchestrator.store import Store
from orchestrator.targets import load_target

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def _target(tmp_path: Path, half: Path) -> Path:
    tree = ROOT / "examples" / "hfserve"  # servers run in it: `python -m hfserve`
    cheats = ROOT / "tests" / "gates" / "cheats.py"
    # The shipped target's preload: the plain `python -m hfserve` launches (the baseline, `half`, the
    # honest candidate and the paired rounds) run in a local standby as the shipped target's do;
    # the proxies' `bash -c` launches start cold (orchestrator.hosts.standby.eligible).
    preload = json.dumps(list(load_target(ROOT / "examples" / "targets" / "hfserve.toml").preload))
    t = tmp_path / "hacks.toml"
    # ready_timeout_s: "split" starts two servers and a proxy at once: on a loaded 2-core CI box > 120 s once
    t.write_text(target_head("hfserve-hacks", tree, engine="hfserve", served_model_name="tiny", ready_timeout_s=300)
                 + f'''preload = {preload}
launch = """
{{% if variant in ("constant", "cache") %}}
bash -c "{{{{ python }}}} -m hfserve --model {{{{ model }}}} --port {{{{ port + 1 }}}} --served-model-name tiny --batching {{{{ batching }}}} &
 exec {{{{ python }}}} {cheats} --upstream http://127.0.0.1:{{{{ port + 1 }}}} --port {{{{ port }}}}
 --mode {{{{ 'constant' if variant == 'constant' else 'cache_len' }}}} --tokenizer {{{{ model }}}}"
{{% elif variant == "split" %}}
bash -c "{{{{ python }}}} -m hfserve --model {{{{ model }}}} --port {{{{ port + 1 }}}} --served-model-name tiny &
 {{{{ python }}}} -m hfserve --model {half} --port {{{{ port + 2 }}}} --served-model-name tiny --batching on &
 exec {{{{ python }}}} {cheats} --upstream http://127.0.0.1:{{{{ port + 1 }}}} --port {{{{ port }}}} --mode split
 --generator http://127.0.0.1:{{{{ port + 2 }}}} --tokenizer {{{{ model }}}}"
{{% else %}}
{{{{ python }}}} -m hfserve --port {{{{ port }}}} --served-model-name tiny --batching {{{{ batching }}}}
 --model {{% if variant == "half" %}}{half}{{% else %}}{{{{ model }}}}{{% endif %}}
{{% endif %}}
"""
[knobs.variant]
type = "categorical"
choices = ["honest", "half", "constant", "cache", "split"]
default = "honest"
[knobs.batching]
type = "categorical"
choices = ["off", "on"]
default = "off"
''')
    return t


@pytest.mark.timeout(1800)  # seven trials with real servers; the generation check judges each
def test_accuracy_breaking_winner_is_never_best(tmp_path, tiny_model):
    import gate_damage

    half = gate_damage.drop_layer(Path(tiny_model), tmp_path / "drop1", index=1)
    half = gate_damage.drop_layer(half, tmp_path / "half", index=1)
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([
        {"variant": "half", "batching": "on"},
        {"variant": "constant"},
        {"variant": "cache", "batching": "on"},
        {"variant": "split", "batching": "on"},
        {"variant": "honest", "batching": "on"},
    ]))
    ws = Workspace(tmp_path, [f'target="{_target(tmp_path, half)}"', f'proposer="scripted:{steps}"',
                              "bench.scale=0.5", "bench.baseline_repeats=1"])
    outcome = start_run(ws, parse_goal("improve throughput by 1.5x within 8 trials"))
    store = Store(ws.db_url)
    # The proposer's trials by position (baseline sentinels and paired rounds are the loop's own).
    t = dict(enumerate(candidates(store, outcome.run_id)))

    assert t[1].status == "invalid" and "accuracy gate" in t[1].error
    acc = [g for g in store.gate_results(t[1].id) if g.gate == "accuracy"]
    assert acc and acc[0].status == "fail" and acc[0].reason, "the reason is recorded in the store"

    assert t[2].status == "invalid" and "integrity gate" in t[2].error
    integ = [g for g in store.gate_results(t[2].id) if g.gate == "integrity"]
    assert integ[0].status == "fail" and "prompt" in integ[0].reason.lower()
    assert not store.measurements(t[2].id), "a rejected candidate is never benchmarked"

    # The length-keyed cache: distinct equal-length prompts all get one reply (integrity), and its
    # replies are judged against the reference prompt by prompt (accuracy).
    assert t[3].status == "invalid" and "gate" in t[3].error, t[3].error
    assert "no_cache" in t[3].error or "gen_" in t[3].error, t[3].error
    # Scoring by the full model, generating with the half one: only the generation check sees it.
    assert t[4].status == "invalid" and "accuracy gate" in t[4].error and "gen_" in t[4].error, t[4].error
    assert not store.measurements(t[3].id) and not store.measurements(t[4].id)

    best = store.get_trial(store.get_run(outcome.run_id).best_trial_id)
    assert best.knobs == {"variant": "honest", "batching": "on"} and best.score > 1.5
    md = write_report(store, outcome.run_id, tmp_path / "report").read_text()
    # the winner by its number: a host that stayed busier during the honest candidate makes the loop
    # re-run it (a `retry` trial), and the retry is the winner
    assert f"trial #{best.number}" in md and "Gate findings" in md
