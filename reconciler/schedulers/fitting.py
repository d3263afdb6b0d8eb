"""Where a task fits: a scratch copy of the pool's free slots (notes §2.3, spec: Scheduling).

A multi-slot task lands on one agent when one has enough free slots, chosen by the fitting
policy: ``best`` packs (the agent left with the fewest free slots), ``worst`` spreads (the
most). Otherwise it takes whole idle agents of one size (the largest size that divides the
request): all or nothing. Zero-slot tasks take one of an agent's ``max_aux`` places, packed or
spread the same way.
"""

from collections.abc import Iterable, Sequence

from det.reconciler.schedulers.model import Agent, Id, Task

Fit = dict[Id, list[int]]


class Pool:
    """Free slots and aux places per agent, changed as fits are reserved and tasks removed."""

    def __init__(self, agents: Sequence[Agent], policy: str = "best") -> None:
        self.policy = policy
        self.order = [a.id for a in sorted(agents, key=lambda a: str(a.id))]
        self.size = {a.id: len(a.slots) for a in agents}
        self.free = {a.id: list(a.free) for a in agents}
        self.aux_free = {a.id: max(0, a.max_aux - a.aux_running) for a in agents}
        self.max_aux = {a.id: a.max_aux for a in agents}

    def copy(self) -> "Pool":
        other = Pool.__new__(Pool)
        other.policy, other.order, other.size = self.policy, self.order, self.size
        other.free = {a: list(s) for a, s in self.free.items()}
        other.aux_free, other.max_aux = dict(self.aux_free), self.max_aux
        return other

    def fit(self, slots: int) -> Fit | None:
        """Where ``slots`` slots (0: one aux place) would go now, or None; reserves nothing."""
        if slots == 0:
            open_ = [a for a in self.order if self.aux_free[a] > 0]
            if not open_:
                return None
            key = ((lambda a: self.aux_free[a]) if self.policy == "best"
                   else (lambda a: -self.aux_free[a] / self.max_aux[a]))
            return {min(open_, key=key): []}
        fitting = [a for a in self.order if len(self.free[a]) >= slots]
        if fitting:
            sign = 1 if self.policy == "best" else -1
            agent = min(fitting, key=lambda a: sign * len(self.free[a]))
            return {agent: sorted(self.free[agent])[:slots]}
        return self._gang(slots)

    def _gang(self, slots: int) -> Fit | None:
        by_size: dict[int, list[Id]] = {}
        for a in self.order:
            if self.free[a] and len(self.free[a]) == self.size[a]:
                by_size.setdefault(self.size[a], []).append(a)
        for size, idle in sorted(by_size.items(), reverse=True):
            if slots % size == 0 and len(idle) >= slots // size:
                return {a: sorted(self.free[a]) for a in idle[: slots // size]}
        return None

    def reserve(self, fit: Fit) -> None:
        for agent, slot_ids in fit.items():
            if slot_ids:
                taken = set(slot_ids)
                self.free[agent] = [s for s in self.free[agent] if s not in taken]
            else:
                self.aux_free[agent] -= 1

    def give_back(self, task: Task) -> None:
        """Return a running task's resources (it is being preempted, in a what-if copy)."""
        for agent, slot_ids in task.on.items():
            if agent not in self.free:
                continue
            if task.slots == 0:
                self.aux_free[agent] += 1
            else:
                self.free[agent].extend(slot_ids)


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
    for size in set(sizes):
        if task.slots % size == 0 and sizes.count(size) * size >= task.slots:
            return None
    return (f"needs {task.slots} slots on one agent but the largest agent has {max(sizes)}, "
            "and no set of equal idle agents adds up to it")


def holders(tasks: Iterable[Task], exclude: Id | None = None) -> str:
    """"jobs X and Y": the jobs of running ``tasks``, for a reason text."""
    jobs = sorted({str(t.job) for t in tasks if t.running and t.job != exclude},
                  key=lambda j: (len(j), j))
    if not jobs:
        return ""
    if len(jobs) > 3:
        return f"jobs {', '.join(jobs[:3])} and {len(jobs) - 3} more"
    return "job " + jobs[0] if len(jobs) == 1 else f"jobs {', '.join(jobs[:-1])} and {jobs[-1]}"


def waiting_for_slots(task: Task, tasks: Iterable[Task]) -> str:
    """The reason of a task that would fit in an emptier pool."""
    held = holders(tasks, exclude=task.job)
    what = "an aux container place" if task.slots == 0 else f"{task.slots} free slot(s)"
    return f"waiting for {what}" + (f"; slots are held by {held}" if held else "")


def split(tasks: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """(slot tasks, zero-slot tasks): the two are scheduled apart (spec: Scheduling)."""
    return [t for t in tasks if t.slots > 0], [t for t in tasks if t.slots == 0]
