"""Context packing: .detignore, always-ignored byte code, the 95 MiB limit."""

import io
import os
import tarfile
import time
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


def test_the_same_directory_packs_to_the_same_bytes(tmp_path: Path) -> None:
    # context_blobs are stored once per sha256 and agents unpack (and make a task environment
    # for) each once: packing must not stamp the time into the archive
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "model.py").write_text("x = 1\n")
    first = context.pack(ctx)
    time.sleep(1.1)  # gzip's header holds whole seconds
    assert context.pack(ctx) == first


def test_too_large_is_refused_naming_size(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(context, "MAX_CONTEXT_BYTES", 1000)
    (tmp_path / "big.bin").write_bytes(b"\0" * 2000)
    with pytest.raises(ContextError, match="limit is 95 MiB"):
        context.pack(tmp_path)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ContextError, match="not a directory"):
        context.pack(tmp_path / "missing")


def members(blob: bytes) -> dict[str, str]:
    """Member name -> "file" or "link -> target"."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {m.name: f"link -> {m.linkname}" if m.issym() else "file" if m.isreg()
                else f"type {m.type!r}" for m in tar.getmembers()}


def test_links_inside_the_context_are_packed_as_links(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "pkg").mkdir(parents=True)
    (ctx / "pkg" / "mod.py").write_text("y = 2\n")
    os.symlink("pkg/mod.py", ctx / "alias.py")
    os.symlink("pkg", ctx / "lib")  # a link to a directory: packed as the link, not its files
    os.symlink("..", ctx / "pkg" / "up")  # back to the context's root: still inside
    blob = context.pack(ctx)
    assert members(blob) == {"alias.py": "link -> pkg/mod.py", "lib": "link -> pkg",
                             "pkg/mod.py": "file", "pkg/up": "link -> .."}
    out = tmp_path / "out"
    context.unpack(blob, out)
    assert (out / "alias.py").read_text() == (out / "lib" / "mod.py").read_text() == "y = 2\n"


def test_hard_links_are_packed_as_files(tmp_path: Path) -> None:
    """Two names of one file (``cp -l``) are two files in the archive: unpacking refuses
    hard-link members."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "a.py").write_text("x = 1\n")
    os.link(ctx / "a.py", ctx / "b.py")
    blob = context.pack(ctx)
    assert members(blob) == {"a.py": "file", "b.py": "file"}
    context.unpack(blob, tmp_path / "out")
    assert (tmp_path / "out" / "b.py").read_text() == "x = 1\n"


@pytest.mark.parametrize(("links", "named", "why"), [
    # Links out of the context are followed to files only (tests/test_contexts_38.py).
    ({"data": "/etc"}, "data", "a directory outside the context"),
    ({"pkg/data": "../.."}, "pkg/data", "a directory outside the context"),
    # a.py is followed (a file, outside once pkg/up is followed); pkg/up is a directory.
    ({"a.py": "pkg/up/outside.py", "pkg/up": "../.."}, "pkg/up", "a directory outside"),
    # Inside once followed, but through another link, which unpacking refuses.
    ({"a.py": "lib/mod.py", "lib": "pkg", "pkg/mod.py": None}, "a.py",
     "through another link (lib)"),
    ({"data.py": "nothing.py"}, "data.py", "does not exist"),
    ({"data.py": "secret/key.py"}, "data.py", ".detignore leaves out"),
])
def test_links_that_would_not_work_unpacked_are_refused(tmp_path: Path,
                                                        links: dict[str, str | None],
                                                        named: str, why: str) -> None:
    (tmp_path / "outside.py").write_text("x = 1\n")
    ctx = tmp_path / "ctx"
    (ctx / "pkg").mkdir(parents=True)
    (ctx / "secret").mkdir()
    (ctx / "secret" / "key.py").write_text("k = 1\n")
    (ctx / ".detignore").write_text("secret/\n")
    for name, target in links.items():
        if target is None:
            (ctx / name).write_text("y = 2\n")
        else:
            os.symlink(target, ctx / name)
    with pytest.raises(ContextError) as info:
        context.pack(ctx)
    message = str(info.value)
    assert f": {named} is a symbolic link to {links[named]}" in message and why in message
    assert "\n" not in message


def test_special_files_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ContextError, match="pipe is not a regular file, directory or symbolic"):
        context.pack(tmp_path)


def test_unreadable_directory_is_refused_not_skipped(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("x = 1\n")
    (tmp_path / "locked").mkdir(mode=0)
    try:
        if os.access(tmp_path / "locked", os.R_OK):
            pytest.skip("running as a user who can read a mode-000 directory (root)")
        with pytest.raises(ContextError, match="cannot read .*locked: Permission denied"):
            context.pack(tmp_path)
    finally:
        (tmp_path / "locked").chmod(0o700)
