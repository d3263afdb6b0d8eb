"""The reconciler: det's only control loop.

The contract each of its steps keeps (what it reads, what it may write, that it is idempotent
and level-triggered, what it returns) is :mod:`det.reconciler.contract`, the equivalent of
controller-runtime's ``reconcile.go``. The loop (:mod:`det.reconciler.loop`) runs the steps,
the pass (:mod:`det.reconciler.passes`, two transactions, placement on freed slots first) and
the provisioner (:mod:`det.reconciler.provision`), as the one leader
(:mod:`det.reconciler.leader`).

Decisions are pure functions over plain data: :mod:`det.reconciler.schedulers` (placement),
:mod:`det.reconciler.trials` (what an ended run means for its trial),
:mod:`det.reconciler.tasks` (when det ends an interactive task),
:mod:`det.reconciler.searchers` (hyperparameter search),
:mod:`det.reconciler.provisioner` (elastic pools' instances).
"""
