"""Where a task fits: the pool's free slots, indexed for a pass (Determined 0.38's ``fitting.go``,
spec: Scheduling).

A multi-slot task lands on one agent when one has enough free slots, chosen by the fitting
policy: ``best`` packs (the agent left with the fewest free slots), ``worst`` spreads (the
most); ties go to the first agent by id. Otherwise it takes whole idle agents of one size (the
largest size that divides the request): all or nothing. Zero-slot tasks take one of an
agent's ``max_aux`` places, packed or spread the same way.

Agents are bucketed by free-slot count, so a fit costs O(slots per agent · log agents), not
O(agents): a pass over 10,000 tasks and 1,000 agents stays cheap.
"""

import heapq
from collections.abc import Iterable, Mapping, Sequence

from sortedcontainers import SortedList

from det.reconciler.schedulers.model import Agent, Id, Task

Fit = dict[Id, list[int]]


class _Buckets:
    """Agents by a count (free slots, free aux places): ``{count: agents in id order}``."""

    def __init__(self, counts: Sequence[int]) -> None:
        """``counts[rank]``: agent ``rank``'s count (0: in no bucket)."""
        ranks: dict[int, list[int]] = {}
        for i, n in enumerate(counts):
            if n:
                ranks.setdefault(n, []).append(i)
        self.by: dict[int, SortedList] = {n: SortedList(r) for n, r in ranks.items()}

    def move(self, rank: int, old: int | None, new: int | None) -> None:
        if old:
            self.by[old].remove(rank)
        if new:
            self.by.setdefault(new, SortedList()).add(rank)

    def pick(self, at_least: int, smallest: bool) -> int | None:
        """The first agent (rank) in the smallest (or largest) bucket >= ``at_least``."""
        counts = sorted((k for k, v in self.by.items() if k >= at_least and v),
                        reverse=not smallest)
        return self.by[counts[0]][0] if counts else None


class Pool:
    """Free slots and aux places per agent, changed as fits are reserved and tasks removed."""

    def __init__(self, agents: Sequence[Agent], policy: str = "best") -> None:
        self.best = policy == "best"
        self.agents = sorted(agents, key=lambda a: str(a.id))
        self.rank = {a.id: i for i, a in enumerate(self.agents)}
        self.free = [sorted(a.free) for a in self.agents]
        self.aux_free = [max(0, a.max_aux - a.aux_running) for a in self.agents]
        self.slots = _Buckets([len(f) for f in self.free])
        self.aux = _Buckets(self.aux_free)
        # size -> agents with every slot free
        self.idle = _Buckets([len(a.slots) if len(f) == len(a.slots) else 0
                              for a, f in zip(self.agents, self.free, strict=True)]).by
        self.sizes = sorted({len(a.slots) for a in self.agents}, reverse=True)  # for gangs
        self._unfit: dict[int, str | None] = {}
        # Slot counts with no fit since resources last came back (give_back): reserving only
        # takes, so they still have none; a pass over 100,000 waiting tasks looks a few up.
        self._full: set[int] = set()

    def never_fits(self, slots: int) -> str | None:
        """``never_fits`` for this pool's agents, remembered per slot count."""
        if slots not in self._unfit:
            self._unfit[slots] = never_fits(Task(None, None, slots), self.agents)
        return self._unfit[slots]

    def fit(self, slots: int, extra: Mapping[Id, Iterable[int]] | None = None) -> Fit | None:
        """Where ``slots`` slots (0: one aux place) would go now, or None; reserves nothing.

        ``extra``: slots that would also be free (held by tasks being preempted); only agents
        named there can newly fit, since a fit without them was already looked for.
        """
        if extra:
            return self._fit_with(slots, extra)
        if slots in self._full:
            return None
        fit = self._fit(slots)
        if fit is None:
            self._full.add(slots)
        return fit

    def _fit(self, slots: int) -> Fit | None:
        if slots == 0:
            i = self.aux.pick(1, self.best)
            return None if i is None else {self.agents[i].id: []}
        i = self.slots.pick(slots, self.best)
        if i is not None:
            return {self.agents[i].id: self.free[i][:slots]}
        for size in sorted(self.idle, reverse=True):
            idle = self.idle[size]
            if slots % size == 0 and len(idle) >= slots // size:
                return {self.agents[j].id: list(self.free[j]) for j in idle[: slots // size]}
        return None

    def _fit_with(self, slots: int, extra: Mapping[Id, Iterable[int]]) -> Fit | None:
        ranks = sorted(self.rank[a] for a in extra if a in self.rank)
        if slots == 0:  # a preempted zero-slot task frees a place on its agent
            return {self.agents[ranks[0]].id: []} if ranks else None
        free = {i: sorted([*self.free[i], *extra[self.agents[i].id]]) for i in ranks}
        single = [i for i in ranks if len(free[i]) >= slots]
        if single:
            sign = 1 if self.best else -1
            i = min(single, key=lambda i: (sign * len(free[i]), i))
            return {self.agents[i].id: free[i][:slots]}
        for size in self.sizes:
            if slots % size:
                continue
            now_idle = [i for i in ranks if len(self.agents[i].slots) == size
                        and len(free[i]) == size]
            idle = sorted({*self.idle.get(size, ()), *now_idle})
            if len(idle) >= slots // size:
                return {self.agents[i].id: free.get(i, self.free[i]) for i in
                        idle[: slots // size]}
        return None

    def reserve(self, fit: Fit) -> None:
        for agent, slot_ids in fit.items():
            i = self.rank[agent]
            if slot_ids:
                taken = set(slot_ids)
                self._set_free(i, [s for s in self.free[i] if s not in taken])
            else:
                self.aux.move(i, self.aux_free[i], self.aux_free[i] - 1)
                self.aux_free[i] -= 1

    def give_back(self, task: Task) -> None:
        """Return a running task's resources (it is being preempted)."""
        self._full.clear()
        for agent, slot_ids in task.on.items():
            i = self.rank.get(agent)
            if i is None:
                continue
            if task.slots == 0:
                self.aux.move(i, self.aux_free[i], self.aux_free[i] + 1)
                self.aux_free[i] += 1
            else:
                self._set_free(i, sorted([*self.free[i], *slot_ids]))

    def _set_free(self, i: int, free: list[int]) -> None:
        size = len(self.agents[i].slots)
        if len(self.free[i]) == size and size:
            self.idle[size].remove(i)
        self.slots.move(i, len(self.free[i]), len(free))
        self.free[i] = free
        if len(free) == size and size:
            self.idle.setdefault(size, SortedList()).add(i)


def never_fits(task: Task, agents: Sequence[Agent]) -> str | None:
    """Why ``task`` could not run in this pool even if it were empty, or None if it could."""
    if not agents:
        return "pool has no agents"
    if task.slots == 0:
        if all(a.max_aux == 0 for a in agents):
            return "no agent of the pool takes zero-slot tasks (max_aux_containers_per_agent 0)"
        return None
    sizes = [len(a.slots) for a in agents]
    if max(sizes) >= task.slots:
        return None
    total = sum(sizes)
    if total < task.slots:
        return f"needs {task.slots} slots but the pool has {total}"
    for size in set(sizes) - {0}:  # an agent of no slots is part of no gang
        if task.slots % size == 0 and sizes.count(size) * size >= task.slots:
            return None
    return (f"needs {task.slots} slots on one agent but the largest agent has {max(sizes)}, "
            "and no set of equal idle agents adds up to it")


class Holders:
    """Which jobs hold resources, to name them in reasons ("slots are held by jobs 3 and 7")."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self.held = {t.job for t in tasks if t.running}
        # Reasons name at most the first four others, so five are kept (of up to 100,000).
        self.jobs = heapq.nsmallest(5, map(str, self.held), key=lambda j: (len(j), j))
        # the reason depends only on the slots and on whether the task's own job holds some:
        # a pass over 100,000 waiting tasks words a handful of reasons
        self._said: dict[tuple[int, Id | None], str] = {}

    def waiting(self, task: Task) -> str:
        """The reason of a task that would fit in an emptier pool."""
        holds = task.job in self.held
        key = (task.slots, task.job if holds else None)
        said = self._said.get(key)
        if said is None:
            said = self._said[key] = self._waiting(task.slots, str(task.job), holds)
        return said

    def _waiting(self, slots: int, job: str, holds: bool) -> str:
        what = "an aux container place" if slots == 0 else f"{slots} free slot(s)"
        others = [j for j in self.jobs if j != job][:4]
        if not others:
            return f"waiting for {what}"
        more = len(self.held) - holds - 3
        if len(others) == 1:
            held = f"job {others[0]}"
        elif more > 0:
            held = f"jobs {', '.join(others[:3])} and {more} more"
        else:
            held = f"jobs {', '.join(others[:-1])} and {others[-1]}"
        return f"waiting for {what}; slots are held by {held}"


def split(tasks: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """(slot tasks, zero-slot tasks): the two are scheduled apart (spec: Scheduling)."""
    return [t for t in tasks if t.slots > 0], [t for t in tasks if t.slots == 0]
