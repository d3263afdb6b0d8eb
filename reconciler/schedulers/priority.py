"""The priority scheduler (spec: Scheduling, Task Priority; Determined 0.38's ``priority.go``).

Lower number = higher priority; equal priorities run in queue order. Per priority level, from
the highest: fit the level's pending tasks in order. Once a level has a task that does not
fit, lower levels are frozen: they may only *backfill* idle slots, and only with preemptible
tasks, only when preemption is on. With preemption, a task that does not fit first takes
slots that this pass's evictions will free; failing that, it evicts running preemptible
tasks, lowest priority first and, within a priority, the last in the queue first (never one
ahead of it at its own priority), but only if that makes it fit, and only those it needs: no
evicted task could be left running and the task still fit. Nothing starts in a pass after
something was preempted. Slot tasks and zero-slot tasks are scheduled apart. A running task
still protected (:mod:`.preemption`: no checkpoint yet and younger than ``min_run_time``) is
never evicted: a task that only those could make room for waits, saying so.

A pass is a list of :class:`Step` (:func:`plan`), the pass's scratch copy of the pool task by
task; :func:`schedule` turns it into a :class:`~.model.Decision`.
"""

from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby
from operator import attrgetter
from typing import NamedTuple

from sortedcontainers import SortedKeyList

from det.reconciler.schedulers.fitting import Fit, Holders, Pool, split
from det.reconciler.schedulers.model import Agent, Decision, Id, Task
from det.reconciler.schedulers.preemption import MIN_RUN_TIME, protected, protected_note

PREEMPTING = "preempting lower-priority tasks to make room"
FREED = "waiting for preempted tasks to give their slots back"


class Step(NamedTuple):
    """One pending task's turn in a pass, in the order the pass takes them.

    ``fit``: its place in the pass's scratch copy of the pool (``{agent id: slot ids}``;
    ``{agent id: []}`` for a zero-slot task), None if it got none; ``reason``: why it waits,
    None if it starts now on ``fit``; ``evict``: the running tasks chosen to make room for it,
    in the order chosen (ones already stopping are not preempted again: their resources come
    back anyway). Its ``fit`` lies in what was free once ``evict`` gave its resources back.
    """

    task: Task
    fit: Fit | None
    reason: str | None
    evict: tuple[Task, ...] = ()


def schedule(agents: Sequence[Agent], tasks: Sequence[Task], *, preemption: bool = False,
             fitting_policy: str = "best", min_run_time: float = MIN_RUN_TIME) -> Decision:
    """One pass over ``tasks`` (queue order) on ``agents``; see the module rules.
    ``min_run_time``: seconds a run without a checkpoint is not preempted."""
    out = Decision()
    for s in plan(agents, tasks, preemption=preemption, fitting_policy=fitting_policy,
                  min_run_time=min_run_time):
        if s.reason is None:
            out.allocate[s.task.id] = s.fit
        else:
            out.reasons[s.task.id] = s.reason
        for t in s.evict:
            if not t.stopping:
                out.release.append(t.id)
                out.preempted_for[t.id] = (s.task.job,
                                           f"priority {s.task.priority} over {t.priority}")
    return out


def plan(agents: Sequence[Agent], tasks: Sequence[Task], *, preemption: bool = False,
         fitting_policy: str = "best", min_run_time: float = MIN_RUN_TIME) -> list[Step]:
    """The steps of one pass: every pending task of ``tasks`` once, slot tasks first, each
    part in the order its scratch pool was changed."""
    steps: list[Step] = []
    for part in split(tasks):
        if part:  # a pool's scratch copy costs a walk of its agents
            steps += _plan(part, preemption, Pool(agents, fitting_policy), min_run_time)
    return steps


def _plan(tasks: Sequence[Task], preemption: bool, pool: Pool,
          min_run_time: float) -> Iterator[Step]:
    order = {t.id: i for i, t in enumerate(tasks)}
    by_priority = attrgetter("priority")
    ranked = sorted(tasks, key=by_priority)  # stable: queue order within a priority
    holders = Holders(tasks)
    evicting = _Evictions([t for t in tasks if t.running], order, min_run_time)
    blocked_by: set = set()  # jobs of higher priority with a task that did not fit
    for _, level in groupby([t for t in ranked if not t.running], key=by_priority):
        # the same for the whole level; worded once, as is each reason it prefixes
        behind = _behind(blocked_by) if blocked_by else None
        behind_and: dict[str, str] = {}
        failed = []
        for t in level:
            reason = pool.never_fits(t.slots)
            if reason:
                yield Step(t, None, reason)
                continue
            fit = pool.fit(t.slots)
            if fit is None:
                failed.append(t)
                continue
            pool.reserve(fit)
            if evicting.chosen:  # slots in the pool may still be held: start nothing
                yield Step(t, fit, FREED)
            elif not blocked_by or (preemption and t.preemptible):
                yield Step(t, fit, None)
            else:
                yield Step(t, fit, behind)
        for t in failed:
            step = evicting.make_room(t, pool) if preemption else None
            if step is not None:
                yield step
                continue
            reason = holders.waiting(t)
            if preemption and evicting.shields(t):
                reason = f"{reason}; {evicting.note}"
            if behind:
                said = behind_and.get(reason)
                if said is None:
                    said = behind_and[reason] = f"{behind}; {reason}"
                reason = said
            yield Step(t, None, reason)
        blocked_by |= {t.job for t in failed}


def _behind(jobs: set) -> str:
    return f"behind {len(jobs)} job(s) of higher priority"


class _Evictions:
    """The running tasks chosen for eviction in one pass; their resources are back in the
    pass's pool (they will be once the tasks exit)."""

    def __init__(self, running: list[Task], order: dict, min_run_time: float) -> None:
        self.order = order
        self.stopping = [t for t in running if t.stopping and t.preemptible]
        # preemptible tasks not stopping, not protected and not chosen yet, by rank: a walk
        # skips no one
        self.left = SortedKeyList((t for t in running if t.preemptible and not t.stopping
                                   and not protected(t, min_run_time)), key=self._rank)
        # the lowest rank (highest priority, earliest) of the protected: a task ranked above
        # it would have had them as candidates
        self.shield = min((self._rank(t) for t in running
                           if t.preemptible and protected(t, min_run_time)), default=None)
        self.note = protected_note(min_run_time)
        self.chosen: set = set()
        # Slot counts that found no room since the last eviction. Tasks come in rank order and
        # a later task has a subset of the earlier one's candidates in a pool that only filled
        # up since, so it finds no room either: a pass with 75,000 waiting tasks tries a few.
        self.no_room: set[int] = set()

    def _rank(self, t: Task) -> tuple[int, int]:
        return t.priority, self.order[t.id]

    def shields(self, task: Task) -> bool:
        """Whether protected tasks that ``task`` could evict exist (its reason says so)."""
        return self.shield is not None and self.shield > self._rank(task)

    def _candidates(self, task: Task) -> Iterator[Task]:
        yield from (t for t in self.stopping if t.id not in self.chosen)
        # lowest priority, last in queue first; never one ahead of ``task`` at its priority
        rank = self._rank(task)
        if self.left and self._rank(self.left[-1]) > rank:  # the walk costs a bisection
            yield from self.left.irange_key(min_key=rank, reverse=True)

    def make_room(self, task: Task, pool: Pool) -> Step | None:
        """``task``'s step if it can be placed, reserved in ``pool``, or None (nothing
        changed). It takes slots already freed by this pass's evictions if they suffice;
        otherwise candidates (tasks already stopping first: their slots come back anyway,
        then in ``priority.go``'s order) are added until it fits, and those it does not need are
        dropped again (:func:`_needed`)."""
        if self.chosen:
            fit = pool.fit(task.slots)
            if fit is not None:
                pool.reserve(fit)
                return Step(task, fit, FREED)
        if task.slots in self.no_room:
            return None
        removed: list[Task] = []
        extra: dict[Id, list[int]] = {}
        for t in self._candidates(task):
            removed.append(t)
            fit = pool.fit(task.slots, _held([t], extra))
            if fit is not None:
                evict = _needed(task.slots, removed, fit, pool)
                for r in evict:
                    pool.give_back(r)
                    self.chosen.add(r.id)
                    if not r.stopping:
                        self.left.remove(r)
                fit = pool.fit(task.slots)
                pool.reserve(fit)
                self.no_room.clear()  # the evictions gave slots back
                return Step(task, fit, PREEMPTING, tuple(evict))
        self.no_room.add(task.slots)
        return None


def _held(tasks: Iterable[Task], into: dict[Id, list[int]] | None = None
          ) -> dict[Id, list[int]]:
    """``{agent id: slot ids}`` that ``tasks`` hold, added to ``into`` (changed) if given."""
    out = {} if into is None else into
    for t in tasks:
        for agent, slot_ids in t.on.items():
            out.setdefault(agent, []).extend(slot_ids)
    return out


def _needed(slots: int, removed: list[Task], fit: Fit, pool: Pool) -> list[Task]:
    """The tasks of ``removed`` that ``slots`` needs: a minimal subset that still makes room.

    ``removed`` is in the order chosen, ``slots`` fits in ``pool`` once all are gone (as
    ``fit``) and not without the last, so the last stays. Tasks holding nothing on ``fit``'s
    agents go; then, from the last but one back (sparing the higher priorities first), each
    goes if the rest still make room. Fitting only gets easier with more free slots, so what
    is left is minimal: without any one of them, ``slots`` does not fit. Costs one fit per
    task left after the first cut: at most the slots of ``fit``'s agents.
    """
    keep = [t for t in removed if not fit.keys().isdisjoint(t.on)]
    for t in reversed(keep[:-1]):
        rest = [r for r in keep if r is not t]
        if pool.fit(slots, _held(rest)) is not None:
            keep = rest
    return keep
