"""The fair-share scheduler (spec: Scheduling, Fair-Share).

The pool's slots are divided among active jobs in proportion to demand × weight, each share
capped at the job's demand (what is left over goes to the others): on 8 slots, demands 10
and 30 get 2 and 6; with weights 3 and 1 they get 4 and 4. A job's demand is the slots of its
tasks, running or waiting, capped by ``max_slots``. Shares are whole slots (largest
remainder, so each is within one slot of its exact share), and a job whose share rounds to
0 gets one slot from a job that was rounded up, if one can spare it. A job holding more than
its share gives slots back by preempting its preemptible tasks, longest held first, never one
still protected (:mod:`.preemption`: no checkpoint yet and younger than ``min_run_time``); a
job holding less starts its waiting tasks in queue order. Where shares tie (equal
remainders), jobs that hold slots keep them: a tie never preempts one run to start another.
A job whose share is smaller than its smallest waiting task, and which holds nothing, is
left out and its share goes to the others.
Zero-slot tasks are started first come, first served.
"""

from collections.abc import Mapping, Sequence
from math import floor

from det.reconciler.schedulers.fitting import Holders, Pool, split
from det.reconciler.schedulers.model import Agent, Decision, Id, Task
from det.reconciler.schedulers.preemption import MIN_RUN_TIME, give_back_order, protected_note


def shares(capacity: int, demand: Mapping[Id, int], weight: Mapping[Id, float]) -> dict[Id, int]:
    """Whole-slot shares of ``capacity`` slots: proportional to demand × weight, capped at
    demand (water-filling), each within one slot of its exact share. Ties go to the job
    first in ``demand``'s order. O(jobs · log jobs)."""
    out = {j: 0 for j in demand}
    open_ = [j for j in demand if demand[j] > 0 and weight[j] > 0]
    cap = float(capacity)
    total = sum(demand[j] * weight[j] for j in open_)
    # Job j is capped when cap·d·w/total >= d, i.e. w >= total/cap: heaviest weights first.
    by_weight = sorted(open_, key=lambda j: -weight[j])
    capped = 0
    while capped < len(by_weight) and cap > 0:
        j = by_weight[capped]
        if weight[j] * cap < total:
            break
        out[j] = demand[j]
        cap -= demand[j]
        total -= demand[j] * weight[j]
        capped += 1
    rest = set(by_weight[capped:]) if cap > 0 else set()
    open_ = [j for j in open_ if j in rest]
    if not open_:
        return out
    exact = {j: cap * demand[j] * weight[j] / total for j in open_}
    for j in open_:
        out[j] = floor(exact[j])
    left = round(cap) - sum(out[j] for j in open_)
    for j in sorted(open_, key=lambda j: floor(exact[j]) - exact[j])[:left]:
        out[j] += 1
    # Avoid starving a job whose share rounds to 0, if a job rounded up can spare a slot.
    donors = sorted((j for j in open_ if out[j] > 1 and out[j] > exact[j]),
                    key=lambda j: exact[j] - out[j])
    for j in open_:
        if out[j] == 0 and donors:
            d = donors.pop(0)
            out[d] -= 1
            out[j] = 1
    return out


def schedule(agents: Sequence[Agent], tasks: Sequence[Task], *,
             fitting_policy: str = "best", min_run_time: float = MIN_RUN_TIME) -> Decision:
    """One pass over ``tasks`` (queue order) on ``agents``; see the module rules.
    ``min_run_time``: seconds a run without a checkpoint is not preempted."""
    out = Decision()
    slot_tasks, aux_tasks = split(tasks)
    pool = Pool(agents, fitting_policy)
    holders = Holders(tasks)
    for t in aux_tasks:  # FIFO
        if t.running:
            continue
        reason = pool.never_fits(0)
        fit = None if reason else pool.fit(0)
        if fit is None:
            out.reasons[t.id] = reason or holders.waiting(t)
        else:
            pool.reserve(fit)
            out.allocate[t.id] = fit
    _slots(agents, slot_tasks, pool, holders, out, min_run_time)
    return out


def _slots(agents: Sequence[Agent], tasks: Sequence[Task], pool: Pool, holders: Holders,
           out: Decision, min_run_time: float) -> None:
    live = []
    for t in tasks:
        reason = None if t.running else pool.never_fits(t.slots)
        if reason:
            out.reasons[t.id] = reason
        else:
            live.append(t)
    jobs: dict[Id, list[Task]] = {}
    for t in live:
        jobs.setdefault(t.job, []).append(t)
    # Per job, in one walk of its tasks (a pass may see 100,000 jobs): demand (capped at
    # max_slots), weight, slots held, slots pinned (non-preemptible work keeps its slots
    # whatever the shares say) and its smallest waiting task (0: none waits).
    demand: dict[Id, int] = {}
    weight: dict[Id, float] = {}
    held: dict[Id, int] = {}
    pinned: dict[Id, int] = {}
    smallest: dict[Id, int] = {}
    for j, ts in jobs.items():
        total = holds = pins = 0
        least = None
        for t in ts:
            total += t.slots
            if t.running:
                holds += t.slots
                if not t.preemptible:
                    pins += t.slots
            elif least is None or t.slots < least:
                least = t.slots
        cap = ts[0].max_slots
        demand[j] = min(total, cap if cap is not None else 1 << 30)
        weight[j] = ts[0].weight
        held[j] = holds
        pinned[j] = pins
        smallest[j] = least or 0
    capacity = sum(len(a.slots) for a in agents) - sum(pinned.values())
    # Jobs that hold nothing and whose share is below their smallest task cannot use it:
    # leave them out (all found in one round, so a pass stays O(jobs log jobs)) and share
    # again among the rest.
    left_out: set[Id] = set()
    # Jobs holding slots first: shares break ties by this order (with three equal
    # searches on two slots, a tie given to the first in the queue preempted a run just
    # started by another, at 0 batches).
    order = sorted(jobs, key=lambda j: held[j] == 0)
    while True:
        want = {j: 0 if j in left_out else max(0, demand[j] - pinned[j]) for j in order}
        offer = {j: s + pinned[j] for j, s in shares(capacity, want, weight).items()}
        starved = {j for j in jobs if j not in left_out and held[j] == 0
                   and 0 < offer[j] < smallest[j]}
        if not starved:
            break
        left_out |= starved
    # the job the slots given back go to: the first below its share with a task waiting
    taker = next((j for j in jobs if offer[j] > held[j] and smallest[j]
                  and j not in left_out), None)
    kept = False  # slots above a share that protected runs keep for now
    for j, ts in jobs.items():
        if held[j] > offer[j]:
            kept |= _give_back(ts, held[j] - offer[j], out, taker, min_run_time)
            for t in ts:
                if not t.running:
                    out.reasons[t.id] = (f"above its fair share: holds {held[j]} slot(s), "
                                         f"share is {offer[j]}")
    for j, ts in jobs.items():
        if held[j] > offer[j]:
            continue
        room = offer[j] - held[j]
        for t in ts:
            if t.running:
                continue
            if j in left_out:
                out.reasons[t.id] = ("its fair share is smaller than its smallest task "
                                     f"({t.slots} slots); waiting for a larger share")
                continue
            if t.slots > room:
                got = offer[j] - room
                out.reasons[t.id] = (f"at its fair share: holds {got} of {offer[j]} slot(s)"
                                     if got else
                                     f"its fair share is {offer[j]} slot(s), it needs {t.slots}")
                continue
            fit = pool.fit(t.slots)
            if fit is None:
                out.reasons[t.id] = (f"{holders.waiting(t)}; {protected_note(min_run_time)}"
                                     if kept else holders.waiting(t))
                continue
            pool.reserve(fit)
            out.allocate[t.id] = fit
            room -= t.slots


def _give_back(tasks: list[Task], excess: int, out: Decision, taker: Id | None,
               min_run_time: float) -> bool:
    """Preempt the job's running tasks in :func:`.preemption.give_back_order` until
    ``excess`` slots are freed, each recorded as preempted for ``taker``. Returns whether
    some excess stays held because the rest are protected."""
    for t in give_back_order(tasks, min_run_time):
        if excess <= 0:
            break
        if not t.stopping:
            out.release.append(t.id)
            out.preempted_for[t.id] = (taker, "fair share")
        excess -= t.slots
    return excess > 0
