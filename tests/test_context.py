"""Context packing: .detignore, always-ignored byte code, the 95 MiB limit."""

import io
import tarfile
from pathlib import Path

import pytest

from det import context
from det.errors import ContextError


def names(blob: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return sorted(m.name for m in tar.getmembers() if m.isfile())


def test_ignores_and_roundtrip(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "pkg" / "__pycache__").mkdir(parents=True)
    (ctx / "data").mkdir()
    (ctx / "model.py").write_text("x = 1\n")
    (ctx / "pkg" / "mod.py").write_text("y = 2\n")
    (ctx / "pkg" / "mod.pyc").write_bytes(b"\0")
    (ctx / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (ctx / "data" / "big.bin").write_bytes(b"\0" * 100)
    (ctx / "notes.log").write_text("log\n")
    (ctx / ".detignore").write_text("data/\n*.log\n")
    blob = context.pack(ctx)
    assert names(blob) == [".detignore", "model.py", "pkg/mod.py"]
    out = tmp_path / "out"
    context.unpack(blob, out)
    assert (out / "pkg" / "mod.py").read_text() == "y = 2\n"


def test_too_large_is_refused_naming_size(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(context, "MAX_CONTEXT_BYTES", 1000)
    (tmp_path / "big.bin").write_bytes(b"\0" * 2000)
    with pytest.raises(ContextError, match="limit is 95 MiB"):
        context.pack(tmp_path)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ContextError, match="not a directory"):
        context.pack(tmp_path / "missing")
