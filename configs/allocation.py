"""The allocation spec: what an agent needs to launch one run of a task (``allocations.spec``).

The reconciler writes it (``CREATE_ALLOCATIONS`` in :mod:`det.reconciler.queries`) from the
experiment's expanded config, where every default was filled once (:mod:`det.configs`); the
agent and its runtimes read it through this model, so none of them supplies a default again or
guesses at a key. A test keeps the two sides in step.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from det.configs.entrypoint import Entrypoint
from det.configs.environment import BindMount, EnvironmentConfig
from det.configs.experiment import CheckpointStorage, Resources
from det.errors import ConfigError


class AllocationSpec(BaseModel):
    """One run of a trial: its entrypoint, environment (variables, image, pull policy),
    ``bind_mounts``, ``resources`` (``shm_size`` and ``memory_limit`` in bytes), checkpoint
    storage, the packed context (``context_id``; None for none) and whose run it is."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["trial"]
    entrypoint: Entrypoint
    environment: EnvironmentConfig
    bind_mounts: list[BindMount]
    resources: Resources
    checkpoint_storage: CheckpointStorage | None
    context_id: int | None
    experiment_id: int
    trial_id: int

    @classmethod
    def parse(cls, raw: object, allocation_id: int) -> "AllocationSpec":
        """Validate an ``allocations.spec`` value.

        Raises:
            ConfigError: the spec does not match this model (names the allocation and key).
        """
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ConfigError(where, err["msg"], f"allocation {allocation_id} spec") from None
