"""det.reconciler.schedulers: how a resource pool divides its slots. Pure functions.

``schedule(scheduler, agents, tasks) -> Decision`` runs one pass of the pool's scheduler
(``fair_share``, ``priority`` or ``round_robin``; spec: Scheduling) over plain data (see
:mod:`.model`); the reconciler writes the decision (allocations, preemptions, reasons) and
``det job simulate`` prints it. Fitting (best / worst, gang placement) is in :mod:`.fitting`;
which running tasks may be preempted, and which first, in :mod:`.preemption`.
"""

from collections.abc import Sequence

from det.configs.cluster import SchedulerConfig
from det.reconciler.schedulers import fair_share, priority, round_robin
from det.reconciler.schedulers.model import Agent, Decision, Task

__all__ = ["Agent", "Decision", "SchedulerConfig", "Task", "schedule"]


def schedule(scheduler: SchedulerConfig, agents: Sequence[Agent],
             tasks: Sequence[Task]) -> Decision:
    """One scheduling pass of ``scheduler`` over ``tasks`` (in queue order) on ``agents``."""
    policy = scheduler.fitting_policy
    if scheduler.type == "priority":
        return priority.schedule(agents, tasks, preemption=scheduler.preemption,
                                 fitting_policy=policy, min_run_time=scheduler.min_run_time)
    if scheduler.type == "round_robin":
        return round_robin.schedule(agents, tasks, fitting_policy=policy)
    return fair_share.schedule(agents, tasks, fitting_policy=policy,
                               min_run_time=scheduler.min_run_time)
