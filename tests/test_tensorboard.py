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


def test_local_storage_is_written_in_place_and_a_staging_directory_is_removed(
        tmp_path, monkeypatch) -> None:
    """On local storage the event files are written where they belong, with no directory in
    between; on other storage (and local storage whose directory cannot be made) they are
    staged in a directory of their own, which goes when they have been stored, and also when
    storing them failed; a directory the caller named stays."""
    staging = tmp_path / "tmp"
    staging.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(staging))
    storage = FsspecStorage(fsspec.filesystem("file"), str(tmp_path / "storage"))
    files = TensorboardFiles(storage, 7, 3)
    assert files.path == tmp_path / "storage" / "tensorboard" / "experiment" / "7" / "trial" / "3"
    files.report("training", 1, {"loss": 1.0})
    files.close()
    assert list(files.path.glob("events.out.tfevents.*"))
    assert not list(staging.iterdir())

    memory = fsspec.filesystem("memory")
    remote = FsspecStorage(memory, f"/{tmp_path.name}")
    files = TensorboardFiles(remote, 7, 3)
    assert files.path.parent == staging
    files.report("training", 1, {"loss": 1.0})
    files.close()
    assert not files.path.exists()
    assert memory.glob(f"/{tmp_path.name}/tensorboard/experiment/7/trial/3/events.out.*")

    (tmp_path / "blocked").write_text("a file where the storage's directory would go")
    unstorable = TensorboardFiles(FsspecStorage(fsspec.filesystem("file"),
                                                str(tmp_path / "blocked")), 7, 4)
    assert unstorable.path.parent == staging
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
