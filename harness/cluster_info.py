"""What a task knows about itself, in Determined 0.38's shape (``ClusterInfo``, the Core API's
``ctx.info``; ``determined.get_cluster_info()``).

On a det cluster the answer comes from ``det_task.info`` (the allocation's token, read once
and cached) through the task's one ``DbTransport``, which ``det.harness.core.init`` then
takes over (:func:`task_transport`): one connection per task, retried through database
restarts like det's own harness (a bare connect here made 9 of 30 tasks ERROR at
``max_connections`` 20). Off-cluster (no ``DET_ALLOCATION_TOKEN``) it is ``None``, as in
Determined. ``master_url`` is det's database URL: the database is det's control plane.
"""

import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from det.harness.transport import DbTransport, TaskInfo


@dataclass(frozen=True)
class TrialInfo:
    """``ClusterInfo.trial``: the trial's ids, hyperparameters, seed and experiment config."""

    trial_id: int
    experiment_id: int
    trial_seed: int
    hparams: dict[str, Any]
    config: dict[str, Any]
    steps_completed: int
    trial_run_id: int
    debug: bool = False

    # 0.38 keeps these as private attributes, which examples and user code read anyway.
    @property
    def _config(self) -> dict[str, Any]:
        return self.config

    @property
    def _steps_completed(self) -> int:
        return self.steps_completed

    @property
    def _trial_run_id(self) -> int:
        return self.trial_run_id

    @property
    def _debug(self) -> bool:
        return self.debug


@dataclass(frozen=True)
class ClusterInfo:
    """The task's view of the cluster (0.38 ``det.ClusterInfo``).

    One container per task on det today: ``container_rank`` 0, ``container_addrs`` this
    host's address, ``slot_ids`` the task's slots (0..n-1) and ``gpu_uuids`` its CUDA devices.
    """

    master_url: str
    cluster_id: str
    agent_id: str
    slot_ids: list[int]
    task_id: str
    allocation_id: str
    session_token: str
    task_type: str
    latest_checkpoint: str | None
    trial: TrialInfo
    container_addrs: list[str] = field(default_factory=list)
    container_rank: int = 0
    container_slot_counts: list[int] = field(default_factory=list)
    gpu_uuids: list[str] = field(default_factory=list)
    user_data: dict[str, Any] = field(default_factory=dict)
    master_cert_name: str | None = None
    master_cert_file: str | None = None

    @property
    def _trial_info(self) -> TrialInfo:
        """0.38's private name of ``trial``, which its unmanaged examples read."""
        return self.trial

    # det's Core API named these on ``ctx.info`` before it took 0.38's ClusterInfo; its
    # scripts read them there still (``allocation_id`` is 0.38's string here).
    @property
    def hparams(self) -> dict[str, Any]:
        """The trial's hyperparameters (``trial.hparams``)."""
        return self.trial.hparams

    @property
    def config(self) -> dict[str, Any]:
        """The expanded experiment config (``trial.config``)."""
        return self.trial.config

    @property
    def trial_id(self) -> int:
        """``trial.trial_id``."""
        return self.trial.trial_id

    @property
    def experiment_id(self) -> int:
        """``trial.experiment_id``."""
        return self.trial.experiment_id

    @property
    def trial_seed(self) -> int:
        """``trial.trial_seed``."""
        return self.trial.trial_seed

    @property
    def steps_completed(self) -> int:
        """Batches trained at ``latest_checkpoint`` (``trial.steps_completed``)."""
        return self.trial.steps_completed

    @classmethod
    def from_task_info(cls, info: TaskInfo, env: dict[str, str]) -> "ClusterInfo":
        """Build from det's ``TaskInfo`` and the task's environment (``DET_*`` variables)."""
        slots = max(info.slots, 1)
        gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        return cls(
            master_url=env.get("DET_DB_URL", ""),
            cluster_id="det",
            agent_id=env.get("DET_AGENT_ID", ""),
            slot_ids=list(range(slots)),
            task_id=f"{info.experiment_id}.{info.trial_id}",
            allocation_id=str(info.allocation_id),
            session_token=env.get("DET_ALLOCATION_TOKEN", ""),
            task_type="TRIAL",
            latest_checkpoint=info.latest_checkpoint,
            trial=TrialInfo(
                trial_id=info.trial_id, experiment_id=info.experiment_id,
                trial_seed=info.trial_seed, hparams=dict(info.hparams),
                config=dict(info.config), steps_completed=info.steps_completed,
                trial_run_id=info.allocation_id, debug=bool(info.config.get("debug")),
            ),
            container_addrs=[_host_address()],
            container_rank=0,
            container_slot_counts=[slots],
            gpu_uuids=gpus,
        )


def _host_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


_lock = threading.Lock()
_info: ClusterInfo | None = None
_unclaimed: DbTransport | None = None  # opened by get_cluster_info, not yet taken


def on_cluster() -> bool:
    """Whether this process is a det task (its environment names database, allocation and
    token)."""
    return all(os.environ.get(n) for n in ("DET_DB_URL", "DET_ALLOCATION_TOKEN",
                                           "DET_ALLOCATION_ID"))


def get_cluster_info() -> ClusterInfo | None:
    """This task's ``ClusterInfo``, or ``None`` off-cluster (no det task environment).

    Waits for the database while it is away (``det.db.retry``). A token the database refuses
    (the allocation was ended) ends the process with one line (``DbTransport``).
    """
    if not on_cluster():
        return None
    with _lock:
        global _info, _unclaimed
        if _info is None:
            _unclaimed = DbTransport.from_env()
            _info = ClusterInfo.from_task_info(_unclaimed.task_info(), dict(os.environ))
        return _info


def task_transport() -> tuple[DbTransport, ClusterInfo]:
    """The task's ``DbTransport`` and ``ClusterInfo`` for ``det.harness.core.init``: the
    transport :func:`get_cluster_info` opened if it is still unclaimed, else a new one. The
    caller owns the transport (closes it). Call only :func:`on_cluster`."""
    with _lock:
        global _info, _unclaimed
        transport, _unclaimed = _unclaimed, None
        if transport is None:
            transport = DbTransport.from_env()
        if _info is None:
            _info = ClusterInfo.from_task_info(transport.task_info(), dict(os.environ))
        return transport, _info
