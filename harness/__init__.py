"""det.harness: the library user training code imports inside a task.

``core`` is the Core API (contexts for metrics, checkpoints, preemption, searcher ops over a
``Transport``); ``pytorch`` the ``PyTorchTrial`` API and its ``Trainer``. ``run`` is the task
entrypoint for trial classes (``python -m det.harness.run module:Class``), ``local`` the
in-process runner behind ``det experiment create --local``.
"""

from det.harness import core, pytorch

__all__ = ["core", "pytorch"]
