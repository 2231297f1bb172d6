"""The `infergoal` command line (pyproject's `infergoal = "orchestrator.cli:app"`).

One face, in modules that each own a group of commands: `main` (the app, its global options,
goal/resume and the run views; `live` drives a run on the terminal), `review` (why, lineage,
export, study, log, shell, floors), `kb` (`infergoal kb ...`), `hosts` (`infergoal hosts ...`),
`shell` (`infergoal shell`, the `/goal` prompt).
They share `common` (workspace, store, who) and `errors` (one `error:` line and an exit code);
only `main` imports the others.
"""

from orchestrator.cli.main import app

__all__ = ["app"]
