"""``determined.common.storage``: 0.38.1's storage managers over det's checkpoint storage
(:mod:`det.harness.storage`), for scripts that read or write checkpoint storage directly.

``build(config, container_path)`` takes a ``checkpoint_storage`` section (``shared_fs``,
``directory``, ``s3``: the types det stores to). Each ``StorageManager`` keeps directories
``<base>/<name>``: ``store_path`` / ``upload`` write one, ``restore_path`` / ``download`` read
one, ``delete`` removes one. Azure and GCS, which det does not store to, raise ``TypeError``
naming the type, as upstream does for an unknown type.
"""

import os
import pathlib
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from det.errors import DetError
from det.harness.storage import FsspecStorage, storage_from_config

__all__ = ["DirectoryStorageManager", "S3StorageManager", "SharedFSStorageManager",
           "StorageManager", "build"]

Selector = Callable[[str], bool]
"""Given a path relative to a stored directory, whether to read it (upstream's type)."""


class StorageManager:
    """Directories ``<base>/<name>`` in one checkpoint storage (det's ``FsspecStorage``)."""

    def __init__(self, storage: FsspecStorage) -> None:
        self._storage = storage
        self.base_path = storage.base

    @classmethod
    def from_config(cls, config: dict[str, Any], container_path: str | None) -> "StorageManager":
        """The manager of ``config`` (a ``checkpoint_storage`` section). Raises ValueError
        naming a missing or wrong key (det's ``StorageError`` message)."""
        try:
            return cls(storage_from_config(config))
        except DetError as e:
            raise ValueError(str(e)) from None

    @contextmanager
    def store_path(self, dst: str) -> Iterator[pathlib.Path]:
        """A local directory to write ``dst`` into; stored when the block exits without an
        exception (nothing is left on one)."""
        with self._storage.store_dir(dst) as path:
            yield path

    @contextmanager
    def restore_path(self, src: str, selector: Selector | None = None) -> Iterator[pathlib.Path]:
        """A local directory holding ``src`` (read it, don't modify it); ``selector`` is
        accepted for upstream's signature, every file is there. Raises det's
        ``StorageError`` if ``src`` does not exist."""
        with self._storage.restore_dir(src) as path:
            yield path

    def upload(self, src: str | os.PathLike[str], dst: str, paths: Any = None) -> None:
        """Store the local directory ``src`` as ``dst`` (``paths`` is accepted for upstream's
        signature; the whole directory is stored)."""
        with self.store_path(dst) as path:
            shutil.copytree(src, path, dirs_exist_ok=True)

    def download(self, src: str, dst: str | os.PathLike[str],
                 selector: Selector | None = None) -> None:
        """Copy stored ``src`` into the local directory ``dst`` (links are skipped, as det's
        checkpoint downloads do). Raises det's ``StorageError`` if ``src`` does not exist."""
        self._storage.download(src, pathlib.Path(dst))

    def delete(self, tgt: str, globs: list[str] | None = None) -> dict[str, int]:
        """Remove stored ``tgt`` entirely; returns the files left (``{}``, as upstream does
        after deleting ``**/*``). Raises ValueError for other ``globs``: det deletes whole
        directories only."""
        if globs not in (None, ["**/*"]):
            raise ValueError(f"globs: {globs!r}: det deletes whole directories only "
                             "(['**/*'])")
        self._storage.delete(tgt)
        return {}


class SharedFSStorageManager(StorageManager):
    """``type: shared_fs``: ``<host_path>/<storage_path>``."""


class DirectoryStorageManager(StorageManager):
    """``type: directory``: ``<container_path>``."""


class S3StorageManager(StorageManager):
    """``type: s3``: ``s3://<bucket>/<prefix>``."""


_MANAGERS: dict[str, type[StorageManager]] = {
    "shared_fs": SharedFSStorageManager,
    "directory": DirectoryStorageManager,
    "s3": S3StorageManager,
}


def build(config: dict[str, Any], container_path: str | None) -> StorageManager:
    """The manager of the ``checkpoint_storage`` section ``config`` (upstream's
    ``storage.build``); the ``save_*`` retention keys are ignored.

    Raises:
        ValueError: ``type`` is missing or not a string, or a key its type needs is missing.
        TypeError: a storage type det does not store to (names it).
    """
    if "type" not in config:
        raise ValueError("Missing 'type' parameter of storage configuration")
    kind = config["type"]
    if not isinstance(kind, str):
        raise ValueError("`type` parameter of storage configuration must be a string")
    if kind not in _MANAGERS:
        raise TypeError(f"Unknown storage type: {kind} (det stores to shared_fs, directory "
                        "and s3)")
    config = dict(config)
    if kind == "directory" and container_path and not config.get("container_path"):
        config["container_path"] = container_path
    return _MANAGERS[kind].from_config(config, container_path)
