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

from det.reconciler.schedulers.fitting import Holders, Pool, split
from det.reconciler.schedulers.model import Agent, Decision, Task


def schedule(agents: Sequence[Agent], tasks: Sequence[Task], *, preemption: bool = False,
             fitting_policy: str = "best") -> Decision:
    """One pass over ``tasks`` (queue order) on ``agents``; see the module rules."""
    out = Decision()
    for part in split(tasks):
        _schedule(part, preemption, Pool(agents, fitting_policy), out)
    return out


def _schedule(tasks: Sequence[Task], preemption: bool, pool: Pool, out: Decision) -> None:
    order = {t.id: i for i, t in enumerate(tasks)}
    ranked = sorted(tasks, key=lambda t: (t.priority, order[t.id]))
    running = [t for t in ranked if t.running]
    holders = Holders(tasks)
    evicting = _Evictions(running, order)
    blocked_by: set = set()  # jobs of higher priority with a task that did not fit
    for _, level in groupby([t for t in ranked if not t.running], key=lambda t: t.priority):
        failed = []
        for t in level:
            reason = pool.never_fits(t.slots)
            if reason:
                out.reasons[t.id] = reason
                continue
            fit = pool.fit(t.slots)
            if fit is None:
                failed.append(t)
                continue
            pool.reserve(fit)
            if evicting.started:
                out.reasons[t.id] = "waiting for preempted tasks to give their slots back"
            elif not blocked_by or (preemption and t.preemptible):
                out.allocate[t.id] = fit
            else:
                out.reasons[t.id] = _behind(blocked_by)
        for t in failed:
            if preemption and evicting.make_room(t, pool):
                out.reasons[t.id] = "preempting lower-priority tasks to make room"
            elif blocked_by:
                out.reasons[t.id] = _behind(blocked_by) + "; " + holders.waiting(t)
            else:
                out.reasons[t.id] = holders.waiting(t)
        blocked_by |= {t.job for t in failed}
    out.release.extend(evicting.release)


def _behind(jobs: set) -> str:
    return f"behind {len(jobs)} job(s) of higher priority"


class _Evictions:
    """The running tasks chosen for eviction in one pass."""

    def __init__(self, running: list[Task], order: dict) -> None:
        self.running, self.order = running, order
        self.stopping = [t for t in running if t.stopping and t.preemptible]
        self.chosen: set = set()
        self.release: list = []
        self.started = False  # once set, slots in the pool may still be held: start nothing

    def _candidates(self, task: Task):
        yield from (t for t in self.stopping if t.id not in self.chosen)
        for t in reversed(self.running):  # lowest priority, last in queue first
            if t.priority < task.priority or (
                    t.priority == task.priority and self.order[t.id] < self.order[task.id]):
                return
            if t.preemptible and not t.stopping and t.id not in self.chosen:
                yield t

    def make_room(self, task: Task, pool: Pool) -> bool:
        """Choose running tasks whose eviction lets ``task`` fit; on success give their
        resources back to ``pool``, reserve ``task``'s fit there and return True. Tasks
        already stopping go first: their slots come back anyway."""
        extra: dict = {}
        removed = []
        for t in self._candidates(task):
            for agent, slot_ids in t.on.items():
                extra.setdefault(agent, []).extend(slot_ids)
            removed.append(t)
            fit = pool.fit(task.slots, extra)
            if fit is not None:
                for r in removed:
                    pool.give_back(r)
                    self.chosen.add(r.id)
                    if not r.stopping:
                        self.release.append(r.id)
                pool.reserve(fit)
                self.started = True
                return True
        return False
