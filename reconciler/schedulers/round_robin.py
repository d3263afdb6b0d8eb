"""The round-robin scheduler (spec: Scheduling; Determined's ``round_robin``, removed upstream in
June 2024).

Jobs take turns, one allocation each per round: jobs holding the fewest slots go first
(then the earliest submitted); every round each job with waiting tasks offers its first
one, which starts if it fits. Rounds repeat until a round starts nothing. It never
preempts. Zero-slot tasks are scheduled apart, in the same way.
"""

from collections.abc import Sequence

from det.reconciler.schedulers.fitting import Holders, Pool, split
from det.reconciler.schedulers.model import Agent, Decision, Id, Task


def schedule(agents: Sequence[Agent], tasks: Sequence[Task], *,
             fitting_policy: str = "best") -> Decision:
    """One pass over ``tasks`` (queue order) on ``agents``; see the module rules."""
    out = Decision()
    for part in split(tasks):
        if part:  # a pool's scratch copy costs a walk of its agents
            _schedule(part, Pool(agents, fitting_policy), out)
    return out


def _schedule(tasks: Sequence[Task], pool: Pool, out: Decision) -> None:
    queues: dict[Id, list[Task]] = {}
    held: dict[Id, int] = {}
    for t in tasks:
        held[t.job] = held.get(t.job, 0) + (t.slots if t.running else 0)
        if t.running:
            continue
        reason = pool.never_fits(t.slots)
        if reason:
            out.reasons[t.id] = reason
        else:
            queues.setdefault(t.job, []).append(t)
    turn = sorted(queues, key=lambda j: held[j])  # stable: submission order breaks ties
    started = True
    while started:
        started = False
        for j in turn:
            if not queues[j]:
                continue
            t = queues[j][0]
            fit = pool.fit(t.slots)
            if fit is None:
                continue
            pool.reserve(fit)
            out.allocate[t.id] = fit
            queues[j].pop(0)
            started = True
    holders = Holders(tasks)
    for j in turn:
        for i, t in enumerate(queues[j]):
            out.reasons[t.id] = (holders.waiting(t) if i == 0 else
                                 f"waiting its turn: {i} earlier task(s) of its job go first")
