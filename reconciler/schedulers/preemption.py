"""Which running tasks a scheduler may preempt, and which first (no waste from
preemption). Pure functions over :class:`~.model.Task`.

A run preempted before it has trained and checkpointed is pure waste: its start bought
nothing, and with three searches on two slots one trial was started and preempted at 0
batches twice. So a running task is *protected* while its run has reported no checkpoint
and has held its slots for less than the pool's ``scheduler.min_run_time`` (seconds, default
:data:`MIN_RUN_TIME`, the issue's "minimum run time in the cluster config"); whichever comes
first ends it, so a run that never checkpoints still yields its slots that long after it got
them (and a preempted run checkpoints before it exits, so what it trained is kept). A
scheduler never releases a protected task: the task that wants its slots waits, saying why
(:func:`protected_note`), and a later pass preempts once the protection ends.

Of the tasks a job may give back, the one that has held its slots longest goes first: a
freshly started run is not the one chosen when another would do (:func:`give_back_order`).
"""

from collections.abc import Iterable

from det.reconciler.schedulers.model import Task

MIN_RUN_TIME = 60.0
"""Default ``scheduler.min_run_time`` (seconds), the issue's figure."""


def protected(task: Task, min_run_time: float) -> bool:
    """Whether running ``task`` may not be preempted yet: told nothing yet, no checkpoint from
    its run, and its slots held for less than ``min_run_time`` seconds."""
    return (task.running and not task.stopping and not task.checkpointed
            and task.ran < min_run_time)


def give_back_order(tasks: Iterable[Task], min_run_time: float) -> list[Task]:
    """The running preemptible tasks of ``tasks`` (one job's, queue order) that may be
    preempted, in the order they are: those already stopping first (their slots come back
    anyway), then the longest held first; equal times (unknown: ``ran`` inf) newest in the
    queue first. Protected tasks are left out."""
    running = [t for t in tasks if t.running and t.preemptible]
    stopping = [t for t in running if t.stopping]
    rest = [t for t in reversed(running) if not t.stopping and not protected(t, min_run_time)]
    rest.sort(key=lambda t: -t.ran)  # stable: newest in the queue first among equals
    return stopping + rest


def protected_note(min_run_time: float) -> str:
    """The clause a waiting task's reason gains while the runs it would preempt are
    protected."""
    return (f"the runs holding them are not preempted before they checkpoint or have run "
            f"{min_run_time:g} s (scheduler.min_run_time)")
