"""The cluster config: the resource manager's scheduler and the resource pools.

```yaml
resource_manager:
  scheduler: {type: priority, preemption: true, fitting_policy: best, default_priority: 42}
  default_compute_resource_pool: default
  default_aux_resource_pool: default
resource_pools:
  - name: default
    description: CPU hosts
    scheduler: {type: fair_share}        # optional; replaces the cluster's scheduler whole
    max_aux_containers_per_agent: 100
  - name: elastic
    provider:                            # optional: agents started and stopped by det
      type: local                        # agent processes on the reconciler's host
      min_instances: 0
      max_instances: 2
      slots_per_instance: 1
      max_idle_agent_period: 5m          # an idle agent is drained and stopped after this
      agent_startup_timeout: 10m         # an agent that has not registered by then is stopped
checkpoint_storage:                      # optional: the cluster's own S3 storage
  type: s3
  bucket: det-checkpoints
  endpoint_url: http://minio.internal:9000
allowed_checkpoint_storage:              # optional: what else det serve may read
  endpoint_urls: [https://s3.us-west-2.amazonaws.com]
  buckets: [team-a-checkpoints]
tensorboard_timeout: 300                 # seconds a TensorBoard may go unused
```
The older single-pool format, a top-level ``scheduler`` and no ``resource_pools``, still
loads: it becomes ``resource_manager.scheduler`` with one pool named ``default``. Rules from
the spec (Resource Pools, Scheduling) and Determined 0.38's resource-pool config:
scheduler types ``fair_share`` (the
default for a blank ``type``, as the spec's Resource Pools example says), ``priority`` and
``round_robin``; ``preemption`` and ``default_priority`` (1-99) belong to the priority
scheduler; fitting policy ``best`` or ``worst``. Pools are named by ``name`` or the spec's
``pool_name``. ``min_run_time`` (seconds, >= 0, default 60; fair_share and priority): a run
is not preempted before it has reported a checkpoint or held its slots that long.

``checkpoint_storage`` and ``allowed_checkpoint_storage`` bound where det serve reads users'
checkpoints from and with whose credentials (the rule is
:func:`det.configs.storage_policy.storage_access`). The cluster config is readable by every
user, so its ``checkpoint_storage`` holds no keys: det serve reaches it with its own
credentials (environment, ``~/.aws``, instance role).

``tensorboard_timeout`` (seconds, > 0, default 300: the seed's master config key): a
TensorBoard with no proxied traffic for that long is ended by the reconciler
(:mod:`det.reconciler.tasks`).
"""

from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from det.configs.experiment import CheckpointStorage, S3Storage
from det.configs.load import config_error, parse_yaml
from det.configs.task import Duration
from det.errors import ConfigError

DEFAULT_PRIORITY = 42
"""A job's priority (1-99, lower runs first) where neither its config nor its pool's scheduler
says (Determined's default). The database's fallbacks (``det_user.pool_scheduler`` before any
cluster config is applied, ``jobs.priority``) carry the same value;
tests/test_cluster_config.py holds them to it."""

MAX_AUX_CONTAINERS_PER_AGENT = 100
"""Zero-slot tasks one agent of a pool may run at once where the pool does not say
(Determined's default; ``resource_pools.max_aux_containers_per_agent`` carries the same)."""


class SchedulerConfig(BaseModel):
    """How a pool divides its slots."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["fair_share", "priority", "round_robin"] = "fair_share"
    fitting_policy: Literal["best", "worst"] = "best"
    preemption: bool = False
    default_priority: int = Field(DEFAULT_PRIORITY, ge=1, le=99)
    # Seconds a run that has not checkpointed is not preempted (the rule is
    # det.reconciler.schedulers.preemption); det_user.pool_scheduler fills the same default.
    min_run_time: float = Field(60.0, ge=0)


def _endpoint_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PydanticCustomError("endpoint_url", "expected an http:// or https:// URL with a "
                                  "host, got '{value}'", {"value": value})
    if parts.username or parts.password or parts.query or parts.fragment:
        raise PydanticCustomError("endpoint_url", "expected a URL without user, password, "
                                  "query or fragment, got '{value}'", {"value": value})
    return value


SBATCH_DERIVED = frozenset({"-J", "--job-name", "-N", "--nodes", "-n", "--ntasks",
                            "--ntasks-per-node", "--gres", "-o", "--output", "-e", "--error",
                            "-p", "--partition", "-A", "--account", "-q", "--qos"})
"""sbatch options det sets itself for a run's Slurm job (from its name, the run's slots and the
pool's config)."""


class ProviderConfig(BaseModel):
    """``provider`` of an elastic pool: where its agents come from (the decisions are
    :func:`det.reconciler.provisioner.decide`). ``local``: agent processes on the reconciler's
    host, ``slots_per_instance`` CPU slots each; ``aws``: EC2 instances of ``image_id`` (an
    image with det installed) and ``instance_type`` in ``region``, optionally in ``subnet_id``
    with ``security_group_ids``, their user data running ``user_data``, then enrolling the agent
    with a token of its own at ``master_url`` (the database as the instances reach it, e.g.
    the TLS address of `det cluster up --listen`, no user or password) and starting it; with
    ``spot``, on the spot market, on demand where spot has no capacity (``endpoint_url``:
    another EC2 endpoint, e.g. moto's in the tests). Durations are seconds
    or text such as ``5m`` (defaults from the seed's provisioner: 5m idle, 10m startup).
    ``slurm``: each run of the pool is one Slurm job (:mod:`det.reconciler.slurm_provider`)
    in ``partition`` (Slurm's default when unset), charged to ``account`` under ``qos``,
    asking one node with a task per slot of the run (and as many ``gres`` devices, e.g.
    ``gpu``), ``sbatch_args`` passed on, at most ``max_instances`` jobs at once; Slurm decides
    when and where each starts, and the job ends with its run, so the agent sizing and
    lifetime fields (``min_instances``, ``slots_per_instance``, ``max_idle_agent_period``,
    ``agent_startup_timeout``) are refused there."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["local", "aws", "slurm"]
    min_instances: int = Field(0, ge=0)
    max_instances: int = Field(5, ge=1)
    slots_per_instance: int = Field(1, ge=0)
    max_idle_agent_period: Duration = 300.0
    agent_startup_timeout: Duration = 600.0
    # aws (det.reconciler.aws_provider): where and what to launch
    region: str = "us-east-1"
    endpoint_url: Annotated[str, AfterValidator(_endpoint_url)] | None = None
    image_id: str | None = None
    instance_type: str = "t3.medium"
    subnet_id: str | None = None
    security_group_ids: list[str] = Field(default_factory=list)
    user_data: str = ""
    master_url: str | None = None
    spot: bool = False
    # slurm (det.reconciler.slurm_provider): where the job is queued
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gres: str | None = None
    sbatch_args: list[str] = Field(default_factory=list)

    @field_validator("master_url")
    @classmethod
    def _master_url_names_no_login(cls, value: str | None) -> str | None:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict

        if value is None:
            return value
        try:
            params = conninfo_to_dict(value)
        except ProgrammingError as e:
            raise PydanticCustomError("master_url", "master_url: not a database URL ({e})",
                                      {"e": str(e).strip()}) from None
        if {"user", "password", "passfile"} & params.keys():
            raise PydanticCustomError(
                "master_url", "master_url: no user or password (each instance's agent logs "
                "in as its own, enrolled with a token)")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _no_derived_sbatch_args(cls, value: list[str]) -> list[str]:
        for arg in value:
            name = arg.split("=", 1)[0]
            if name in SBATCH_DERIVED:
                raise PydanticCustomError(
                    "sbatch_args", "sbatch_args: '{arg}' is set by det (job name, nodes, "
                    "tasks, gres and output come from the pool and its instance)",
                    {"arg": arg})
        return value

    @model_validator(mode="after")
    def _min_not_above_max(self) -> "ProviderConfig":
        if self.min_instances > self.max_instances:
            raise PydanticCustomError(
                "provider", "min_instances: {min} is above max_instances {max}",
                {"min": self.min_instances, "max": self.max_instances})
        if self.type == "aws" and not self.image_id:
            raise PydanticCustomError("provider", "image_id: required for type aws")
        if self.type == "aws" and not self.master_url:
            raise PydanticCustomError(
                "provider", "master_url: required for type aws (the database URL its "
                "instances enroll their agents at)")
        if self.type != "aws":
            for key in ("master_url", "spot"):
                if getattr(self, key):
                    raise PydanticCustomError(
                        "provider", "{key}: only for type aws, not {type}",
                        {"key": key, "type": self.type})
        if self.type == "slurm":
            for key in ("min_instances", "slots_per_instance", "max_idle_agent_period",
                        "agent_startup_timeout"):
                if key in self.model_fields_set:
                    raise PydanticCustomError(
                        "provider", "{key}: not for type slurm (each run is a Slurm job of "
                        "its own, sized by the run and ending with it)", {"key": key})
        if self.type != "slurm":
            for key in ("partition", "account", "qos", "gres", "sbatch_args"):
                if getattr(self, key):
                    raise PydanticCustomError(
                        "provider", "{key}: only for type slurm, not {type}",
                        {"key": key, "type": self.type})
        return self


class ResourcePoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    name: str = Field(min_length=1, validation_alias=AliasChoices("name", "pool_name"))
    description: str = ""
    scheduler: SchedulerConfig | None = None
    max_aux_containers_per_agent: int = Field(MAX_AUX_CONTAINERS_PER_AGENT, ge=0)
    provider: ProviderConfig | None = None


class ResourceManagerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["agent"] = "agent"
    scheduler: SchedulerConfig = SchedulerConfig()
    default_compute_resource_pool: str = "default"
    default_aux_resource_pool: str = "default"


class StorageAllowList(BaseModel):
    """``allowed_checkpoint_storage``: S3 endpoints and buckets det serve may read users'
    checkpoints from, besides the cluster's own ``checkpoint_storage``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    endpoint_urls: list[Annotated[str, AfterValidator(_endpoint_url)]] = Field(
        default_factory=list)
    buckets: list[Annotated[str, Field(min_length=1, max_length=255)]] = Field(
        default_factory=list)


class ClusterConfig(BaseModel):
    """The whole cluster config; see the module docstring for the format."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    resource_manager: ResourceManagerConfig = ResourceManagerConfig()
    resource_pools: list[ResourcePoolConfig] = Field(
        default_factory=lambda: [ResourcePoolConfig(name="default")])
    checkpoint_storage: CheckpointStorage | None = None
    allowed_checkpoint_storage: StorageAllowList = StorageAllowList()
    tensorboard_timeout: float = Field(300.0, gt=0, allow_inf_nan=False)

    @field_validator("checkpoint_storage")
    @classmethod
    def _no_keys(cls, value: Any) -> Any:
        if isinstance(value, S3Storage) and (value.access_key or value.secret_key):
            raise PydanticCustomError(
                "storage_keys", "access_key and secret_key: not allowed here (every user may "
                "read the cluster config); give det serve its credentials through its "
                "environment, ~/.aws or an instance role")
        return value

    @model_validator(mode="after")
    def _pools_named_once_and_defaults_exist(self) -> "ClusterConfig":
        names = [p.name for p in self.resource_pools]
        if not names:
            raise PydanticCustomError("pools", "expected at least one resource pool")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PydanticCustomError("pools", "resource_pools: pool '{name}' is listed twice",
                                      {"name": dupes[0]})
        rm = self.resource_manager
        for key in ("default_compute_resource_pool", "default_aux_resource_pool"):
            if getattr(rm, key) not in names:
                raise PydanticCustomError(
                    "pools", "resource_manager.{key}: no pool named '{name}' in resource_pools",
                    {"key": key, "name": getattr(rm, key)})
        return self

    def effective_scheduler(self, pool: str) -> SchedulerConfig:
        """The scheduler ``pool`` really uses: its own, else the cluster's (whole, not merged:
        the spec warns that a pool scheduler replaces the cluster's)."""
        own = next(p.scheduler for p in self.resource_pools if p.name == pool)
        return own or self.resource_manager.scheduler


def _upgrade_single_pool(data: Any) -> Any:
    """The older format: a top-level ``scheduler`` (and no resource_pools)."""
    if isinstance(data, Mapping) and "scheduler" in data:
        data = dict(data)
        rm = dict(data.get("resource_manager") or {})
        rm.setdefault("scheduler", data.pop("scheduler"))
        data["resource_manager"] = rm
    return data


def load_cluster_config(text: str, source: str | None = None) -> ClusterConfig:
    """Parse cluster-config YAML.

    Raises:
        ConfigError: one line naming the file, the key and what was expected.
    """
    data = parse_yaml(text, source)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("", "expected a mapping at the top level", source)
    data = _upgrade_single_pool(data)
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, data, source, model=ClusterConfig) from None
