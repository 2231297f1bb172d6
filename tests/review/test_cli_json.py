"""Every data command takes --json and prints one JSON document on stdout.

One test walks the CLI's whole command tree: each command is either a data command (it must take
--json, and its output must parse) or an action named here, so a new command has to be placed.
`trials --json` says of each row whether it is a trial or a measurement of one (`of`), and its
trials and measurements add up to the budget line the table prints. In-process, no server: ~5 s.
"""

import json

import typer
from review_runs import add_measurements
from typer.testing import CliRunner

from orchestrator.cli import app

runner = CliRunner()

# Commands that act rather than report; their output is a confirmation line (or a prompt).
ACTIONS = {"init", "approve", "reject", "steer", "bench", "shell", "model make", "gates verify", "gates relock",
           "kb approve", "kb reject", "hosts add", "hosts trust", "hosts remove"}


def _commands(group, prefix: str = "") -> dict:
    found = {}
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group (typer's vendored click: not the installed click's class)
            found |= _commands(cmd, f"{prefix}{name} ")
        else:
            found[f"{prefix}{name}"] = cmd
    return found


def _json(root, *args, ok=True):
    r = runner.invoke(app, ["-w", str(root), *args, "--json"], env={"COLUMNS": "200"})
    assert "Traceback" not in r.output, (args, r.output)
    assert (r.exit_code == 0) == ok, (args, r.exit_code, r.output)
    return json.loads(r.stdout)


def test_every_data_command_takes_json_and_its_output_parses(finished_run, tmp_path):
    root, store, rid = finished_run
    add_measurements(store, rid)
    sol = tmp_path / "sol.json"
    sol.write_text(json.dumps({"ceilings": {}, "floors": {"decode_tpot_ms": 1.02}}))
    entry = None
    calls = {  # each data command, as a user would call it on this workspace
        "status": [[]], "trials": [[], ["--status", "kept"]], "show": [["7"]], "why": [[], ["7"], ["10"]],
        "lineage": [["8"]], "export": [[]], "study": [[]], "log": [[]], "report": [[]], "floors": [[str(sol)]],
        "kb list": [[]], "kb search": [["batching"]], "kb show": [], "kb lint": [[]], "kb export": [[]],
        "hosts list": [[]],
    }
    refused = {  # data commands that need what this workspace lacks: their one error is JSON too
        "diff": ["0", "7"],  # the fake trials' commit c0ffee is in no repository
        "hosts check": ["nosuch"], "hosts clean": ["nosuch"],
        "goal": ["improve throughput by 2x within 0 trials"], "resume": [],  # run 1 finished
    }
    commands = _commands(typer.main.get_command(app))
    data = set(calls) | set(refused)
    assert set(commands) == data | ACTIONS, "a new command: add it to the data commands or to ACTIONS"
    for name in sorted(data):
        assert "--json" in [o for p in commands[name].params for o in p.opts], f"`infergoal {name}` lacks --json"
    for name, arg_lists in calls.items():
        for args in arg_lists:
            out = _json(root, *name.split(), *args)
            if name == "kb list":
                entry = out[0]["id"]
    assert _json(root, "kb", "show", entry)["id"] == entry
    for name, args in refused.items():
        out = _json(root, *name.split(), *args, ok=False)
        assert set(out) == {"outcome", "exit_code", "error"}, (name, out)


def test_trials_json_says_trial_or_measurement_and_matches_the_budget_line(finished_run):
    root, store, rid = finished_run
    add_measurements(store, rid)
    rows = _json(root, "trials")
    kinds = {r["number"]: (r["measurement"], r["of"]) for r in rows}
    assert kinds[0] == (False, None) and kinds[7] == (False, None)
    assert kinds[8] == (True, 7) and kinds[10] == (True, 0) and kinds[11] == kinds[12] == (True, 7)
    trials = sum(not r["measurement"] for r in rows)
    measured = sum(r["measurement"] for r in rows)
    line = f"{trials} of 12 trials +{measured} measurements"
    assert line == "9 of 12 trials +4 measurements"
    table = runner.invoke(app, ["-w", str(root), "trials"], env={"COLUMNS": "200"}).output
    assert f"run {rid}: {line}" in table
    assert _json(root, "status")[0]["budget_line"] == line == _json(root, "why")["budget_line"]
    used = _json(root, "why")["used"]
    assert (used["trials"], used["measurements"]) == (trials, measured)
    # Filtered, each row still says what it is.
    assert {(r["number"], r["measurement"]) for r in _json(root, "trials", "--where", "score>1.9")} == {(7, False), (8, True)}
