"""What the agent hands a runtime (``process`` or ``docker``) and what it gets back.

The agent owns the database side (claiming, reporting, logs); a runtime only starts, watches
and stops tasks on this host (docs/architecture.md).
"""

from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from det.agent.devices import Slot
from det.configs.allocation import AllocationSpec

DRAIN_SECONDS = 2.0
"""After a task's main process (or container) has exited, how long its output is still read
before the task is reported ended, in seconds: a process it left behind may hold the output
open, and must never keep the agent waiting."""


@dataclass(frozen=True)
class Launch:
    """One task to start.

    ``argv``: the entrypoint command; ``env``: det's and the user's variables only (a runtime
    adds what its tasks need from the host); ``workdir``: the host directory holding the
    unpacked context; ``spec``: the allocation's spec (environment, bind_mounts, resources,
    checkpoint_storage); ``slots``: the slots the allocation holds on this agent."""

    allocation_id: int
    argv: list[str]
    env: dict[str, str]
    workdir: Path
    spec: AllocationSpec
    slots: list[Slot] = field(default_factory=list)


@dataclass(frozen=True)
class Exit:
    """How a task ended: its exit code (None when it never ran) and a reason a user can
    read beyond the code (None when the code says it all)."""

    code: int | None
    reason: str | None = None


class Task(Protocol):
    """A task a runtime started or adopted."""

    def poll(self) -> Exit | None:
        """The task's end once it has ended and its output is read, else None; never blocks.
        Output still open ``DRAIN_SECONDS`` after the end is no longer read."""

    def kill(self) -> None:
        """SIGKILL the task now: no checkpoint, no grace (``det experiment kill``; a stop
        ignored past ``preemption_timeout`` or the agent's stop grace; a self-fence, called
        from the heartbeat's fence thread). Idempotent; never blocks."""

    def remove(self) -> None:
        """Free what the task left behind on this host (called after its end is reported)."""


class Runtime(Protocol):
    """``name`` is what the agent registers (``agents.runtime``); ``python`` is the
    interpreter a ``module:Class`` entrypoint runs under."""

    name: str
    python: str

    def fetch(self, allocation_id: int, spec: AllocationSpec) -> "Future[None] | None":
        """Start getting what the task needs before it can start (its image); None when
        nothing is missing. Calling again for the same allocation returns the same future,
        for the last time once it is done."""

    def launch(self, launch: Launch) -> Task:
        """Start the task; raises on failure with a message a user can read."""

    def adopt(self, agent_id: str, live: dict[int, datetime | None]) -> dict[int, Task]:
        """Tasks a previous run of this agent left running, by allocation id, for the
        allocations in ``live`` (mapped to the time of their last shipped log line);
        leftovers of other allocations are removed."""
