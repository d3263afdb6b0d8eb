"""Checkpoint storage through fsspec (reference-facts §3.7).

``shared_fs`` stores checkpoint ``<uuid>`` at ``<host_path>/<storage_path or ''>/<uuid>``;
``directory`` at ``<container_path>/<uuid>``; both on fsspec's local filesystem. ``s3`` stores
it at ``s3://<bucket>/<prefix>/<uuid>`` through s3fs. Uploads and downloads show their bytes
(:mod:`det.harness.progress`).
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
from det.harness.progress import ByteProgress


class FsspecStorage:
    """Checkpoints as directories ``<base>/<uuid>`` on an fsspec filesystem ``fs``; ``local``
    says whether that is this host's filesystem (``shared_fs``, ``directory``), where files
    are written in place rather than staged and copied."""

    def __init__(self, fs: fsspec.AbstractFileSystem, base: str) -> None:
        self.fs = fs
        self.base = base.rstrip("/")
        self.local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))

    def url(self, uuid: str) -> str:
        """Where checkpoint ``uuid`` lives on ``fs``."""
        return f"{self.base}/{uuid}"

    @contextmanager
    def store_dir(self, uuid: str) -> Iterator[pathlib.Path]:
        """Yield a local directory to write checkpoint ``uuid`` into; it is in storage when the
        block exits without an exception. On the local filesystem this is the final directory
        (no copy); elsewhere a staging directory that is uploaded, then removed."""
        if self.local:
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
            total = sum(directory_sizes(pathlib.Path(tmp)).values())
            with ByteProgress(f"checkpoint {uuid}: upload", total, upload=True) as progress:
                self.fs.put(tmp + "/", self.url(uuid), recursive=True, callback=progress)

    def add_files(self, uuid: str, local: pathlib.Path) -> None:
        """Copy the files under the local directory ``local`` into checkpoint ``uuid``, next to
        those already there (each worker's share of a sharded checkpoint)."""
        if self.local:
            shutil.copytree(local, self.url(uuid), dirs_exist_ok=True)
            return
        total = sum(directory_sizes(local).values())
        with ByteProgress(f"checkpoint {uuid}: upload", total, upload=True) as progress:
            self.fs.put(str(local) + "/", self.url(uuid), recursive=True, callback=progress)

    @contextmanager
    def restore_dir(self, uuid: str) -> Iterator[pathlib.Path]:
        """Yield a local directory holding checkpoint ``uuid`` (read it, don't modify it).

        Raises ``StorageError`` if the checkpoint does not exist.
        """
        if not self.fs.exists(self.url(uuid)):
            raise StorageError(f"checkpoint {uuid} not found at {self.describe(uuid)}")
        if self.local:
            yield pathlib.Path(self.url(uuid))
            return
        with tempfile.TemporaryDirectory(prefix=f"det-restore-{uuid}-") as tmp:
            self.download(uuid, pathlib.Path(tmp))
            yield pathlib.Path(tmp)

    def download(self, uuid: str, dst: pathlib.Path) -> None:
        """Copy checkpoint ``uuid`` into the local directory ``dst`` (created if needed).

        Raises ``StorageError`` if the checkpoint does not exist or the storage fails.
        """
        src = self.url(uuid)
        try:
            found = self.fs.exists(src)
            if found:
                dst.mkdir(parents=True, exist_ok=True)
                total = sum(self.fs.du(src, total=False).values())
                with ByteProgress(f"checkpoint {uuid}: download", total,
                                  upload=False) as progress:
                    self.fs.get(src + "/", str(dst) + "/", recursive=True, callback=progress)
        except Exception as e:  # botocore, OSError: the storage's own words, on one line
            raise StorageError(f"checkpoint {uuid}: cannot download {self.describe(uuid)}: "
                               f"{type(e).__name__}: {e}") from e
        if not found:
            raise StorageError(f"checkpoint {uuid} not found at {self.describe(uuid)}")

    def describe(self, uuid: str) -> str:
        """Where checkpoint ``uuid`` lives, as a user reads it (a path, or ``s3://...``)."""
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return self.url(uuid) if self.local else f"{protocol}://{self.url(uuid)}"

    def delete(self, uuid: str) -> bool:
        """Remove checkpoint ``uuid``'s files. Idempotent: returns False when nothing was there
        (a GC that was killed after removing them).

        Raises ``StorageError`` when the storage refuses (permissions, network, a bad bucket).
        """
        return self.remove_tree(self.url(uuid),
                                f"checkpoint {uuid}: cannot remove {self.describe(uuid)}")

    def remove_tree(self, url: str, failure: str) -> bool:
        """Remove everything under ``url`` (a path in this storage). Idempotent: False when
        nothing was there. Raises ``StorageError`` starting with ``failure`` when the storage
        refuses."""
        try:
            self.fs.invalidate_cache(url)
            if not self.fs.exists(url):
                return False
            self.fs.rm(url, recursive=True)
            self.fs.invalidate_cache(url)
            return True
        except FileNotFoundError:
            return False
        except Exception as e:  # botocore, OSError: the storage's own words, on one line
            raise StorageError(f"{failure}: {type(e).__name__}: {e}") from e


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
    type other than ``shared_fs`` / ``directory`` / ``s3`` or a missing required key.
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
    if kind == "s3":
        bucket = checkpoint_storage.get("bucket")
        if not bucket:
            raise StorageError("checkpoint_storage.bucket: required for type s3")
        prefix = (checkpoint_storage.get("prefix") or "").strip("/")
        options: dict[str, Any] = {}
        if checkpoint_storage.get("endpoint_url"):
            options["endpoint_url"] = checkpoint_storage["endpoint_url"]
        if checkpoint_storage.get("access_key"):  # else the standard AWS credential chain
            options["key"] = checkpoint_storage["access_key"]
            options["secret"] = checkpoint_storage.get("secret_key")
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        return FsspecStorage(fs, f"{bucket}/{prefix}" if prefix else bucket)
    raise StorageError(
        f"checkpoint_storage.type: {kind!r} is not supported by det "
        "(expected shared_fs, directory or s3)"
    )
