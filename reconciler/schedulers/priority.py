"""The priority scheduler (spec: Scheduling, Task Priority; notes §2.4).

Lower number = higher priority; equal priorities run in queue order. Per priority level, from
the highest: fit the level's pending tasks in order. Once a level has a task that does not
fit, lower levels are frozen: they may only *backfill* idle slots, and only with preemptible
tasks, only when preemption is on. With preemption, a task that does not fit evicts running
preemptible tasks, lowest priority first and, within a priority, the last in the queue first
(never one ahead of it at its own priority), but only if that makes it fit; nothing starts in
a pass after something was preempted. Slot tasks and zero-slot tasks are scheduled apart.
"""

from collections.abc import Sequence
from itertools import groupby

from det.reconciler.schedulers.fitting import Pool, never_fits, split, waiting_for_slots
from det.reconciler.schedulers.model import Agent, Decision, Task


def schedule(agents: Sequence[Agent], tasks: Sequence[Task], *, preemption: bool = False,
             fitting_policy: str = "best") -> Decision:
    """One pass over ``tasks`` (queue order) on ``agents``; see the module rules."""
    out = Decision()
    for part in split(tasks):
        _schedule(agents, part, preemption, Pool(agents, fitting_policy), out)
    return out


def _schedule(agents: Sequence[Agent], tasks: Sequence[Task], preemption: bool, pool: Pool,
              out: Decision) -> None:
    order = {t.id: i for i, t in enumerate(tasks)}
    ranked = sorted(tasks, key=lambda t: (t.priority, order[t.id]))
    running = [t for t in ranked if t.running]
    release: list[Task] = []
    blocked_by = 0  # pending tasks of higher priority that did not fit
    for _, level in groupby([t for t in ranked if not t.running], key=lambda t: t.priority):
        level = list(level)
        failed = []
        for t in level:
            reason = never_fits(t, agents)
            if reason:
                out.reasons[t.id] = reason
                continue
            fit = pool.fit(t.slots)
            if fit is None:
                failed.append(t)
                continue
            pool.reserve(fit)
            if release:
                out.reasons[t.id] = "waiting for preempted tasks to give their slots back"
            elif blocked_by == 0 or (preemption and t.preemptible):
                out.allocate[t.id] = fit
            else:
                out.reasons[t.id] = _behind(blocked_by)
        for t in failed:
            if preemption and _preempt_for(t, running, release, pool, order):
                out.reasons[t.id] = "preempting lower-priority tasks to make room"
            elif blocked_by:
                out.reasons[t.id] = _behind(blocked_by) + "; " + waiting_for_slots(t, tasks)
            else:
                out.reasons[t.id] = waiting_for_slots(t, tasks)
        blocked_by += len(failed)
    out.release.extend(t.id for t in release)


def _behind(n: int) -> str:
    return f"behind {n} waiting task(s) of higher priority"


def _preempt_for(task: Task, running: list[Task], release: list[Task], pool: Pool,
                 order: dict) -> bool:
    """Choose running tasks whose eviction lets ``task`` fit; on success reserve its fit in
    ``pool``, add them to ``release`` and return True. Tasks already stopping go first: their
    slots come back anyway."""
    chosen = {id(t) for t in release}
    candidates = [t for t in running if t.stopping and t.preemptible and id(t) not in chosen]
    for t in reversed(running):  # lowest priority, last in queue first
        if t.priority == task.priority and order[t.id] < order[task.id]:
            break
        if t.priority < task.priority:
            break
        if t.preemptible and not t.stopping and id(t) not in chosen:
            candidates.append(t)
    scratch = pool.copy()
    removed = []
    for t in candidates:
        scratch.give_back(t)
        removed.append(t)
        fit = scratch.fit(task.slots)
        if fit is not None:
            scratch.reserve(fit)
            pool.free, pool.aux_free = scratch.free, scratch.aux_free
            release.extend(r for r in removed if not r.stopping)
            return True
    return False
