"""The reconciler: det's only control loop.

Contract (the equivalent of controller-runtime's ``reconcile.go``):

* **Reads** desired state (experiments, trials, searcher events, allocations' desired states)
  and observed state (agents' heartbeats, allocations' observed states and exit codes).
* **Writes** only the difference, in two transactions per pass, placement on freed slots
  first (:mod:`det.reconciler.passes`):
  agents marked LOST, trials settled, interactive tasks' runs settled and idle ones ended,
  searcher decisions, new allocations, assignments of allocations to slots, desired-state
  changes; after each pass, elastic pools' instances (:mod:`det.reconciler.provision`:
  launched and stopped through a provider, outside its transactions). Agents and tasks write
  observed state; the
  reconciler never does, except to end allocations whose agent is lost or that were stopped
  before they started.
* **Idempotent and level-triggered**: a pass computes everything from the tables, so running
  it twice changes nothing the second time, and a lost NOTIFY only delays work until the next
  timer tick.
* **One leader** (:mod:`det.reconciler.leader`): passes run on the connection that holds a
  session advisory lock; if that connection dies, the lock and the ability to write die with it.
* **Returns** nothing; the loop runs again when woken by NOTIFY on its channel or after
  ``interval`` seconds.

Decisions are pure functions over plain data: :mod:`det.reconciler.schedulers` (placement),
:mod:`det.reconciler.trials` (what an ended run means for its trial),
:mod:`det.reconciler.tasks` (when det ends an interactive task),
:mod:`det.reconciler.searchers` (hyperparameter search),
:mod:`det.reconciler.provisioner` (elastic pools' instances).
"""
