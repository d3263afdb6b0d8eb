"""The experiment config model (Determined 0.38's ``experiment.json`` schema) and its expanded form.

``ExperimentConfig`` validates what a user writes; ``ExperimentConfig.expanded()`` is the
JSON dict with every default filled in that det stores as the experiment's config, and that
``ExperimentConfig.model_validate`` reads back unchanged.
"""

import re
import time
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from det.configs.entrypoint import Entrypoint
from det.configs.environment import AbsolutePath, BindMount, EnvironmentConfig
from det.configs.hyperparameters import (
    DoubleHP,
    Hyperparameters,
    IntHP,
    LogHP,
    NestedHP,
    grid_axis_size,
    iter_leaves,
)
from det.configs.length import Period
from det.configs.limits import MAX_DESCRIPTION_CHARS, MAX_TRIALS, Int32, Name
from det.configs.searcher import SearcherConfig

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _parse_size(value: Any) -> Any:
    """``shm_size`` / ``memory_limit``: an int (bytes) or a string such as ``"1.5G"``
    (1024-based) -> bytes."""
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None:
            raise PydanticCustomError(
                "size",
                "expected bytes as an int or a size like '4G', got '{value}'",
                {"value": value},
            )
        return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    return value


def _priority_range(value: int) -> int:
    if not 1 <= value <= 99:
        raise PydanticCustomError(
            "priority", "expected an integer between 1 and 99 (lower runs first), got {value}",
            {"value": value})
    return value


Priority = Annotated[int, AfterValidator(_priority_range),
                     WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 99})]
"""A job priority (priority scheduler): 1 to 99, lower runs first."""

MAX_WEIGHT = 1e6
Weight = Annotated[float, Field(gt=0, le=MAX_WEIGHT, allow_inf_nan=False)]
"""A fair-share weight: a finite number > 0 and at most ``MAX_WEIGHT``. A weight is a ratio
between jobs; a million to one is past any useful share, and the bound keeps the scheduler's
sums of demand x weight finite. The same rule is the ``jobs.weight`` CHECK in ``schema.sql``."""


ShmSize = Annotated[
    Annotated[int, Field(ge=0)] | None,
    BeforeValidator(_parse_size, json_schema_input_type=int | str | None),
]
"""``resources.shm_size``: bytes (a number, or text such as ``4G``), None for the default."""

MemoryLimit = Annotated[
    Annotated[int, Field(gt=0)] | None,
    BeforeValidator(_parse_size, json_schema_input_type=int | str | None),
]
"""``resources.memory_limit``: bytes (a number, or text such as ``8G``), None for none."""


class Resources(BaseModel):
    """``resources`` (§3.4). ``priority`` None means the pool's default (filled at creation).
    ``resource_pool`` may be a list (beyond the spec): each trial run goes to the first pool
    of the list that can take it now, the first pool when none can. ``memory_limit``
    (beyond the spec; docker runtime): the task container's memory ceiling in bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    slots_per_trial: Int32 = 1
    resource_pool: Name | Annotated[list[Name], Field(min_length=1)] = "default"
    priority: Priority | None = None
    weight: Weight = 1.0
    max_slots: Int32 | None = None
    shm_size: ShmSize = None
    memory_limit: MemoryLimit = None


def _non_blank_bucket(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("bucket", "expected a bucket name")
    return value


class _StorageBase(BaseModel):
    """Checkpoint GC settings common to every storage type (§3.7, §5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    save_experiment_best: Annotated[int, Field(ge=0)] = 0
    save_trial_best: Annotated[int, Field(ge=0)] = 1
    save_trial_latest: Annotated[int, Field(ge=0)] = 1


class SharedFSStorage(_StorageBase):
    """``type: shared_fs``: checkpoints under ``host_path[/storage_path]`` on every agent."""

    type: Literal["shared_fs"]
    host_path: AbsolutePath
    storage_path: str | None = None

    @field_validator("storage_path")
    @classmethod
    def _under_host_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        host = info.data.get("host_path")
        if value is None or not value.startswith("/") or host is None:
            return value
        if not (value == host or value.startswith(host.rstrip("/") + "/")):
            raise PydanticCustomError(
                "storage_path",
                "expected a relative path or one under host_path '{host}'",
                {"host": host},
            )
        return value


class DirectoryStorage(_StorageBase):
    """``type: directory``: checkpoints in ``container_path`` inside the task's container."""

    type: Literal["directory"]
    container_path: str


class S3Storage(_StorageBase):
    """``type: s3`` (§3.7): checkpoints at ``s3://<bucket>/<prefix>/<uuid>`` through fsspec's
    s3fs. ``endpoint_url`` points at an S3-compatible server; without ``access_key`` and
    ``secret_key`` the credentials come from the standard AWS chain (environment variables,
    shared credentials file, instance role)."""

    type: Literal["s3"]
    bucket: Annotated[Name, AfterValidator(_non_blank_bucket)]
    prefix: str | None = None
    endpoint_url: str | None = None
    access_key: str | None = None
    secret_key: str | None = None


def _storage_type(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


CheckpointStorage = Annotated[
    Annotated[SharedFSStorage, Tag("shared_fs")]
    | Annotated[DirectoryStorage, Tag("directory")]
    | Annotated[S3Storage, Tag("s3")],
    Discriminator(
        _storage_type,
        custom_error_type="bad_union_tag:type",
        custom_error_message="expected one of shared_fs|directory|s3",
    ),
]


class Reproducibility(BaseModel):
    """``reproducibility``: the searcher's RNG seed (None until expansion fills it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    experiment_seed: Annotated[int, Field(ge=0, lt=2**32)] | None = None


class ExperimentConfig(BaseModel):
    """An experiment config (§3.2). Unknown keys are errors; ``null`` means "not given"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name = "Experiment"
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION_CHARS)] | None = None
    labels: list[Name] = Field(default_factory=list)
    workspace: Name | None = None
    project: Name | None = None
    entrypoint: Entrypoint
    hyperparameters: Hyperparameters = Field(default_factory=lambda: NestedHP({}))
    searcher: SearcherConfig
    resources: Resources = Field(default_factory=Resources)
    min_validation_period: Period | None = None
    min_checkpoint_period: Period | None = None
    checkpoint_storage: CheckpointStorage | None = None
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    max_restarts: Int32 = 5
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    bind_mounts: list[BindMount] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)
    records_per_epoch: Annotated[int, Field(ge=0)] = 0
    scheduling_unit: Annotated[int, Field(ge=1)] = 100
    perform_initial_validation: bool = False
    reproducibility: Reproducibility = Field(default_factory=Reproducibility)
    preemption_timeout: Int32 = 3600
    debug: bool = False

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        """``null`` means "not present" (§3.1): drop top-level nulls so defaults apply."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @model_validator(mode="after")
    def _grid_needs_counts(self) -> "ExperimentConfig":
        """Grid search needs ``count`` on every int/double/log hyperparameter (§3.1), and a
        grid of at most ``MAX_TRIALS`` points."""
        if self.searcher.name != "grid":
            return self
        points = 1
        for route, hp in iter_leaves(self.hyperparameters):
            if isinstance(hp, (IntHP, DoubleHP, LogHP)) and hp.count is None:
                raise PydanticCustomError(
                    "grid_count",
                    "required when searcher.name is grid",
                    {"dotted_path": "hyperparameters." + ".".join(route) + ".count"},
                )
            points *= grid_axis_size(hp)
        if points > MAX_TRIALS:
            raise PydanticCustomError(
                "grid_size",
                "the grid has {points} points; the limit is {limit} (one trial each)",
                {"points": points, "limit": MAX_TRIALS, "dotted_path": "hyperparameters"},
            )
        return self

    def expanded(self, now: float | None = None) -> dict[str, Any]:
        """The JSON-able config with every default filled in, as stored in the database.

        ``reproducibility.experiment_seed``, if unset, becomes ``int(now)`` (default: the
        current unix time, §1.2). Hyperparameters appear in their explicit form
        (``{type: const, val: ...}``); environment variables and images as ``{cpu, cuda}``.
        """
        out = self.model_dump(mode="json")
        if out["reproducibility"]["experiment_seed"] is None:
            seed = int(time.time() if now is None else now) % 2**32
            out["reproducibility"]["experiment_seed"] = seed
        return out
