"""The reconcile contract: what a step of det's control loop reads, writes and returns.

det's counterpart of controller-runtime's ``reconcile.go``. A :class:`Step` is called by the
leader (:mod:`det.reconciler.loop`) with the connection that holds leadership, in autocommit
mode, and opens its own transactions. det has two: the pass
(:func:`det.reconciler.passes.run_pass`) and the provisioner
(:meth:`det.reconciler.provision.Provisioner.step`), run in that order. A step

* **reads** desired state (experiments and their configs, trials, searcher events, jobs,
  allocations' desired states, pools) and observed state (agents' heartbeats and slots,
  allocations' observed states and exit codes, instances), all of it from the tables: what it
  keeps in memory between calls (provider clients, a provider's last listing) only saves work;
* **writes** only the difference, in transactions each complete in itself: agents marked
  LOST, ended runs settled into their trials, interactive tasks ended, searcher decisions,
  new allocations, their assignment to slots, desired-state changes, checkpoint GC, elastic
  pools' instances. Observed state is the agents' and tasks' to write, except that a step
  ends runs whose agent is lost or that were stopped before they started. Outside its
  transactions it may act on the world (launch or stop an instance through a provider),
  having recorded first what it will do;
* is **idempotent and level-triggered**: once the tables hold what it decided, calling it
  again changes nothing, and a call cut short anywhere (a kill, a lost connection) leaves
  what the next call carries on from. NOTIFY only wakes the loop early, so a lost one delays
  work and never loses it;
* **returns** a :class:`Result`: how many rows it changed. Tables that moved may hold the
  next decision (run ended -> searcher -> new trial -> placement), so the loop runs the steps
  again at once (:attr:`Result.requeue`); when nothing changed it comes back after its
  interval (``det reconcile --interval``, seconds, at most a third of ``--lease``) or at the
  next NOTIFY. A step that raises has rolled back the transaction it was in: the loop logs
  it and tries again after the interval, or, the connection lost, first reconnects and
  waits to lead again.

Only the leader runs steps (:mod:`det.reconciler.leader`): they run on the connection that
holds a session advisory lock, so if that connection dies, the ability to write dies with it.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import psycopg


@dataclass
class Result:
    """What a step did: ``changes``, the number of rows it wrote (inserted, updated or
    deleted)."""

    changes: int = 0

    @property
    def requeue(self) -> bool:
        """Whether the loop runs the steps again at once: they changed something, so the
        tables may hold the next decision. Otherwise it comes back after its interval or at
        the next NOTIFY."""
        return self.changes > 0


class Step(Protocol):
    """One reconcile step, run on the leader's connection ``conn`` (autocommit). Raises what
    its statements raise (:class:`psycopg.Error`): the transaction it was in has rolled back,
    those it committed before stand (each is complete in itself)."""

    def __call__(self, conn: psycopg.Connection, /) -> Result: ...


def run_steps(conn: psycopg.Connection, steps: Sequence[Step]) -> Result:
    """Run each of ``steps`` on ``conn``, in order; the result counts all their changes."""
    return Result(sum(step(conn).changes for step in steps))
