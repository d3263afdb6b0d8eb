"""``determined.get_cluster_info()``: what a task knows about itself, in 0.38's shape.

On a det cluster the answer comes from ``det_task_info`` (the allocation's token, read once
and cached); off-cluster (no ``DET_ALLOCATION_TOKEN``) it is ``None``, as in Determined.
``master_url`` is det's database URL: the database is det's control plane.
"""

import functools
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import psycopg

from det.harness.transport import TaskInfo


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


@functools.cache
def _cluster_info(db_url: str, token: str) -> ClusterInfo:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT det_task_info(%s)", (token,)).fetchone()
    assert row is not None
    return ClusterInfo.from_task_info(TaskInfo.from_json(row[0]), dict(os.environ))


def get_cluster_info() -> ClusterInfo | None:
    """This task's ``ClusterInfo``, or ``None`` off-cluster (no det task environment).

    Raises psycopg errors if the database refuses the task's token.
    """
    url, token = os.environ.get("DET_DB_URL"), os.environ.get("DET_ALLOCATION_TOKEN")
    if not url or not token or not os.environ.get("DET_ALLOCATION_ID"):
        return None
    return _cluster_info(url, token)
