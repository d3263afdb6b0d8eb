"""No waste from preemption (issue 34): with three searches on two slots a trial was started
twice and preempted at 0 batches both times, with no reason recorded, while the experiment
page said it ran.

The pure rule (det.reconciler.schedulers.preemption): a run is protected until it reports a
checkpoint or has held its slots for scheduler.min_run_time; of the rest, the longest held
goes first; fair-share ties keep slots where they are. Then, on a real database: every way a
run ends leaves a reason (det_run_end_reason), a trial's latest run reads as the queue sees
it (det_run_status), and the scenario itself with the real reconciler and agent.
"""

import math
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from pydantic import ValidationError

from det.configs.cluster import SchedulerConfig
from det.reconciler.schedulers import Agent, Task, schedule
from det.reconciler.schedulers.preemption import give_back_order, protected

FAIR = SchedulerConfig(type="fair_share")
PRIO = SchedulerConfig(type="priority", preemption=True)


def agent(n: int, used: int) -> Agent:
    return Agent("g", tuple(range(n)), tuple(range(used, n)))


def run(tid: str, job: str, slot: int, *, ran: float = math.inf, checkpointed: bool = False,
        **kw) -> Task:
    """A running one-slot task on agent g's ``slot``."""
    return Task(tid, job, 1, running=True, on={"g": (slot,)}, ran=ran,
                checkpointed=checkpointed, **kw)


# -- the pure rule ------------------------------------------------------------------------------

def test_a_run_is_protected_until_it_checkpoints_or_reaches_min_run_time() -> None:
    fresh = run("a", "j", 0, ran=5.0)
    assert protected(fresh, 60)
    assert not protected(fresh._replace(checkpointed=True), 60)
    assert not protected(fresh._replace(ran=60.0), 60)
    assert not protected(fresh, 0)  # min_run_time 0: the old behaviour
    assert not protected(fresh._replace(stopping=True), 60)
    assert not protected(Task("p", "j", 1), 60)  # waiting: holds nothing


def test_the_longest_held_run_is_given_back_first_and_a_fresh_one_never() -> None:
    tasks = [run("old", "j", 0, ran=300.0), run("newer", "j", 1, ran=90.0),
             run("fresh", "j", 2, ran=3.0), run("stop", "j", 3, ran=1.0, stopping=True),
             run("fresh-ckpt", "j", 4, ran=4.0, checkpointed=True)]
    order = [t.id for t in give_back_order(tasks, 60)]
    assert order == ["stop", "old", "newer", "fresh-ckpt"]


def test_fair_share_keeps_a_fresh_run_and_says_why_the_other_waits() -> None:
    """Job a holds both slots (one run fresh, one not): b's share is 1. Before issue 34 the
    newest (the fresh one) was preempted; now the older one is, naming b and the rule."""
    tasks = [run("a.0", "a", 0, ran=120.0), run("a.1", "a", 1, ran=2.0), Task("b.0", "b", 1)]
    d = schedule(FAIR, [agent(2, 2)], tasks)
    assert d.release == ["a.0"] and d.preempted_for == {"a.0": ("b", "fair share")}
    # Both fresh: nothing is preempted this pass, and b's reason says until when.
    both = [run("a.0", "a", 0, ran=1.0), run("a.1", "a", 1, ran=2.0), Task("b.0", "b", 1)]
    d = schedule(FAIR, [agent(2, 2)], both)
    assert d.release == [] and not d.allocate
    assert d.reasons["b.0"] == (
        "waiting for 1 free slot(s); slots are held by job a; the runs holding them are not "
        "preempted before they checkpoint or have run 60 s (scheduler.min_run_time)")
    # Once one has checkpointed it goes, whatever its age.
    ckpt = [both[0], both[1]._replace(checkpointed=True), both[2]]
    assert schedule(FAIR, [agent(2, 2)], ckpt).release == ["a.1"]
    # min_run_time 0 turns the protection off.
    assert schedule(SchedulerConfig(min_run_time=0), [agent(2, 2)], both).release == ["a.1"]


def test_fair_share_ties_leave_slots_with_the_jobs_that_hold_them() -> None:
    """Three equal searches on two slots: exact shares 2/3 each, so one job gets none. The
    issue's trial 22: b and c ran, a (first in the queue) won the tie, and c's run, just
    started, was preempted at 0 batches. Now a tie keeps the slots where they are."""
    tasks = [Task("a.0", "a", 1), run("b.0", "b", 0, ran=1.0), run("c.0", "c", 1, ran=1.0)]
    for min_run_time in (60, 0):
        d = schedule(SchedulerConfig(min_run_time=min_run_time), [agent(2, 2)], tasks)
        assert d.release == [] and not d.allocate
    # On an empty pool the queue order still decides.
    fresh = [Task("a.0", "a", 1), Task("b.0", "b", 1), Task("c.0", "c", 1)]
    assert sorted(schedule(FAIR, [agent(2, 0)], fresh).allocate) == ["a.0", "b.0"]


def test_priority_preempts_another_run_than_a_fresh_one() -> None:
    low = [run("low.0", "low", 0, ran=2.0, priority=50),
           run("low.1", "low", 1, ran=100.0, priority=50)]
    high = Task("high.0", "high", 1, priority=10)
    d = schedule(PRIO, [agent(2, 2)], [*low, high])
    assert d.release == ["low.1"]
    assert d.preempted_for == {"low.1": ("high", "priority 10 over 50")}
    # Only fresh runs: the high-priority task waits, saying why.
    fresh = [low[0], low[1]._replace(ran=5.0)]
    d = schedule(PRIO, [agent(2, 2)], [*fresh, high])
    assert d.release == [] and "scheduler.min_run_time" in d.reasons["high.0"]


def test_min_run_time_is_a_scheduler_key_with_default_60_s() -> None:
    assert SchedulerConfig().min_run_time == 60
    with pytest.raises(ValidationError, match="min_run_time"):
        SchedulerConfig(min_run_time=-1)
