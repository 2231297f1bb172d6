"""The run's Optuna study, stored beside the run so `optuna-dashboard URL` shows it, no export step.

Optuna's RDB schema has a table called `trials`, and so does the store: the two cannot share one
table namespace. So the study goes to the nearest place that is still "the store's database":
- PostgreSQL: the same database, in its own schema `optuna` (the URL carries
  `options=-csearch_path=optuna`, which both Optuna and optuna-dashboard pass through);
- SQLite: a sibling file next to the store (`infergoal.db` -> `infergoal.optuna.db`), since a
  SQLite file has a single namespace.
`study_storage_url(store.url)` says where; `infergoal study` prints the dashboard command.
A study another writer created live under the same name (a distributed search using Optuna's
RDB storage directly) is left alone; only a study this module wrote is rewritten.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import optuna
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from orchestrator.core.roles import MEASUREMENTS

__all__ = ["OPTUNA_SCHEMA", "StudyError", "save_study", "study_name", "study_storage_url"]

OPTUNA_SCHEMA = "optuna"
_WRITER = "infergoal.audit"
_SCORED = ("kept", "discarded", "needs_approval", "rejected")
_FAILED = ("failed", "invalid")


class StudyError(ValueError):
    """The store's URL has no place for an Optuna study (e.g. an in-memory SQLite database)."""


def study_name(run_id: int) -> str:
    """The study's name for run `run_id` (shared with any live RDB storage of the same run)."""
    return f"infergoal-run-{run_id}"


def study_storage_url(store_url: str) -> str:
    """Where the run's study lives for a store at `store_url` (see the module docstring)."""
    url = make_url(store_url)
    if url.get_backend_name() == "sqlite":
        db = url.database or ""
        if db in ("", ":memory:") or db.startswith("file::memory:"):
            raise StudyError("the store is an in-memory SQLite database; an Optuna study needs a file or a server")
        stem = db[: -len(".db")] if db.endswith(".db") else db
        return url.set(database=f"{stem}.optuna.db").render_as_string(hide_password=False)
    if url.get_backend_name() == "postgresql":
        query = dict(url.query)
        query["options"] = f"-csearch_path={OPTUNA_SCHEMA}"
        return url.set(query=query).render_as_string(hide_password=False)
    return url.render_as_string(hide_password=False)


def _ensure_schema(store_url: str) -> None:
    url = make_url(store_url)
    if url.get_backend_name() != "postgresql":
        return
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}"))
    finally:
        engine.dispose()


def _study_trials(run: Any, trials: list[Any]) -> list[optuna.trial.FrozenTrial]:
    from orchestrator.proposers.optspace import distributions
    from orchestrator.targets import TargetSpec
    from orchestrator.targets.space import active_only

    target = TargetSpec(**run.target)
    dists = distributions(target)
    out = []
    for t in trials:
        if t.proposer in MEASUREMENTS:  # re-measurements repeat a knob set
            continue
        # Conditional knobs (`when`): a trial carries only the knobs active under its values, as
        # Optuna's define-by-run trials do; one with knobs today's space lacks is not plottable.
        if not set(t.knobs) <= set(dists) or active_only(target, t.knobs) != t.knobs:
            continue
        params = {k: t.knobs[k] for k in dists if k in t.knobs}
        attrs = {"infergoal_number": t.number, "status": t.status, "proposer": t.proposer}
        if t.error:
            attrs["error"] = t.error[:500]
        for label, v in (t.objective or {}).items():
            attrs[label] = v
        try:
            if t.status in _SCORED and t.score:
                out.append(optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params},
                                                     value=t.score, user_attrs=attrs))
            elif t.status in _FAILED:
                out.append(optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params},
                                                     user_attrs=attrs, state=optuna.trial.TrialState.FAIL))
        except ValueError:
            continue  # a knob value outside today's space (the target changed since): not plottable
    return out


def build_study(store: Any, run_id: int, storage: Any = None) -> optuna.Study:
    """The run's trials as an Optuna study (in memory unless `storage` is given)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    run = store.get_run(run_id)
    if run is None:
        raise LookupError(f"no run with id {run_id}")
    study = optuna.create_study(study_name=study_name(run_id), storage=storage, direction="maximize")
    study.set_user_attr("writer", _WRITER)
    study.set_user_attr("goal", run.goal_text)
    study.add_trials(_study_trials(run, store.list_trials(run_id)))
    return study


def save_study(store: Any, run_id: int, store_url: str | None = None) -> str:
    """Write (or rewrite) run `run_id`'s study next to the store; return the storage URL.

    `store_url` is the store's full URL (`store.url` hides the password, so pass it when there is one).
    """
    store_url = store_url or store.url
    url = study_storage_url(store_url)
    _ensure_schema(store_url)
    storage = optuna.storages.RDBStorage(url)
    try:
        name = study_name(run_id)
        if name in optuna.get_all_study_names(storage):
            existing = optuna.load_study(study_name=name, storage=storage)
            if existing.user_attrs.get("writer") != _WRITER:
                return url  # a live study someone else keeps: theirs is the record
            optuna.delete_study(study_name=name, storage=storage)
        build_study(store, run_id, storage)
    finally:
        storage.remove_session()
        storage.engine.dispose()
    return url


def dashboard_command(url: str) -> str:
    return f"optuna-dashboard '{quote(url, safe=':/@+?=&-_.%')}'"
