"""`python -m orchestrator.cli ...`: the same as the `infergoal` command."""

from orchestrator.cli import app

app()
