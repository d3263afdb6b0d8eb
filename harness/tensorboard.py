"""TensorBoard event files of a trial, in its checkpoint storage (issue 13).

Every metric a trial reports is also written as a TensorBoard scalar (training metrics under
their own name, validation metrics prefixed ``val_`` as Determined names them, other groups as
``<group>/<name>``) into a local directory, together with whatever the trial's own
``SummaryWriter`` (``PyTorchTrialContext.get_tensorboard_writer()``) writes there. The
directory is copied to ``<storage>/tensorboard/experiment/<id>/trial/<id>/`` at each checkpoint
and when the task ends, where ``det tensorboard`` can read it.

Events are encoded with the ``tensorboard`` package's protobuf classes and framed with
``google_crc32c`` (both installed with det's ``torch`` extra); without them a warning says once
that no event files are written.
"""

import functools
import math
import os
import pathlib
import shutil
import socket
import struct
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


@functools.lru_cache(maxsize=4096)
def _tag(group: str, name: Any) -> str:
    """``tag(group, str(name))``, remembered: a trial reports the same few names each step."""
    return tag(group, str(name))


@functools.cache
def event_protos() -> tuple[Any, Any] | None:
    """tensorboard's ``Event`` protobuf class and ``google_crc32c``, or None
    when they are not installed (det's ``torch`` extra installs them). Imported once per
    process (~20 ms of CPU); the agent's zygote imports them before it forks its tasks
    (:mod:`det.agent.zygote`)."""
    try:
        import google_crc32c
        from tensorboard.compat.proto.event_pb2 import Event
    except ImportError:
        return None
    return Event, google_crc32c


def _masked_crc(crc32c: Any, data: bytes) -> bytes:
    """The TFRecord format's masked CRC-32C of ``data``, little-endian."""
    x = crc32c.value(data)
    return struct.pack("<I", (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


class EventFile:
    """One TensorBoard event file written synchronously: TFRecord framing (length, masked
    CRC-32C of the length, the serialized ``Event``, its masked CRC) into a buffered file.

    Not tensorboard's ``EventFileWriter``: that one hands each event to a writer thread through
    a 10-event queue and computes CRCs in pure Python, ~60 us a report on this host, which
    made a task reporting in a loop 4x slower (bench/metric_rows.py). Scalar events reuse one
    ``Event`` message: building a fresh ``Event``, ``Summary`` and ``Value`` objects per report
    cost 14 us on a 2-core host, refilling one costs 5 us."""

    def __init__(self, directory: pathlib.Path, protos: tuple[Any, Any]) -> None:
        self._event, self._crc32c = protos
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.det")
        self._file = open(directory / name, "wb", buffering=1 << 16)  # noqa: SIM115
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))
        self._scalar_event = self._event()

    def scalars(self, steps_completed: int, values: list[tuple[str, float]]) -> None:
        """One event holding ``values`` (tag, value) as scalars at ``steps_completed``."""
        event = self._scalar_event
        event.Clear()
        event.wall_time = time.time()
        event.step = steps_completed
        add = event.summary.value.add
        for t, v in values:
            add(tag=t, simple_value=v)
        self._write(event)

    def _write(self, event: Any) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self._file.write(header + _masked_crc(self._crc32c, header) + data
                         + _masked_crc(self._crc32c, data))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorboardFiles:
    """A trial's event files: written locally under ``path``, synced to ``storage``.

    Without ``path`` they go to a temporary directory of their own, removed by :meth:`close`
    (each trial used to leave one behind, with every event it wrote)."""

    def __init__(self, storage: FsspecStorage, experiment_id: int, trial_id: int,
                 path: pathlib.Path | None = None) -> None:
        self.storage = storage
        self.remote = f"{storage.base}/{storage_dir(experiment_id, trial_id)}"
        self._owns_path = path is None
        self.path = path or pathlib.Path(tempfile.mkdtemp(prefix="det-tensorboard-"))
        self._file: EventFile | None = None
        self._unavailable = False

    def _events(self) -> EventFile | None:
        if self._file is None and not self._unavailable:
            protos = event_protos()
            if protos is None:
                self._unavailable = True
                print("det.harness: warning: the tensorboard package is not installed; no "
                      "TensorBoard event files are written", file=sys.stderr)
                return None
            self.path.mkdir(parents=True, exist_ok=True)
            self._file = EventFile(self.path, protos)
        return self._file

    def report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Write the finite numeric values of ``metrics`` as scalars at ``steps_completed``."""
        events = self._events()
        if events is None:
            return
        values = [(_tag(group, name), float(value)) for name, value in metrics.items()
                  if (type(value) is float or isinstance(value, int | float)
                      and not isinstance(value, bool)) and math.isfinite(value)]
        if values:
            events.scalars(steps_completed, values)

    def sync(self) -> None:
        """Flush, then copy the local event files to the trial's storage directory."""
        if self._file is not None:
            self._file.flush()
        if any(self.path.rglob("*")):
            self.storage.fs.put(str(self.path) + "/", self.remote + "/", recursive=True)

    def close(self) -> None:
        """Sync one last time, close the file and remove a directory of its own (also when
        the sync raises: the files are a copy of metrics the database holds)."""
        try:
            self.sync()
        finally:
            if self._file is not None:
                self._file.close()
            if self._owns_path:
                shutil.rmtree(self.path, ignore_errors=True)
