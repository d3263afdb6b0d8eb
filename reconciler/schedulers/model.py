"""The plain data the schedulers decide over: agents, tasks, and a decision.

A *task* is one allocation request (a trial run, later a command or notebook) of one *job*
(an experiment); the list of tasks a scheduler gets is in queue order (job queue position,
then allocation id). Identifiers are opaque: the reconciler passes allocation ids and job
ids, scenario files pass strings.
"""

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from det.configs.cluster import DEFAULT_PRIORITY, MAX_AUX_CONTAINERS_PER_AGENT

Id = Hashable

# ``Task.on`` of a task that holds nothing: read-only, so one instance serves every task.
NOWHERE: Mapping[Id, tuple[int, ...]] = MappingProxyType({})


@dataclass(frozen=True)
class Agent:
    """An active agent of the pool.

    ``slots``: its enabled slot ids; ``free``: those no live allocation holds;
    ``aux_running``: zero-slot tasks it runs now; ``max_aux``: how many it may run
    (the pool's ``max_aux_containers_per_agent``).
    """

    id: Id
    slots: tuple[int, ...]
    free: tuple[int, ...]
    aux_running: int = 0
    max_aux: int = MAX_AUX_CONTAINERS_PER_AGENT


class Task(NamedTuple):
    """One allocation request (immutable; ``task._replace(running=True)`` makes a changed copy).

    ``slots``: slots needed (0 = a zero-slot task); ``priority``: 1-99, lower runs first;
    ``weight``: fair-share weight (> 0); ``max_slots``: the job's fair-share demand cap (None:
    no cap); ``running``: it holds resources now, on ``on`` (``{agent id: slot ids}``);
    ``stopping``: it was already told to stop and will give its resources back.
    ``ran``: seconds a running task has held its slots (since its assignment; inf where not
    known, as in scenario files); ``checkpointed``: its run has reported a checkpoint. With
    the pool's ``min_run_time`` they say whether it may be preempted yet
    (:func:`det.reconciler.schedulers.preemption.protected`).

    A named tuple rather than a frozen dataclass: a pass over 100,000 queued jobs builds
    100,000 of them, and a frozen dataclass's ``__init__`` costs four times as much.
    """

    id: Id
    job: Id
    slots: int
    priority: int = DEFAULT_PRIORITY
    weight: float = 1.0
    preemptible: bool = True
    max_slots: int | None = None
    running: bool = False
    stopping: bool = False
    on: Mapping[Id, tuple[int, ...]] = NOWHERE
    ran: float = math.inf
    checkpointed: bool = False


@dataclass
class Decision:
    """What one scheduling pass wants.

    ``allocate``: ``{task id: {agent id: [slot ids]}}`` for pending tasks to start (a
    zero-slot task gets ``{agent id: []}``); ``release``: running tasks to preempt (they
    checkpoint and exit; their slots return when they do); ``reasons``: ``{task id: why it
    still waits}`` for every pending task not allocated; ``preempted_for``: ``{released task
    id: (the job its slots go to, or None, and the rule, e.g. "fair share")}``, which the
    reconciler words as the run's stop reason ("preempted: slots given to experiment 3 (fair
    share)").
    """

    allocate: dict[Id, dict[Id, list[int]]] = field(default_factory=dict)
    release: list[Id] = field(default_factory=list)
    reasons: dict[Id, str] = field(default_factory=dict)
    preempted_for: dict[Id, tuple[Id | None, str]] = field(default_factory=dict)
