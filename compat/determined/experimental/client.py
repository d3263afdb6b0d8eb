"""``determined.experimental.client``: Determined 0.38.1's SDK client, over det's database.

Names, signatures and return shapes follow 0.38.1 (``login``, ``create_experiment``,
``get_experiment``, ``get_trial``, ``get_checkpoint``, ``create_model``, ``get_model``,
``list_experiments``, ``get_workspace`` and the ``Experiment``, ``Trial``, ``Checkpoint``,
``Model``, ``ModelVersion`` objects they return). Each call does what the matching ``det``
command does, through the same code: :mod:`det.submission` to create, :mod:`det.queries` to
read, the SQL functions the CLI calls to act (``det_user.experiment_action``,
``det_user.model_register_version``...), the CLI's checkpoint download. It connects as the CLI does
(see :mod:`determined.experimental._session` for who it acts as and ``login``), one
transaction per call. Errors are det's (:mod:`det.errors`), with the database's message.
"""

import dataclasses
import datetime
import enum
import json
import pathlib
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from psycopg.types.json import Jsonb

from det import context
from det.errors import NotFoundError, StateError
from det.harness.storage import storage_from_config
from det.queries import experiments as exp_queries
from det.queries import trials as trial_queries
from det.queries.checkpoints import ranked_checkpoints
from det.queries.workspaces import get_workspace as _workspace_row
from det.queries.workspaces import placement, workspace_defaults
from det.reconciler.searchers.live import with_live_progress
from det.sql import named
from det.states import TERMINAL
from det.submission import (
    context_with,
    expand_config_text,
    refuse_unfit,
    template_for_submission,
)
from determined.experimental._session import db, login

__all__ = ["Checkpoint", "CheckpointSortBy", "CheckpointState", "DownloadMode", "Experiment",
           "ExperimentState", "Model", "ModelVersion", "OrderBy", "Trial", "TrialMetrics",
           "TrialState", "Workspace", "create_experiment", "create_model", "get_checkpoint",
           "get_experiment", "get_model", "get_trial", "get_workspace", "list_experiments",
           "login"]

Q = named("sdk")
READ = named("queries")


class ExperimentState(enum.Enum):
    """An experiment's state (0.38's values; det's experiments take the first nine)."""

    ACTIVE = "STATE_ACTIVE"
    PAUSED = "STATE_PAUSED"
    STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
    STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
    STOPPING_KILLED = "STATE_STOPPING_KILLED"
    STOPPING_ERROR = "STATE_STOPPING_ERROR"
    COMPLETED = "STATE_COMPLETED"
    CANCELED = "STATE_CANCELED"
    ERROR = "STATE_ERROR"
    DELETED = "STATE_DELETED"
    DELETING = "STATE_DELETING"
    DELETE_FAILED = "STATE_DELETE_FAILED"
    QUEUED = "STATE_QUEUED"
    PULLING = "STATE_PULLING"
    STARTING = "STATE_STARTING"
    RUNNING = "STATE_RUNNING"


TrialState = enum.Enum("TrialState", {s.name: s.value for s in list(ExperimentState)
                                      if not s.name.startswith("DELET")})
TrialState.__doc__ = "A trial's state (0.38's values)."

TERMINAL_STATES = {ExperimentState[s] for s in TERMINAL}


class CheckpointState(enum.Enum):
    """A checkpoint's state: 0.38's, and det's DELETING (its files are being removed)."""

    ACTIVE = "STATE_ACTIVE"
    COMPLETED = "STATE_COMPLETED"
    ERROR = "STATE_ERROR"
    DELETED = "STATE_DELETED"
    PARTIALLY_DELETED = "STATE_PARTIALLY_DELETED"
    DELETING = "STATE_DELETING"


class OrderBy(enum.Enum):
    """Sort order (0.38's ``ASC``/``DESC`` with their long aliases)."""

    ASC = "ORDER_BY_ASC"
    DESC = "ORDER_BY_DESC"
    ASCENDING = ASC
    DESCENDING = DESC


class CheckpointSortBy(enum.Enum):
    """What checkpoints are sorted by when not by a named validation metric."""

    UUID = "SORT_BY_UUID"
    TRIAL_ID = "SORT_BY_TRIAL_ID"
    BATCH_NUMBER = "SORT_BY_BATCH_NUMBER"
    END_TIME = "SORT_BY_END_TIME"
    STATE = "SORT_BY_STATE"
    SEARCHER_METRIC = "SORT_BY_SEARCHER_METRIC"


class DownloadMode(enum.Enum):
    """0.38's ways to download a checkpoint. det has no master to download through: every
    mode reads the checkpoint's storage directly, as ``det checkpoint download`` does."""

    DIRECT = "direct"
    MASTER = "master"
    AUTO = "auto"


METRICS_PAGE = 1000
"""Rows per read of :meth:`Trial.iter_metrics` and :meth:`Trial.logs`."""


def _state(enum_type: type[enum.Enum], name: str) -> Any:
    return enum_type[name]


@dataclasses.dataclass
class TrialMetrics:
    """One metrics report of a trial (0.38's shape): ``steps_completed`` in batches,
    ``end_time`` when it was stored, ``trial_run_id`` the run (det's allocation run number,
    from 1) that reported it."""

    trial_id: int
    trial_run_id: int
    steps_completed: int
    end_time: datetime.datetime
    metrics: dict[str, Any]
    group: str
    batch_metrics: list[dict[str, Any]] | None = None


@dataclasses.dataclass
class CheckpointTrainingMetadata:
    """Where a checkpoint came from (0.38's ``Checkpoint.training``)."""

    experiment_config: dict[str, Any]
    experiment_id: int
    trial_id: int
    hparams: dict[str, Any]
    validation_metrics: dict[str, Any]


class Checkpoint:
    """A checkpoint, by uuid: ``state``, ``metadata``, ``resources`` (file -> bytes),
    ``report_time`` and ``training`` (its trial, experiment and validation metrics)."""

    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
        self.state: CheckpointState | None = None
        self.metadata: dict[str, Any] | None = None
        self.resources: dict[str, Any] | None = None
        self.report_time: datetime.datetime | None = None
        self.training: CheckpointTrainingMetadata | None = None
        self._storage: dict[str, Any] | None = None

    @classmethod
    def _from_row(cls, row: dict) -> "Checkpoint":
        c = cls(row["uuid"])
        c._hydrate(row)
        return c

    def _hydrate(self, row: dict) -> None:
        self.state = _state(CheckpointState, row["state"])
        self.metadata = row["metadata"]
        self.resources = row["resources"]
        self.report_time = row["reported_at"]
        self._storage = row["storage"]
        self.training = CheckpointTrainingMetadata(
            experiment_config=row["experiment_config"], experiment_id=row["experiment_id"],
            trial_id=row["trial_id"], hparams=row["hparams"],
            validation_metrics={"avgMetrics": row["validation"] or {}})

    def reload(self) -> None:
        """Read the checkpoint again. Raises NotFoundError (det.errors)."""
        with db() as conn:
            self._hydrate(_checkpoint_row(conn, self.uuid))

    def download(self, path: str | None = None, mode: DownloadMode = DownloadMode.AUTO) -> str:
        """Copy the checkpoint's files from its storage into ``path`` (default:
        ``checkpoints/<uuid>`` under the working directory), as ``det checkpoint download``
        does (links are left out; any ``mode``: see :class:`DownloadMode`), unless ``path``
        already holds a checkpoint (its ``metadata.json``); writes ``metadata.json`` (the
        checkpoint's metadata) if the checkpoint lacks one, as 0.38 does. Returns the directory.

        Raises:
            det.errors.StateError: the checkpoint is not COMPLETED.
        """
        if self.state is None:
            self.reload()
        if self.state != CheckpointState.COMPLETED:
            raise StateError(f"checkpoint {self.uuid} is {self.state.name}: only COMPLETED "
                             "checkpoints can be downloaded")
        local = pathlib.Path(path) if path is not None else pathlib.Path("checkpoints", self.uuid)
        if not (local / "metadata.json").exists():
            storage_from_config(self._storage).download(self.uuid, local)
        if not (local / "metadata.json").exists():
            (local / "metadata.json").write_text(json.dumps(self.metadata or {}, indent=2))
        return str(local)

    def delete(self) -> None:
        """Have det delete the checkpoint's files (``det checkpoint delete``): it becomes
        DELETING, then a GC task removes them. Raises what det_user.delete_checkpoints refuses
        (a pinned checkpoint, one of a live experiment) as det's errors."""
        with db() as conn:
            conn.execute(Q.delete_checkpoints, ([self.uuid],))
        self.state = CheckpointState.DELETING

    def add_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata``'s top-level keys into the checkpoint's metadata (a key already
        there takes the new value); det's row, not the storage's ``metadata.json``, as in
        0.38 (det_user.checkpoint_add_metadata: Editor of its workspace).

        Raises:
            det.errors.DetError: ``metadata`` is not a JSON object, or the result is over
                64 KiB or nested deeper than 32 levels (a task's rule for metadata).
        """
        with db() as conn:
            self.metadata = conn.execute(Q.checkpoint_add_metadata,
                                         (self.uuid, Jsonb(metadata))).fetchone()["m"]

    def __repr__(self) -> str:
        return f"Checkpoint(uuid={self.uuid})"


def _checkpoint_row(conn, uuid: str) -> dict:
    row = conn.execute(Q.checkpoints, {"experiment": None, "trial": None,
                                       "uuid": uuid.strip()}).fetchone()
    if row is None:
        raise NotFoundError(f"checkpoint {uuid} not found")
    return row


def metric_order(sort_by: "str | CheckpointSortBy | None", order_by: OrderBy | None,
                 searcher: dict) -> tuple[str | None, bool | None]:
    """The validation metric and direction (smaller first?) that ``sort_by`` and ``order_by``
    mean: a metric's name in ``order_by``'s direction; neither, or
    ``CheckpointSortBy.SEARCHER_METRIC``: the searcher's metric (``searcher``: the experiment
    config's section), by default in its direction (0.38's rule). ``(None, None)`` for another
    ``CheckpointSortBy``, which sorts by a column.

    Raises:
        ValueError: only one of ``sort_by`` and ``order_by`` given, or a ``sort_by`` of
            another type (0.38's rule).
    """
    if (sort_by is None) != (order_by is None):
        raise ValueError("sort_by and order_by: give both, or neither")
    if sort_by is not None and not isinstance(sort_by, (str, CheckpointSortBy)):
        raise ValueError(f"sort_by: expected a CheckpointSortBy or a metric name, not "
                         f"{sort_by!r}")
    if sort_by is None or sort_by == CheckpointSortBy.SEARCHER_METRIC:
        smaller = (searcher.get("smaller_is_better", True) is not False if order_by is None
                   else order_by == OrderBy.ASC)
        return searcher.get("metric"), smaller
    if isinstance(sort_by, str):
        return sort_by, order_by == OrderBy.ASC
    return None, None


def _list_checkpoints(experiment: int | None, trial: int | None, sort_by, order_by,
                      max_results: int | None) -> list[Checkpoint]:
    """The COMPLETED checkpoints of ``experiment`` or ``trial``: by a metric in the order
    det.queries.checkpoints ranks them for `det experiment download` alike (those without
    the metric last, then the latest first), or by a column (:func:`metric_order`)."""
    with db() as conn:
        rows = conn.execute(Q.checkpoints, {"experiment": experiment, "trial": trial,
                                            "uuid": None}).fetchall()
        if experiment is None:
            experiment = trial_queries.get_trial(conn, trial)["experiment_id"]
        config = exp_queries.get_experiment(conn, experiment)["config"]
        metric, smaller = metric_order(sort_by, order_by, config.get("searcher") or {})
        if metric is not None:
            rank = {r["uuid"]: i for i, r in enumerate(ranked_checkpoints(
                conn, experiment=experiment, trial=trial, metric=metric,
                smaller_is_better=smaller))}
    done = [r for r in rows if r["state"] == "COMPLETED"]
    if metric is not None:
        done.sort(key=lambda r: rank.get(r["uuid"], len(rank)))
    else:
        key = {CheckpointSortBy.UUID: "uuid", CheckpointSortBy.TRIAL_ID: "trial_id",
               CheckpointSortBy.BATCH_NUMBER: "steps_completed",
               CheckpointSortBy.END_TIME: "reported_at", CheckpointSortBy.STATE: "state"}[sort_by]
        done.sort(key=lambda r: r[key], reverse=order_by == OrderBy.DESC)
    return [Checkpoint._from_row(r) for r in done[:max_results]]


def _top_checkpoint(what: str, experiment: int | None, trial: int | None,
                    sort_by: str | None, smaller_is_better: bool | None) -> Checkpoint:
    warnings.warn(f"{what}.top_checkpoint() has been deprecated and will be removed in a "
                  f"future version. Please call {what}.list_checkpoints(..., max_results=1) "
                  "instead.", FutureWarning, stacklevel=3)
    order_by = (OrderBy.ASC if smaller_is_better else OrderBy.DESC) if sort_by else None
    found = _list_checkpoints(experiment, trial, sort_by, order_by, 1)
    if not found:
        raise AssertionError(f"No checkpoints found for {what.lower()} "
                             f"{experiment if trial is None else trial}")
    return found[0]


class Trial:
    """A trial: ``id``, ``experiment_id``, ``hparams``, ``state``, ``summary_metrics``
    (its best validation's value)."""

    def __init__(self, trial_id: int) -> None:
        self.id = trial_id
        self.experiment_id: int | None = None
        self.hparams: dict[str, Any] | None = None
        self.state: Any = None
        self.summary_metrics: dict[str, Any] | None = None

    def _hydrate(self, row: dict) -> None:
        self.experiment_id = row["experiment_id"]
        self.hparams = row["hparams"]
        self.state = _state(TrialState, row["state"])
        self.summary_metrics = {"best_validation": row["best_validation"]}

    def reload(self) -> None:
        """Read the trial again. Raises NotFoundError."""
        with db() as conn:
            self._hydrate(trial_queries.get_trial(conn, self.id))

    def logs(self, follow: bool = False, *, head: int | None = None,
             tail: int | None = None) -> Iterator[str]:
        """The trial's log lines, oldest first, as its code wrote them (``det trial logs``
        without det's prefixes): the first ``head`` or the last ``tail``; with ``follow``,
        the new ones as they come until the trial ends.

        Raises:
            ValueError: both ``head`` and ``tail``, or a negative one.
        """
        if head is not None and tail is not None:
            raise ValueError("head and tail: give one of them, not both")
        if (head or 0) < 0 or (tail or 0) < 0:
            raise ValueError("head, tail: expected 0 or more lines")
        after, left = 0, head
        if tail is not None:
            with db() as conn:
                rows = conn.execute(READ.trial_logs_tail,
                                    {"trial": self.id, "limit": tail}).fetchall()
                after = conn.execute(READ.last_trial_log_id,
                                     {"trial": self.id}).fetchone()["id"]
            yield from (r["line"] for r in reversed(rows))
            if not follow:
                return
        while left is None or left > 0:
            with db() as conn:
                ended = trial_queries.get_trial(conn, self.id)["state"] in TERMINAL
                rows = conn.execute(READ.trial_logs_after, {
                    "trial": self.id, "after": after,
                    "limit": METRICS_PAGE if left is None else min(left, METRICS_PAGE)}).fetchall()
            for r in rows:
                yield r["line"]
            if rows:
                after = rows[-1]["id"]
                left = None if left is None else left - len(rows)
            elif not follow or ended:
                return
            else:
                time.sleep(0.5)

    def iter_metrics(self, group: str) -> Iterator[TrialMetrics]:
        """The trial's metrics of ``group`` (``"training"``, ``"validation"`` or any group its
        code reported), in the order reported, the runs a later run superseded left out."""
        after = 0
        while True:
            with db() as conn:
                rows = conn.execute(Q.metrics, {"trial": self.id, "group": group, "after": after,
                                                "limit": METRICS_PAGE}).fetchall()
            for r in rows:
                yield TrialMetrics(trial_id=self.id, trial_run_id=r["run"],
                                   steps_completed=r["steps_completed"],
                                   end_time=r["reported_at"], metrics=r["values"], group=group)
            if len(rows) < METRICS_PAGE:
                return
            after = rows[-1]["id"]

    def list_checkpoints(self, sort_by: "str | CheckpointSortBy | None" = None,
                         order_by: OrderBy | None = None,
                         max_results: int | None = None) -> list[Checkpoint]:
        """The trial's COMPLETED checkpoints, sorted as :func:`_list_checkpoints` says."""
        return _list_checkpoints(None, self.id, sort_by, order_by, max_results)

    def top_checkpoint(self, sort_by: str | None = None,
                       smaller_is_better: bool | None = None) -> Checkpoint:
        """The trial's best checkpoint (deprecated in 0.38, as there). Raises AssertionError
        when it has none."""
        return _top_checkpoint("Trial", None, self.id, sort_by, smaller_is_better)

    def __repr__(self) -> str:
        return f"Trial(id={self.id})"


class Experiment:
    """An experiment: ``id``, and as of the last :meth:`reload` ``config`` (expanded),
    ``state``, ``name``, ``description``, ``archived``, ``progress`` (0 to 1)."""

    def __init__(self, experiment_id: int) -> None:
        self._id = experiment_id
        self.config: dict[str, Any] | None = None
        self.state: ExperimentState | None = None
        self.name: str | None = None
        self.description: str | None = None
        self.archived: bool | None = None
        self.progress: float | None = None

    @property
    def id(self) -> int:
        return self._id

    def reload(self) -> None:
        """Read the experiment again. Raises NotFoundError."""
        with db() as conn:
            row = with_live_progress(conn, exp_queries.get_experiment(conn, self._id))
        self.config, self.name = row["config"], row["name"]
        self.description, self.archived = row["description"], row["archived"]
        self.state, self.progress = _state(ExperimentState, row["state"]), row["progress"]

    def _action(self, action: str) -> None:
        with db() as conn:
            exp_queries.get_experiment(conn, self._id)
            conn.execute(Q.experiment_action, (self._id, action))

    def activate(self) -> None:
        """Resume the trials from their latest checkpoints (``det experiment activate``)."""
        self._action("activate")

    def pause(self) -> None:
        """Trials checkpoint and stop, freeing their slots (``det experiment pause``)."""
        self._action("pause")

    def cancel(self) -> None:
        """Trials checkpoint and stop for good (``det experiment cancel``)."""
        self._action("cancel")

    def kill(self) -> None:
        """Trials stop now, without a checkpoint (``det experiment kill``)."""
        self._action("kill")

    def wait(self, interval: float = 5.0) -> ExperimentState:
        """Block until the experiment ends, checking every ``interval`` seconds; returns its
        end state (COMPLETED, CANCELED or ERROR).

        Raises:
            ValueError: it is PAUSED (it would never end; 0.38's rule).
        """
        waited = 0.0
        while True:
            self.reload()
            if self.state in TERMINAL_STATES:
                return self.state
            if self.state == ExperimentState.PAUSED:
                raise ValueError(f"Experiment {self.id} is in paused state. Make sure the "
                                 "experiment is active.")
            time.sleep(interval)
            waited += interval
            if waited % 60 == 0:
                print(f"Waiting for Experiment {self.id} to complete. Elapsed "
                      f"{waited / 60} minutes", file=sys.stderr)

    def list_trials(self) -> list[Trial]:
        """The experiment's trials, by id."""
        with db() as conn:
            exp_queries.get_experiment(conn, self._id)
            ids = [r["id"] for r in conn.execute(Q.trial_ids, {"id": self._id}).fetchall()]
            rows = [trial_queries.get_trial(conn, i) for i in ids]
        trials = []
        for row in rows:
            t = Trial(row["id"])
            t._hydrate(row)
            trials.append(t)
        return trials

    def await_first_trial(self, interval: float = 0.1) -> Trial:
        """Wait (every ``interval`` seconds) until the experiment has a trial; return it.

        Raises:
            RuntimeError: the experiment ended before it made one.
        """
        while True:
            self.reload()
            trials = self.list_trials()
            if trials:
                return trials[0]
            if self.state in TERMINAL_STATES:
                raise RuntimeError("This experiment has terminated before a trial was started. "
                                   f"Experiment is in state {self.state}.")
            time.sleep(interval)

    def list_checkpoints(self, sort_by: "str | CheckpointSortBy | None" = None,
                         order_by: OrderBy | None = None,
                         max_results: int | None = None) -> list[Checkpoint]:
        """The experiment's COMPLETED checkpoints, sorted as :func:`_list_checkpoints` says."""
        return _list_checkpoints(self._id, None, sort_by, order_by, max_results)

    def top_checkpoint(self, sort_by: str | None = None,
                       smaller_is_better: bool | None = None) -> Checkpoint:
        """The experiment's best checkpoint (deprecated in 0.38, as there). Raises
        AssertionError when it has none."""
        return _top_checkpoint("Experiment", self._id, None, sort_by, smaller_is_better)

    def __repr__(self) -> str:
        return f"Experiment(id={self.id})"


class ModelVersion:
    """A model's version: ``model_name``, ``model_version`` (from 1), ``checkpoint``,
    ``name``, ``metadata``, ``notes``."""

    def __init__(self, model_version: int, model_name: str) -> None:
        self.model_version = model_version
        self.model_name = model_name
        self.checkpoint: Checkpoint | None = None
        self.name: str | None = None
        self.metadata: dict[str, Any] | None = None
        self.notes: str | None = None

    def __repr__(self) -> str:
        return f"ModelVersion(model_name={self.model_name}, version={self.model_version})"


class Model:
    """A model of the registry: ``name``, ``model_id``, ``description``, ``labels``,
    ``metadata``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model_id: int | None = None
        self.description: str | None = None
        self.labels: list[str] | None = None
        self.metadata: dict[str, Any] | None = None

    def _hydrate(self, row: dict) -> None:
        self.name, self.model_id = row["name"], row["id"]
        self.description, self.labels, self.metadata = (row["description"], row["labels"],
                                                        row["metadata"])

    def register_version(self, checkpoint_uuid: str) -> ModelVersion:
        """Register a COMPLETED checkpoint as the model's next version (``det model
        register-version``; the checkpoint is then pinned). Raises det's errors for what
        det_user.model_register_version refuses."""
        with db() as conn:
            row = conn.execute(Q.model_register_version, (self.name, checkpoint_uuid)).fetchone()
        return self._versions(row["version"])[0]

    def get_versions(self, order_by: OrderBy = OrderBy.DESC) -> list[ModelVersion]:
        """The model's versions, newest first (``order_by=OrderBy.ASC``: oldest first)."""
        versions = self._versions(None)
        return versions if order_by == OrderBy.ASC else versions[::-1]

    def _versions(self, version: int | None) -> list[ModelVersion]:
        with db() as conn:
            model_id = conn.execute(READ.find_model, {"model": self.name}).fetchone()["id"]
            rows = conn.execute(READ.model_versions,
                                {"id": model_id, "version": version}).fetchall()
            checkpoints = {r["checkpoint_uuid"]: _checkpoint_row(conn, r["checkpoint_uuid"])
                           for r in rows}
        out = []
        for r in rows:
            v = ModelVersion(r["version"], self.name)
            v.checkpoint = Checkpoint._from_row(checkpoints[r["checkpoint_uuid"]])
            v.name, v.metadata, v.notes = r["name"], r["metadata"], r["notes"]
            out.append(v)
        return out

    def __repr__(self) -> str:
        return f"Model(name={self.name})"


@dataclasses.dataclass
class Workspace:
    """A workspace: ``id`` and ``name``."""

    id: int
    name: str


def create_experiment(config: str | pathlib.Path | dict, model_dir: str | None = None,
                      includes: Iterable[str | pathlib.Path] | None = None,
                      project_id: int | None = None, template: str | None = None) -> Experiment:
    """Submit an experiment as ``det experiment create CONFIG MODEL_DIR`` does (the same
    validation, workspace defaults, context packing and one transaction through
    det_user.create_experiment); it starts ACTIVE. ``config``: a YAML file's path or the config as
    a dict; ``model_dir``: the context directory (default: the working directory);
    ``includes``: files or directories added at the context's top level; ``project_id``: the
    project it goes to (default: the config's workspace/project, else Uncategorized);
    ``template``: a template merged under the config.

    Raises:
        det.errors.ConfigError: an invalid config (naming the key), or the pool's agents could
            never run one trial.
        det.errors.ContextError: an unusable context or include.
        det.errors.PermissionDeniedError: no Editor role where it goes.
    """
    if isinstance(config, dict):
        import yaml

        text, source = yaml.safe_dump(config, sort_keys=False), "config"
    elif isinstance(config, (str, pathlib.Path)):
        from det.configs import read_config_file

        text, source = read_config_file(pathlib.Path(config)), str(config)
    else:
        raise TypeError(f"config: expected a YAML file's path or a dict, not "
                        f"{type(config).__name__}")
    ctx_dir = pathlib.Path(model_dir if model_dir is not None else ".")
    with db() as conn:
        workspace, project = placement(conn, text, source, None, None, project_id)
        tpl = template_for_submission(conn, template, workspace) if template else None
        defaults = workspace_defaults(conn, workspace)
    with context_with(ctx_dir, [pathlib.Path(p) for p in includes or ()]) as ctx:
        expanded, original = expand_config_text(text, source, ctx, tpl, defaults=defaults)
        blob = context.pack(ctx)
    with db() as conn:
        refuse_unfit(conn, expanded)
        exp_id = conn.execute(Q.create_experiment, (Jsonb(expanded), original, blob, workspace,
                                                   project)).fetchone()["id"]
    exp = Experiment(exp_id)
    exp.reload()
    return exp


def get_experiment(experiment_id: int) -> Experiment:
    """The experiment. Raises NotFoundError (none that the user may view)."""
    exp = Experiment(experiment_id)
    exp.reload()
    return exp


def get_trial(trial_id: int) -> Trial:
    """The trial. Raises NotFoundError."""
    trial = Trial(trial_id)
    trial.reload()
    return trial


def get_checkpoint(uuid: str) -> Checkpoint:
    """The checkpoint of this uuid. Raises NotFoundError."""
    with db() as conn:
        return Checkpoint._from_row(_checkpoint_row(conn, uuid))


def create_model(name: str, description: str | None = "",
                 metadata: dict[str, Any] | None = None) -> Model:
    """Create an empty model, yours, in Uncategorized (``det model create``), with
    ``metadata`` (a JSON object) set in the same transaction. Raises det's errors for a
    taken or unacceptable name or metadata."""
    with db() as conn:
        conn.execute(Q.model_create, (name, description or ""))
        if metadata:
            conn.execute(Q.model_set_metadata, (name, Jsonb(metadata)))
    return get_model(name)


def get_model(identifier: str | int) -> Model:
    """The model of this name (any case) or id. Raises NotFoundError."""
    with db() as conn:
        model_id = conn.execute(READ.find_model, {"model": str(identifier)}).fetchone()["id"]
        row = conn.execute(READ.model, {"id": model_id}).fetchone()
    model = Model(row["name"])
    model._hydrate(row)
    return model


def list_experiments(experiment_ids: list[int] | None = None, users: list[str] | None = None,
                     states: list[ExperimentState] | None = None,
                     name: str | None = None) -> list[Experiment]:
    """The experiments the user may view (archived ones too), by id, narrowed to
    ``experiment_ids``, owners in ``users``, ``states`` and names containing ``name`` (any
    case). 0.38's sorting and project arguments are not taken."""
    f = exp_queries.ListFilter(archived=True, name=name,
                               states=tuple(s.name for s in states) if states else None)
    with db() as conn:
        rows = exp_queries.list_experiments(conn, f)
    out = []
    for r in rows:
        if (experiment_ids is None or r["id"] in experiment_ids) \
                and (users is None or r["owner"] in users):
            exp = Experiment(r["id"])
            exp.name, exp.state = r["name"], _state(ExperimentState, r["state"])
            out.append(exp)
    return out


def get_workspace(name: str) -> Workspace:
    """The workspace of this name. Raises NotFoundError (none the user may view)."""
    with db() as conn:
        row = _workspace_row(conn, name)
    return Workspace(id=row["id"], name=row["name"])
