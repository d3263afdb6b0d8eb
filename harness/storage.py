"""Checkpoint storage through fsspec (Determined 0.38's ``checkpoint-storage.json`` schema).

``shared_fs`` stores checkpoint ``<uuid>`` at ``<host_path>/<storage_path or ''>/<uuid>``;
``directory`` at ``<container_path>/<uuid>``; both on fsspec's local filesystem. ``s3`` stores
it at ``s3://<bucket>/<prefix>/<uuid>`` through s3fs. Uploads and downloads show their bytes
(:mod:`det.harness.progress`).

A checkpoint appears under its name only whole: on the local filesystem it is
written as ``<base>/.det-staging-<uuid>`` and renamed into place (:meth:`publish`); an
object store gets it uploaded from a local staging directory. What a crash leaves (staging
directories, published directories never recorded) the GC task sweeps
(:meth:`FsspecStorage.leftovers`, ``det.harness.checkpoint_gc``).
"""

import datetime
import errno
import logging
import os
import pathlib
import shutil
import stat
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, BinaryIO

import fsspec

from det.harness.errors import CheckpointStorageError, StorageError
from det.harness.progress import ByteProgress

log = logging.getLogger("det.storage")

STAGING = ".det-staging-"
"""Prefix of the directory ``<base>/<STAGING><uuid>`` a checkpoint is written into on the
local filesystem before :meth:`FsspecStorage.publish` renames it into place: beside the
checkpoints (the same filesystem: the rename is atomic), hidden, and gone once published."""

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO,
                            errno.EACCES, errno.EPERM})
"""OS errors of a storage that a restart does not cure: writing a checkpoint that fails with
one is a ``CheckpointStorageError`` (its run's experiment is paused, not retried)."""

LOW_SPACE_BYTES = 1 << 20
"""Free bytes below which a failed checkpoint write is taken for a full disk
(:func:`storage_os_error`)."""


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

    def staging(self, uuid: str) -> pathlib.Path:
        """Where checkpoint ``uuid`` is written on the local filesystem before
        :meth:`publish` (same filesystem as its final place, so the rename is atomic)."""
        return pathlib.Path(self.base, STAGING + uuid)

    @contextmanager
    def store_dir(self, uuid: str) -> Iterator[pathlib.Path]:
        """Yield a local directory to write checkpoint ``uuid`` into; it is in storage under
        its name when the block exits without an exception. On the local filesystem this is
        :meth:`staging`, then renamed into place (:meth:`publish`); elsewhere a temporary
        directory that is uploaded, then removed. On an exception the files are removed.

        Raises:
            CheckpointStorageError: the files could not be written for a reason of the
                storage (:func:`storage_os_error`), in the block or while publishing.
        """
        if self.local:
            path = self.staging(uuid)
            try:
                with self._storage_errors(path, self.base):  # before the files go
                    path.mkdir(parents=True, exist_ok=False)
                    yield path
                    self.publish(uuid)
            finally:
                shutil.rmtree(path, ignore_errors=True)  # nothing left once published
            return
        with tempfile.TemporaryDirectory(prefix=f"det-ckpt-{uuid}-") as tmp:
            with self._storage_errors(pathlib.Path(tmp), tmp):
                yield pathlib.Path(tmp)
            total = sum(directory_sizes(pathlib.Path(tmp)).values())
            with ByteProgress(f"checkpoint {uuid}: upload", total, upload=True) as progress:
                self.fs.put(tmp + "/", self.url(uuid), recursive=True, callback=progress)

    @contextmanager
    def _storage_errors(self, path: pathlib.Path, shown: str) -> Iterator[None]:
        """Turn a storage failure while writing under ``path`` into one
        ``CheckpointStorageError`` naming ``shown``; any other error passes. The check runs
        before the caller removes the partial files (their bytes tell a full disk)."""
        try:
            yield
        except CheckpointStorageError:
            raise
        except Exception as e:
            err = storage_os_error(e, path)
            if err is None:
                raise
            raise CheckpointStorageError(
                f"checkpoint storage {shown}: [Errno {err}] {os.strerror(err)}") from e

    def publish(self, uuid: str) -> None:
        """Rename the staged checkpoint ``uuid`` into place (local filesystem; an object
        store's upload is its publication, so nothing to do there). Raises
        ``CheckpointStorageError`` for a storage failure."""
        if self.local:
            with self._storage_errors(self.staging(uuid), self.base):
                os.rename(self.staging(uuid), self.url(uuid))

    def add_files(self, uuid: str, local: pathlib.Path) -> None:
        """Copy the files under the local directory ``local`` into checkpoint ``uuid``, next to
        those already there (each worker's share of a sharded checkpoint): into
        :meth:`staging` on the local filesystem, for :meth:`publish` once every share is in.
        Raises ``CheckpointStorageError`` for a storage failure."""
        if self.local:
            with self._storage_errors(self.staging(uuid), self.base):
                shutil.copytree(local, self.staging(uuid), dirs_exist_ok=True)
            return
        total = sum(directory_sizes(local).values())
        with ByteProgress(f"checkpoint {uuid}: upload", total, upload=True) as progress:
            self.fs.put(str(local) + "/", self.url(uuid), recursive=True, callback=progress)

    def discard(self, uuid: str) -> None:
        """Remove whatever exists of checkpoint ``uuid``, staged or published (a write the
        cluster refused); errors are logged, not raised: the GC task sweeps what is left."""
        try:
            if self.local:
                shutil.rmtree(self.staging(uuid), ignore_errors=True)
            self.remove_tree(self.url(uuid), f"checkpoint {uuid}: cannot remove")
        except (StorageError, OSError, ValueError) as e:
            log.warning("%s", e)

    def leftovers(self, recorded: Callable[[list[str]], set[str]],
                  older_than: float) -> list[str]:
        """URLs of what crashed writers left in this storage, untouched for ``older_than``
        seconds: staging directories (local filesystem), and checkpoint directories (named by
        a uuid) whose uuid ``recorded`` does not return (it answers which of the uuids
        given have a checkpoint row). Other entries (TensorBoard files) are never listed."""
        now = time.time()
        found: list[str] = list(self._uuid_entries(STAGING).values()) if self.local else []
        named = self._uuid_entries("")
        if named:
            known = recorded(list(named))
            found += [url for u, url in named.items() if u not in known]
        return sorted(url for url in found if now - self._newest(url) >= older_than)

    def _uuid_entries(self, prefix: str) -> dict[str, str]:
        """``{uuid: url}`` of the entries of the base named ``<prefix><uuid>``."""
        try:
            names = self.fs.ls(self.base, detail=False)
        except FileNotFoundError:
            return {}
        entries = {}
        for name in names:
            last = name.rstrip("/").rsplit("/", 1)[-1]
            if not last.startswith(prefix):
                continue
            try:
                entries[str(uuidlib.UUID(last[len(prefix):]))] = f"{self.base}/{last}"
            except ValueError:
                continue
        return entries

    def _newest(self, url: str) -> float:
        """The newest modification time (epoch seconds) under ``url``: the entry itself, and
        every file below it (a writer still at work keeps it young)."""
        times = []
        for info in [self.fs.info(url), *self.fs.find(url, detail=True).values()]:
            stamp = info.get("mtime") or info.get("LastModified") or info.get("created")
            if isinstance(stamp, datetime.datetime):
                stamp = stamp.timestamp()
            if stamp is not None:
                times.append(float(stamp))
        return max(times, default=time.time())

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

    def download(self, uuid: str, dst: pathlib.Path) -> list[str]:
        """Copy checkpoint ``uuid``'s files and directories into the local directory ``dst``
        (created if needed); returns the relative paths of the entries left out, sorted.

        Links are never followed, out of the checkpoint or within it: a task can
        write a link to any path of the host it ran on, and det serve or the CLI reading it
        would copy the reader's own file at that path (``/etc/passwd``, a ``pgpass``). They
        are skipped rather than refused: a stray link (a framework's ``latest``) would
        otherwise make every other file of the checkpoint unreachable, and the caller names
        what was left out. Pipes, sockets and devices are skipped alike. On the local
        filesystem every entry is opened ``O_NOFOLLOW`` relative to its directory's
        descriptor, so one swapped for a link while copying is skipped too; object stores
        have no links, and a key whose name would land outside ``dst`` (``..``, empty
        components) is skipped. The files are written ``O_NOFOLLOW`` under ``dst``.

        Raises:
            StorageError: the checkpoint does not exist (or is itself a link), or the storage
                fails.
        """
        src = self.url(uuid)
        try:
            if not self.fs.exists(src):
                raise StorageError(f"checkpoint {uuid} not found at {self.describe(uuid)}")
            if self.local and os.path.islink(src):
                raise StorageError(f"checkpoint {uuid}: {src} is a symbolic link, not the "
                                   "checkpoint's directory; det does not follow it")
            dst.mkdir(parents=True, exist_ok=True)
            if self.local:
                return _copy_local(src, dst, f"checkpoint {uuid}: download")
            return self._copy_remote(src, dst, f"checkpoint {uuid}: download")
        except StorageError:
            raise
        except Exception as e:  # botocore, OSError: the storage's own words, on one line
            raise StorageError(f"checkpoint {uuid}: cannot download {self.describe(uuid)}: "
                               f"{type(e).__name__}: {e}") from e

    def _copy_remote(self, src: str, dst: pathlib.Path, what: str) -> list[str]:
        """Copy the objects under ``src`` into ``dst`` (``download``'s object-store half)."""
        sizes = self.fs.find(src, detail=True)
        skipped, files = [], []
        for key, info in sorted(sizes.items()):
            rel = key[len(src):].lstrip("/")
            parts = rel.split("/")
            if any(p in ("", ".", "..") for p in parts):
                skipped.append(rel)
            else:
                files.append((key, parts, info.get("size") or 0))
        with ByteProgress(what, sum(size for _, _, size in files), upload=False) as progress:
            for key, parts, _ in files:
                with self.fs.open(key, "rb") as source:
                    _write(dst, parts, source, progress)
        return skipped

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
        refuses.

        On the local filesystem no link is followed (the GC task must not delete
        outside the storage): the directories from ``base`` down to ``url`` are opened
        ``O_NOFOLLOW`` one by one, and where one of them is a link (a task replaced it) there
        is nothing of this storage's there to remove (False, a warning logged); ``url``
        itself, if a link, is removed as a link; a directory is removed by descriptor
        (``shutil.rmtree`` with ``dir_fd``), which never follows the links inside."""
        try:
            if self.local:
                return _remove_local(self.base, url)
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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def _remove_local(base: str, url: str) -> bool:
    """``remove_tree`` on this host's filesystem: ``url`` is ``base`` and a relative path."""
    rel = os.path.relpath(url, base)
    parts = rel.split(os.sep)
    if rel == "." or ".." in parts:
        raise ValueError(f"{url}: not under the storage's base {base}")
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                return False
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                log.warning("%s: %s is not a directory (a link?); not followed, nothing "
                            "removed", url, os.path.join(base, *parts[:i + 1]))
                return False
            os.close(fd)
            fd = nxt
        try:
            info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(parts[-1], dir_fd=fd)
        else:
            os.unlink(parts[-1], dir_fd=fd)
        return True
    finally:
        os.close(fd)


def _copy_local(src: str, dst: pathlib.Path, what: str) -> list[str]:
    """``download`` on this host's filesystem: copy the tree ``src`` into ``dst`` without
    following a link; returns the relative paths skipped."""
    total = 0
    for dirpath, _, files in os.walk(src):  # os.walk does not descend into links
        for name in files:
            info = os.lstat(os.path.join(dirpath, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    skipped: list[str] = []
    top = os.open(src, _DIR_FLAGS)
    try:
        with ByteProgress(what, total, upload=False) as progress:
            _copy_dir(top, (), dst, skipped, progress)
    finally:
        os.close(top)
    return sorted(skipped)


def _copy_dir(fd: int, parts: tuple[str, ...], dst: pathlib.Path, skipped: list[str],
              progress: ByteProgress) -> None:
    """Copy the entries of the directory open as ``fd`` (``parts`` below the checkpoint)."""
    (dst.joinpath(*parts)).mkdir(exist_ok=True)
    for name in sorted(os.listdir(fd)):
        here = (*parts, name)
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    _copy_dir(sub, here, dst, skipped, progress)
                finally:
                    os.close(sub)
                continue
            if not stat.S_ISREG(info.st_mode):
                skipped.append("/".join(here))
                continue
            # O_NONBLOCK: an entry swapped for a FIFO since the stat cannot block the open
            source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=fd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            skipped.append("/".join(here))  # swapped for a link while copying
            continue
        with os.fdopen(source, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                skipped.append("/".join(here))
                continue
            _write(dst, list(here), f, progress)


def _write(dst: pathlib.Path, parts: list[str], source: BinaryIO,
           progress: ByteProgress) -> None:
    """Write ``source`` to ``dst/<parts>``, making its directories, never through a link
    (``O_NOFOLLOW``: the file itself; the directories are ``dst``'s own)."""
    path = dst.joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o644)
    with os.fdopen(out, "wb") as f:
        while chunk := source.read(_CHUNK):
            f.write(chunk)
            progress.add(len(chunk))


def storage_os_error(e: BaseException, path: pathlib.Path) -> int | None:
    """The errno of a storage failure behind ``e``, raised while writing under the local
    ``path``, or None for any other error.

    An ``OSError`` in ``e``'s chain (``__cause__`` / ``__context__``) with an errno of
    ``STORAGE_ERRNOS`` is one, unless it names a file outside ``path`` (the user's code
    failing to read its data is not the storage's failure). Otherwise a full disk is
    recognised by its free space (below ``LOW_SPACE_BYTES``, or no free inode): torch's
    writer (``inline_container.cc``) reports a failed write as ``RuntimeError: ... unexpected
    pos N vs M``, its OSError lost in C++, so no errno is left to read (that was all
    a full disk said)."""
    seen: set[int] = set()
    err: BaseException | None = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS and (
                err.filename is None or _within(err.filename, path)):
            return err.errno
        err = err.__cause__ or err.__context__
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        fs = os.statvfs(probe)
    except OSError:
        return None
    if fs.f_bavail * fs.f_frsize < LOW_SPACE_BYTES or (fs.f_files and fs.f_favail == 0):
        return errno.ENOSPC
    return None


def _within(name: str | bytes | int, path: pathlib.Path) -> bool:
    """Whether the file ``name`` (an OSError's ``filename``) is ``path`` or below it."""
    if not isinstance(name, str):
        return False
    return os.path.abspath(name) == str(path) or os.path.abspath(name).startswith(
        str(path) + os.sep)


def directory_sizes(root: pathlib.Path) -> dict[str, int]:
    """``{relative posix path: size in bytes}`` of every file under ``root``."""
    sizes: dict[str, int] = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = pathlib.Path(dirpath, name)
            sizes[path.relative_to(root).as_posix()] = path.stat().st_size
    return dict(sorted(sizes.items()))


def storage_from_config(checkpoint_storage: Mapping[str, Any] | None, *,
                        ambient_credentials: bool = True) -> FsspecStorage:
    """Build the storage from the config's ``checkpoint_storage`` section.

    Absent (``None``): a fresh temporary directory (local runs). S3 uses the section's
    ``access_key`` / ``secret_key``; without them, the process's own AWS credential chain
    when ``ambient_credentials`` (a task, the user's own CLI), else no credentials at all
    (unsigned requests: det serve reading a user's storage,
    :func:`det.configs.storage_policy.storage_access`).

    Raises:
        StorageError: a type other than ``shared_fs`` / ``directory`` / ``s3``, a missing
            required key, or an ``access_key`` without its ``secret_key``.
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
        if checkpoint_storage.get("access_key"):
            if not checkpoint_storage.get("secret_key"):
                raise StorageError("checkpoint_storage.secret_key: required with access_key")
            options["key"] = checkpoint_storage["access_key"]
            options["secret"] = checkpoint_storage["secret_key"]
        elif not ambient_credentials:  # never the standard chain's: it is not the user's
            options["anon"] = True
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        return FsspecStorage(fs, f"{bucket}/{prefix}" if prefix else bucket)
    raise StorageError(
        f"checkpoint_storage.type: {kind!r} is not supported by det "
        "(expected shared_fs, directory or s3)"
    )
