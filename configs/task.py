"""The config of an interactive task: a command, notebook, shell or TensorBoard (the seed's
"Interactive Job Configuration", shared/spec/introduction-and-features.txt).

``TaskConfig`` validates what a user writes (a ``--config-file``, ``--config KEY=VALUE``
overrides, a template merged under it); ``TaskConfig.expanded()`` is the JSON dict with every
default filled in that det stores (``tasks.config``) and builds the task's run from
(``det_internal.create_task`` in schema.sql).
"""

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from det.configs.entrypoint import Entrypoint
from det.configs.environment import AbsolutePath, BindMount, EnvironmentConfig
from det.configs.experiment import MemoryLimit, Priority, ShmSize, Weight
from det.configs.limits import MAX_DESCRIPTION_CHARS, Int32, Name
from det.configs.load import config_error
from det.errors import ConfigError

TaskKind = Literal["COMMAND", "NOTEBOOK", "SHELL", "TENSORBOARD"]
"""The kinds of interactive task (``jobs.type`` and ``tasks.type``)."""

NotebookIdleType = Literal["kernels_or_terminals", "kernel_connections", "activity"]
"""What keeps a notebook from being idle (seed, notebook_idle_type): ``kernels_or_terminals``
any open kernel or terminal; ``kernel_connections`` any connection to a kernel; ``activity``
a busy kernel or terminal I/O."""

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
MAX_IDLE_TIMEOUT_SECONDS = 366 * 24 * 3600.0


def _parse_duration(value: Any) -> Any:
    """A duration as seconds: a number, or text such as ``"20s"``, ``"10m"``, ``"1.5h"`` (Go's
    units as Determined writes them; a bare number is seconds)."""
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if not match:
            raise PydanticCustomError(
                "duration", "expected a duration such as 20s, 10m or 1h, got {value}",
                {"value": repr(value)})  # pydantic formats {name} only, no !r
        return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    return value


Duration = Annotated[float, Field(gt=0, le=MAX_IDLE_TIMEOUT_SECONDS, allow_inf_nan=False),
                     BeforeValidator(_parse_duration, json_schema_input_type=str | float)]
"""Seconds, > 0 and at most a year."""


class TaskResources(BaseModel):
    """``resources`` of a task: ``slots`` (default 1; a TensorBoard's 0), its pool (None: the
    workspace's or cluster's default compute pool for slot tasks, default auxiliary pool for
    zero-slot ones, chosen at submission), ``priority`` (None: the pool's default),
    ``weight`` (fair share), ``shm_size`` and ``memory_limit`` in bytes (docker runtime)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    slots: Int32 | None = None
    resource_pool: Name | None = None
    priority: Priority | None = None
    weight: Weight = 1.0
    shm_size: ShmSize = None
    memory_limit: MemoryLimit = None


class TaskConfig(BaseModel):
    """A task config. Unknown keys are errors; ``null`` means "not given". ``idle_timeout``:
    seconds without use after which det ends the task (None: never; TensorBoards end after
    the cluster's ``tensorboard_timeout`` regardless); ``work_dir``: the directory the task
    starts in (default: its copy of the context)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION_CHARS)] | None = None
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    resources: TaskResources = Field(default_factory=TaskResources)
    bind_mounts: list[BindMount] = Field(default_factory=list)
    work_dir: AbsolutePath | None = None
    entrypoint: Entrypoint | None = None
    idle_timeout: Duration | None = None
    notebook_idle_type: NotebookIdleType = "kernels_or_terminals"

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    def expanded(self, kind: TaskKind) -> dict[str, Any]:
        """The JSON-able config of a task of ``kind`` with every default filled in (a
        TensorBoard's slots default to 0, other kinds' to 1), as stored."""
        out = self.model_dump(mode="json")
        if out["resources"]["slots"] is None:
            out["resources"]["slots"] = 0 if kind == "TENSORBOARD" else 1
        return out


def parse_task_config(data: Any, kind: TaskKind, source: str | None = None) -> TaskConfig:
    """Validate a task config dict (YAML parsed, overrides applied) for a task of ``kind``.

    Raises:
        ConfigError: one line naming the key and what was expected; a COMMAND without
            ``entrypoint`` (the command to run) or with ``idle_timeout``, or a notebook, shell
            or TensorBoard with an entrypoint (det runs its server), is refused naming the key.
    """
    if not isinstance(data, dict):
        raise ConfigError("", "expected a mapping at the top level", source)
    try:
        cfg = TaskConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, data, source, model=TaskConfig) from None
    if kind == "COMMAND" and cfg.entrypoint is None:
        raise ConfigError("entrypoint", "a command needs the command to run", source)
    if kind == "COMMAND" and cfg.idle_timeout is not None:
        raise ConfigError("idle_timeout", "a command is never idle while it runs (it has no "
                          "server to watch); remove idle_timeout", source)
    if kind != "COMMAND" and cfg.entrypoint is not None:
        raise ConfigError("entrypoint", f"a {kind.lower()} runs det's own server; "
                          "remove entrypoint", source)
    return cfg


class TaskSpec(BaseModel):
    """What a task's run needs beyond an experiment's (``allocations.spec.task``): its job,
    the directory it starts in, ``idle_timeout`` in seconds, the notebook idle type, and a
    TensorBoard's experiments and trials."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    job_id: int
    work_dir: str | None = None
    idle_timeout: float | None = None
    notebook_idle_type: NotebookIdleType = "kernels_or_terminals"
    experiment_ids: list[int] = Field(default_factory=list)
    trial_ids: list[int] = Field(default_factory=list)

