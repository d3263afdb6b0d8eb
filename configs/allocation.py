"""The allocation spec: what an agent needs to launch one run of a task (``allocations.spec``).

The reconciler writes it (``create_allocations`` in sql/reconciler.sql) from the
experiment's expanded config, where every default was filled once (:mod:`det.configs`); the
agent and its runtimes read it through this model, so none of them supplies a default again or
guesses at a key. A test keeps the two sides in step.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from det.configs.entrypoint import Entrypoint, entrypoint_argv, is_trial_class
from det.configs.environment import BindMount, EnvironmentConfig
from det.configs.experiment import CheckpointStorage, Resources
from det.configs.task import TaskSpec
from det.errors import ConfigError

INTERACTIVE_KINDS = frozenset({"command", "notebook", "shell", "tensorboard"})
"""Spec kinds of an interactive task's run (``tasks``): ended once, never a trial's."""


class AllocationSpec(BaseModel):
    """One run of a task: its entrypoint, environment (variables, image, pull policy),
    ``bind_mounts``, ``resources`` (``shm_size`` and ``memory_limit`` in bytes), checkpoint
    storage, the packed context (``context_id``; None for none) and whose run it is.

    ``kind`` ``trial``: a run of trial ``trial_id`` (the entrypoint is the experiment's);
    ``checkpoint_gc``: a zero-slot task that removes the files of the experiment's DELETING
    checkpoints (:mod:`det.harness.checkpoint_gc`; no entrypoint, no trial); ``command``,
    ``notebook``, ``shell``, ``tensorboard``: the one run of an interactive task (``task``;
    no experiment: ``experiment_id`` None), a command running its entrypoint, the others det's
    server for them (:mod:`det.harness.interactive`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["trial", "checkpoint_gc", "command", "notebook", "shell", "tensorboard"]
    entrypoint: Entrypoint | None = None
    environment: EnvironmentConfig
    bind_mounts: list[BindMount]
    resources: Resources
    checkpoint_storage: CheckpointStorage | None
    context_id: int | None
    experiment_id: int | None
    trial_id: int | None
    task: TaskSpec | None = None

    @model_validator(mode="after")
    def _trial_has_entrypoint(self) -> "AllocationSpec":
        if self.kind == "trial" and (self.entrypoint is None or self.trial_id is None):
            raise PydanticCustomError("trial_spec", "a trial's spec needs entrypoint and trial_id")
        if self.kind in INTERACTIVE_KINDS and self.task is None:
            raise PydanticCustomError("task_spec", "a task's spec needs task")
        if self.kind == "command" and self.entrypoint is None:
            raise PydanticCustomError("task_spec", "a command's spec needs entrypoint")
        return self

    def argv(self, python: str) -> list[str]:
        """The command line of the task, ``python`` being the interpreter it runs under; a
        trial class with ``slots_per_trial`` > 1 runs under ``det.launch.torch_distributed``."""
        if self.kind == "checkpoint_gc":
            return [python, "-m", "det.harness.checkpoint_gc"]
        if self.kind in INTERACTIVE_KINDS and self.kind != "command":
            return [python, "-m", "det.harness.interactive", self.kind]
        assert self.entrypoint is not None  # checked by the validator
        if self.resources.slots_per_trial > 1 and is_trial_class(self.entrypoint):
            # One worker per slot: the trial class runs under det's launcher.
            return [python, "-m", "det.launch.torch_distributed", "--trial", self.entrypoint]
        return entrypoint_argv(self.entrypoint, python)

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
