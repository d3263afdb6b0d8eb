"""TensorBoard event files of a trial, in its checkpoint storage.

Every metric a trial reports is also written as a TensorBoard scalar (training metrics under
their own name, validation metrics prefixed ``val_`` as Determined names them, other groups as
``<group>/<name>``) into a local directory, together with whatever the trial's own
``SummaryWriter`` (``PyTorchTrialContext.get_tensorboard_writer()``) writes there. They
belong in ``<storage>/tensorboard/experiment/<id>/trial/<id>/``, where ``det tensorboard`` reads
them: on storage of this host's filesystem (``shared_fs``, ``directory``) they are written
there in place; elsewhere (``s3``) into a local directory copied there at each checkpoint and
when the task ends.

Events are encoded with the ``tensorboard`` package's protobuf classes and framed with
``google_crc32c`` (both installed with det's ``torch`` extra); without them a warning says once
that no event files are written.
"""

import functools
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


@functools.lru_cache(maxsize=1024)
def _tags(group: str, names: tuple[Any, ...]) -> tuple[str, ...]:
    """``tag(group, str(name))`` of each name, remembered: a trial reports the same few sets of
    names step after step."""
    return tuple(tag(group, str(name)) for name in names)


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
    made a task reporting in a loop 4x slower (bench/metric_rows.py). Scalar events are kept,
    one per set of tags (a trial reports the same few sets, step after step), with their tags
    filled in: a report sets the time, the step and the values, ~3 us where building a new
    ``Event`` took 14 and refilling one 5 (2-core host)."""

    MAX_TAG_SETS = 64
    """Most ``Event`` messages kept; a report of another set refills a spare one."""

    def __init__(self, directory: pathlib.Path, protos: tuple[Any, Any]) -> None:
        self._event, self._crc32c = protos
        self._headers: dict[int, bytes] = {}  # event length -> its framing header
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.det")
        self._file = open(directory / name, "wb", buffering=1 << 16)  # noqa: SIM115
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))
        self._scalar_events: dict[tuple[str, ...], tuple[Any, Any]] = {}

    def scalars(self, steps_completed: int, tags: tuple[str, ...], values: list[float]) -> None:
        """One event holding scalar ``values[i]`` under ``tags[i]`` at ``steps_completed``."""
        kept = self._scalar_events.get(tags)
        if kept is None:
            kept = self._scalar_event(tags)
        event, slots = kept
        event.wall_time = time.time()
        event.step = steps_completed
        for slot, v in zip(slots, values, strict=True):
            slot.simple_value = v
        self._write(event)

    def _scalar_event(self, tags: tuple[str, ...]) -> tuple[Any, Any]:
        """An ``Event`` whose summary holds ``tags`` in order, and its value messages."""
        event = self._event()
        add = event.summary.value.add
        for t in tags:
            add(tag=t)
        kept = (event, list(event.summary.value))
        if len(self._scalar_events) < self.MAX_TAG_SETS:
            self._scalar_events[tags] = kept
        return kept

    def _write(self, event: Any) -> None:
        data = event.SerializeToString()
        header = self._headers.get(len(data))
        if header is None:  # a trial's events come in a few lengths: their headers are kept
            length = struct.pack("<Q", len(data))
            header = self._headers[len(data)] = length + _masked_crc(self._crc32c, length)
        self._file.write(header + data + _masked_crc(self._crc32c, data))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorboardFiles:
    """A trial's event files: written under ``path``, synced to ``storage``.

    Without ``path`` they are written in place on local storage (``path`` is the storage's
    directory: nothing to copy, ~4 ms of CPU saved in a short forked task, 2-core host), else
    into a temporary directory of their own, removed by :meth:`close` (each trial used to leave
    one behind, with every event it wrote). A local storage directory that cannot be made
    is not fatal: the files are staged, and the sync says why they could not be stored."""

    def __init__(self, storage: FsspecStorage, experiment_id: int, trial_id: int,
                 path: pathlib.Path | None = None) -> None:
        self.storage = storage
        self.remote = f"{storage.base}/{storage_dir(experiment_id, trial_id)}"
        self._in_place = False
        if path is None and storage.local:
            try:
                pathlib.Path(self.remote).mkdir(parents=True, exist_ok=True)
                path, self._in_place = pathlib.Path(self.remote), True
            except OSError:
                pass
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
        names, values = [], []
        for name, value in metrics.items():
            if type(value) is not float:
                if not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                value = float(value)
            if value - value == 0.0:  # finite: inf - inf and NaN - NaN are NaN
                names.append(name)
                values.append(value)
        if values:
            events.scalars(steps_completed, _tags(group, tuple(names)), values)

    def sync(self) -> None:
        """Flush, then copy the local event files to the trial's storage directory (unless
        they are written there)."""
        if self._file is not None:
            self._file.flush()
        if not self._in_place and any(self.path.rglob("*")):
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
