"""TensorBoard event files written by the harness (``det.harness.tensorboard``): TensorBoard
reads every reported scalar back, and each record's framing checks out against tensorboard's
own (pure-Python) CRC-32C."""

import math
import struct

import fsspec
import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c  # noqa: E402

from det.harness.storage import FsspecStorage  # noqa: E402
from det.harness.tensorboard import TensorboardFiles  # noqa: E402


def test_reported_scalars_read_back_from_storage(tmp_path) -> None:
    storage = FsspecStorage(fsspec.filesystem("file"), str(tmp_path / "storage"))
    files = TensorboardFiles(storage, 7, 3, tmp_path / "local")
    for step in range(1, 101):
        files.report("training", step, {"loss": 1.0 / step, "nan": math.nan, "flag": True,
                                        "name": "x", 2: float(step)})
    files.report("validation", 100, {"loss": 0.5, "accuracy": 0.9})
    files.report("inference", 100, {"latency": 3})
    files.close()

    remote = tmp_path / "storage" / "tensorboard" / "experiment" / "7" / "trial" / "3"
    events = EventAccumulator(str(remote))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"loss", "2", "val_loss", "val_accuracy",
                                             "inference/latency"}
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == list(range(1, 101))
    assert loss[3].value == pytest.approx(0.25)
    assert [(e.step, e.value) for e in events.Scalars("inference/latency")] == [(100, 3.0)]

    (event_file,) = remote.glob("events.out.tfevents.*")
    data, records = event_file.read_bytes(), 0
    while data:
        header, header_crc = data[:8], data[8:12]
        (length,) = struct.unpack("<Q", header)
        body, body_crc = data[12:12 + length], data[12 + length:16 + length]
        assert struct.unpack("<I", header_crc)[0] == masked_crc32c(header)
        assert struct.unpack("<I", body_crc)[0] == masked_crc32c(body)
        data, records = data[16 + length:], records + 1
    assert records == 1 + 100 + 2  # the file-version event, then one per report


def test_a_directory_of_its_own_is_removed_at_close(tmp_path, monkeypatch) -> None:
    """A trial's local event directory goes when its files have been stored, and also when
    storing them failed; a directory the caller named stays."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    storage = FsspecStorage(fsspec.filesystem("file"), str(tmp_path / "storage"))
    files = TensorboardFiles(storage, 7, 3)
    assert files.path.parent == tmp_path
    files.report("training", 1, {"loss": 1.0})
    files.close()
    assert not files.path.exists()
    assert list((tmp_path / "storage").rglob("events.out.tfevents.*"))

    (tmp_path / "blocked").write_text("a file where the storage's directory would go")
    unstorable = TensorboardFiles(FsspecStorage(fsspec.filesystem("file"),
                                                str(tmp_path / "blocked")), 7, 4)
    unstorable.report("training", 1, {"loss": 1.0})
    with pytest.raises(OSError):
        unstorable.close()
    assert not unstorable.path.exists()

    named = TensorboardFiles(storage, 7, 5, tmp_path / "named")
    named.report("training", 1, {"loss": 1.0})
    named.close()
    assert list((tmp_path / "named").glob("events.out.tfevents.*"))


def test_each_report_keeps_its_own_tags_as_the_set_changes(tmp_path, monkeypatch) -> None:
    """Events are kept per set of tags and refilled: a report whose set differs from the last
    (a value turning non-finite, a new name, more sets than are kept) writes its own values
    under its own tags, and none of another report's."""
    monkeypatch.setattr("det.harness.tensorboard.EventFile.MAX_TAG_SETS", 4)
    storage = FsspecStorage(fsspec.filesystem("file"), str(tmp_path / "storage"))
    files = TensorboardFiles(storage, 7, 3, tmp_path / "local")
    for step in range(1, 31):
        files.report("training", step, {"loss": float(step),
                                        "acc": math.inf if step % 3 == 0 else step / 100,
                                        f"only_{step % 7}": -step})
    files.close()

    events = EventAccumulator(str(tmp_path / "storage" / "tensorboard" / "experiment" / "7"
                                  / "trial" / "3"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == \
        [(s, float(s)) for s in range(1, 31)]
    assert [(e.step, e.value) for e in events.Scalars("acc")] == \
        [(s, pytest.approx(s / 100)) for s in range(1, 31) if s % 3]
    for k in range(7):
        assert [(e.step, e.value) for e in events.Scalars(f"only_{k}")] == \
            [(s, float(-s)) for s in range(1, 31) if s % 7 == k]
