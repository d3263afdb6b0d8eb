"""Checkpoint storage through fsspec (reference-facts §3.7).

``shared_fs`` stores checkpoint ``<uuid>`` at ``<host_path>/<storage_path or ''>/<uuid>``;
``directory`` at ``<container_path>/<uuid>``. Both use fsspec's local filesystem, so a remote
fsspec backend only needs another branch in ``storage_from_config``.
"""

import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import fsspec

from det.harness.errors import StorageError


class FsspecStorage:
    """Checkpoints as directories ``<base>/<uuid>`` on an fsspec filesystem ``fs``."""

    def __init__(self, fs: fsspec.AbstractFileSystem, base: str) -> None:
        self.fs = fs
        self.base = base.rstrip("/")
        self._local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))

    def url(self, uuid: str) -> str:
        """Where checkpoint ``uuid`` lives on ``fs``."""
        return f"{self.base}/{uuid}"

    @contextmanager
    def store_dir(self, uuid: str) -> Iterator[pathlib.Path]:
        """Yield a local directory to write checkpoint ``uuid`` into; it is in storage when the
        block exits without an exception. On the local filesystem this is the final directory
        (no copy); elsewhere a staging directory that is uploaded, then removed."""
        if self._local:
            path = pathlib.Path(self.url(uuid))
            path.mkdir(parents=True, exist_ok=False)
            try:
                yield path
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            return
        with tempfile.TemporaryDirectory(prefix=f"det-ckpt-{uuid}-") as tmp:
            yield pathlib.Path(tmp)
            self.fs.put(tmp + "/", self.url(uuid), recursive=True)

    @contextmanager
    def restore_dir(self, uuid: str) -> Iterator[pathlib.Path]:
        """Yield a local directory holding checkpoint ``uuid`` (read it, don't modify it).

        Raises ``StorageError`` if the checkpoint does not exist.
        """
        if not self.fs.exists(self.url(uuid)):
            raise StorageError(f"checkpoint {uuid} not found at {self.url(uuid)}")
        if self._local:
            yield pathlib.Path(self.url(uuid))
            return
        with tempfile.TemporaryDirectory(prefix=f"det-restore-{uuid}-") as tmp:
            self.download(uuid, pathlib.Path(tmp))
            yield pathlib.Path(tmp)

    def download(self, uuid: str, dst: pathlib.Path) -> None:
        """Copy checkpoint ``uuid`` into the local directory ``dst`` (created if needed).

        Raises ``StorageError`` if the checkpoint does not exist.
        """
        if not self.fs.exists(self.url(uuid)):
            raise StorageError(f"checkpoint {uuid} not found at {self.url(uuid)}")
        dst.mkdir(parents=True, exist_ok=True)
        self.fs.get(self.url(uuid) + "/", str(dst) + "/", recursive=True)


def directory_sizes(root: pathlib.Path) -> dict[str, int]:
    """``{relative posix path: size in bytes}`` of every file under ``root``."""
    sizes: dict[str, int] = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = pathlib.Path(dirpath, name)
            sizes[path.relative_to(root).as_posix()] = path.stat().st_size
    return dict(sorted(sizes.items()))


def storage_from_config(checkpoint_storage: Mapping[str, Any] | None) -> FsspecStorage:
    """Build the storage from the config's ``checkpoint_storage`` section.

    Absent (``None``): a fresh temporary directory (local runs). Raises ``StorageError`` for a
    type other than ``shared_fs`` / ``directory`` or a missing required key.
    """
    if not checkpoint_storage:
        return FsspecStorage(fsspec.filesystem("file"), tempfile.mkdtemp(prefix="det-checkpoints-"))
    kind = checkpoint_storage.get("type")
    if kind == "shared_fs":
        host_path = checkpoint_storage.get("host_path")
        if not host_path:
            raise StorageError("checkpoint_storage.host_path: required for type shared_fs")
        storage_path = checkpoint_storage.get("storage_path") or ""
        base = os.path.join(host_path, storage_path) if storage_path else host_path
        return FsspecStorage(fsspec.filesystem("file"), os.path.normpath(base))
    if kind == "directory":
        container_path = checkpoint_storage.get("container_path")
        if not container_path:
            raise StorageError("checkpoint_storage.container_path: required for type directory")
        return FsspecStorage(fsspec.filesystem("file"), os.path.normpath(container_path))
    raise StorageError(
        f"checkpoint_storage.type: {kind!r} is not supported by det yet "
        "(expected shared_fs or directory)"
    )
