"""TensorBoard event files of a trial, in its checkpoint storage (issue 13).

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
that no event files are written. A scalar event, written at every report, is encoded by hand
into the same bytes (:class:`ScalarEncoding`; tests compare the two).
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


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint of ``n`` >= 0."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_WALL_TIME = struct.Struct("<Bd")  # Event.wall_time: field 1, 64-bit


class ScalarEncoding:
    """The wire form of a scalar ``Event`` (tensorboard's ``event.proto``) for one set of tags:
    ``wall_time`` (field 1), ``step`` (2, left out when 0 as proto3 does) and ``summary`` (5),
    whose ``value``s (1) each hold a ``tag`` (1) and a ``simple_value`` (2, float32), in that
    order: the bytes ``SerializeToString`` gives, made by one ``struct`` call with the tags'
    bytes computed once, ~2 us a report where filling and serializing a kept ``Event`` took 5.

    Raises ``OverflowError`` for a value past float32's range (protobuf would store an
    infinity: the caller encodes that report with protobuf)."""

    def __init__(self, tags: tuple[str, ...]) -> None:
        fields = []
        for t in tags:
            name = t.encode()
            value = b"\x0a" + _varint(len(name)) + name + b"\x15"  # tag, simple_value's key
            fields.append(b"\x0a" + _varint(len(value) + 4) + value)  # one Summary.value
        self._summary = b"\x2a" + _varint(sum(len(f) + 4 for f in fields))
        self._values = struct.Struct("<" + "".join(f"{len(f)}sf" for f in fields))
        self._args: list[Any] = [x for f in fields for x in (f, 0.0)]

    def encode(self, wall_time: float, step: int, values: list[float]) -> bytes:
        """The event's bytes; ``values`` one a tag (ValueError otherwise)."""
        args = self._args
        args[1::2] = values
        return b"".join((_WALL_TIME.pack(0x09, wall_time),
                         b"\x10" + _varint(step) if step else b"",
                         self._summary, self._values.pack(*args)))


def _masked_crc(crc32c: Any, data: bytes) -> bytes:
    """The TFRecord format's masked CRC-32C of ``data``, little-endian."""
    x = crc32c.value(data)
    return struct.pack("<I", (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


class EventFile:
    """One TensorBoard event file written synchronously: TFRecord framing (length, masked
    CRC-32C of the length, the serialized ``Event``, its masked CRC) into a buffered file.

    Not tensorboard's ``EventFileWriter``: that one hands each event to a writer thread through
    a 10-event queue and computes CRCs in pure Python, ~60 us a report on this host, which
    made a task reporting in a loop 4x slower (bench/metric_rows.py). Scalar events are encoded
    by hand (:class:`ScalarEncoding`, one kept per set of tags: a trial reports the same few
    sets, step after step), ~3 us a report with the framing where building a new ``Event``
    took 14 and refilling a kept one 5.5 (2-core host)."""

    MAX_TAG_SETS = 64
    """Most encodings (:class:`ScalarEncoding`) kept; a report of another set makes one."""

    def __init__(self, directory: pathlib.Path, protos: tuple[Any, Any]) -> None:
        self._event, self._crc32c = protos
        self._headers: dict[int, bytes] = {}  # event length -> its framing header
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.det")
        self._file = open(directory / name, "wb", buffering=1 << 16)  # noqa: SIM115
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))
        self._encodings: dict[tuple[str, ...], ScalarEncoding] = {}

    def scalars(self, steps_completed: int, tags: tuple[str, ...], values: list[float]) -> None:
        """One event holding scalar ``values[i]`` under ``tags[i]`` at ``steps_completed``."""
        encoding = self._encodings.get(tags)
        if encoding is None:
            encoding = ScalarEncoding(tags)
            if len(self._encodings) < self.MAX_TAG_SETS:
                self._encodings[tags] = encoding
        wall_time = time.time()
        try:
            data = encoding.encode(wall_time, steps_completed, values)
        except OverflowError:  # past float32: protobuf stores an infinity
            event = self._event(wall_time=wall_time, step=steps_completed)
            for t, v in zip(tags, values, strict=True):
                event.summary.value.add(tag=t, simple_value=v)
            data = event.SerializeToString()
        self._write_bytes(data)

    def _write(self, event: Any) -> None:
        self._write_bytes(event.SerializeToString())

    def _write_bytes(self, data: bytes) -> None:
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
