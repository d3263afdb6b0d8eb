"""TensorBoard event files of a trial, in its checkpoint storage (issue 13).

Every metric a trial reports is also written as a TensorBoard scalar (training metrics under
their own name, validation metrics prefixed ``val_`` as Determined names them, other groups as
``<group>/<name>``) into a local directory, together with whatever the trial's own
``SummaryWriter`` (``PyTorchTrialContext.get_tensorboard_writer()``) writes there. The
directory is copied to ``<storage>/tensorboard/experiment/<id>/trial/<id>/`` at each checkpoint
and when the task ends, where ``det tensorboard`` can read it.

The ``tensorboard`` package writes the files (installed with det's ``torch`` extra); without it
a warning says once that no event files are written.
"""

import functools
import math
import pathlib
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from det.harness.storage import FsspecStorage


def experiment_dir(experiment_id: int) -> str:
    """Where an experiment's event files live, relative to the storage's base."""
    return f"tensorboard/experiment/{experiment_id}"


def storage_dir(experiment_id: int, trial_id: int) -> str:
    """Where a trial's event files live, relative to the storage's base."""
    return f"{experiment_dir(experiment_id)}/trial/{trial_id}"


def delete_experiment_files(storage: FsspecStorage, experiment_id: int) -> bool:
    """Remove an experiment's event files (its deletion's GC task does). Idempotent: False
    when there were none. Raises ``StorageError`` when the storage refuses."""
    url = f"{storage.base}/{experiment_dir(experiment_id)}"
    return storage.remove_tree(
        url, f"experiment {experiment_id}: cannot remove its TensorBoard files at {url}")


def tag(group: str, name: str) -> str:
    """The TensorBoard tag of metric ``name`` of ``group``."""
    if group == "training":
        return name
    if group == "validation":
        return name if name.startswith("val") else f"val_{name}"
    return f"{group}/{name}"


@functools.cache
def event_writer_class() -> type | None:
    """tensorboard's ``EventFileWriter``, or None when the package is not installed. Its
    import is the dear part of writing event files (~0.4 s of CPU), paid once per process;
    the agent's zygote pays it before it forks its tasks (:mod:`det.agent.zygote`)."""
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        return None
    return EventFileWriter


class TensorboardFiles:
    """A trial's event files: written locally under ``path``, synced to ``storage``."""

    def __init__(self, storage: FsspecStorage, experiment_id: int, trial_id: int,
                 path: pathlib.Path | None = None) -> None:
        self.storage = storage
        self.remote = f"{storage.base}/{storage_dir(experiment_id, trial_id)}"
        self.path = path or pathlib.Path(tempfile.mkdtemp(prefix="det-tensorboard-"))
        self._writer: Any = None
        self._unavailable = False

    def _events(self) -> Any:
        if self._writer is None and not self._unavailable:
            writer_class = event_writer_class()
            if writer_class is None:
                self._unavailable = True
                print("det.harness: warning: the tensorboard package is not installed; no "
                      "TensorBoard event files are written", file=sys.stderr)
                return None
            self._writer = writer_class(str(self.path))
        return self._writer

    def report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Write the finite numeric values of ``metrics`` as scalars at ``steps_completed``."""
        writer = self._events()
        if writer is None:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag(group, name), simple_value=float(value))
                  for name, value in metrics.items()
                  if isinstance(value, int | float) and not isinstance(value, bool)
                  and math.isfinite(value)]
        if values:
            writer.add_event(Event(wall_time=time.time(), step=steps_completed,
                                   summary=Summary(value=values)))

    def sync(self) -> None:
        """Flush, then copy the local event files to the trial's storage directory."""
        if self._writer is not None:
            self._writer.flush()
        if any(self.path.rglob("*")):
            self.storage.fs.put(str(self.path) + "/", self.remote + "/", recursive=True)

    def close(self) -> None:
        """Sync one last time and close the writer."""
        self.sync()
        if self._writer is not None:
            self._writer.close()
