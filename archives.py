"""Unpacking the archives det accepts (contexts: in det serve and in the agent), safely.

Rules: every member is validated here, never by trusting ``tarfile``'s "data"
filter (CVE-2025-4517: nested directories and one-letter links, a link of ``..``s longer than
PATH_MAX that the filter's ``realpath`` check misjudges, then a hardlink through it, wrote
outside the destination). Accepted members are:

- regular files and directories, under a relative name with no ``..`` component;
- symbolic links with a relative target that stays inside the destination when walked
  component by component from the link's directory (``..`` included, as the kernel walks it),
  passing through no other link on the way (its last component may be a link, itself held
  to the same rule).

Hardlinks, devices, FIFOs, sparse files, absolute names and ``..`` are refused, naming the
member. Files are written with ``os.open(O_CREAT | O_EXCL | O_NOFOLLOW)`` relative to
directories this module created and opened with ``O_NOFOLLOW``; links are made after every
file and directory, so no member can be written through a link. The uncompressed bytes (the
whole tar stream, headers included, and the files' contents) and the member count are capped
while streaming: a decompression bomb stops at the cap, with little written.
"""

import gzip
import io
import os
import tarfile
import zlib
from pathlib import Path
from typing import BinaryIO

from det.errors import ContextError

NAME_MAX = 255
"""Longest file name component, in bytes (Linux)."""

PATH_MAX = 4095
"""Longest member name or link target, in bytes (Linux's PATH_MAX less the NUL)."""

MAX_DEPTH = 256
"""Most directories a member may be under: each member's directories are opened one by one
from the destination, so this bounds the work a member costs."""

_HEADER_ALLOWANCE = 1536
"""Bytes of tar stream per member beyond its contents: its header, a long-name or pax header,
padding to 512."""

_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _TooLarge(Exception):
    """The decompressed stream passed its cap."""


class _CappedReader(io.RawIOBase):
    """Read ``raw`` (a decompressing stream), raising ``_TooLarge`` past ``limit`` bytes: caps
    what ``tarfile`` reads before a member is seen (headers, long names, pax records)."""

    def __init__(self, raw: BinaryIO, limit: int) -> None:
        self.raw = raw
        self.limit = limit
        self.count = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self.limit - self.count + 1
        data = self.raw.read(min(size, self.limit - self.count + 1))
        self.count += len(data)
        if self.count > self.limit:
            raise _TooLarge
        return data


def unpack_tar_gz(data: bytes, dest: Path, *, what: str, max_bytes: int,
                  max_members: int) -> None:
    """Unpack the tar.gz ``data`` into ``dest`` (created; if it exists it must be empty).

    ``what`` names the archive in errors (``"context"``); ``max_bytes`` caps the files'
    contents (uncompressed bytes), ``max_members`` the number of members. On an error, what
    was written so far stays in ``dest``: the caller removes it (it unpacks into a directory
    of its own).

    Raises:
        ContextError: not a tar.gz (naming ``what``), truncated or corrupt, over a cap, or a
            member refused by the rules above, naming the member and what was expected.
        ValueError: ``dest`` exists and is not an empty directory (a caller's mistake).
    """
    dest.mkdir(parents=True, exist_ok=True)
    root = os.open(dest, _DIR_FLAGS)
    try:
        if os.listdir(root):
            raise ValueError(f"{dest}: not an empty directory")
        stream = _CappedReader(gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb"),
                               max_bytes + max_members * _HEADER_ALLOWANCE + 2 * 10240)
        _Unpacker(root, what, max_bytes, max_members).run(stream)
    finally:
        os.close(root)


class _Unpacker:
    """One unpacking: the destination's descriptor and what has been made under it."""

    def __init__(self, root: int, what: str, max_bytes: int, max_members: int) -> None:
        self.root = root
        self.what = what
        self.max_bytes = max_bytes
        self.max_members = max_members
        self.kinds: dict[tuple[str, ...], str] = {(): "dir"}  # path -> "dir" | "file" | "link"
        self.links: list[tuple[tuple[str, ...], str]] = []
        self.written = 0

    def refuse(self, name: str, why: str) -> ContextError:
        return ContextError(f"{self.what}: member {name!r}: {why}")

    def run(self, stream: _CappedReader) -> None:
        name = None
        try:
            # "r|": a stream, read once, front to back (no seeking back over a bomb)
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for count, member in enumerate(tar, start=1):
                    name = member.name
                    if count > self.max_members:
                        raise self.refuse(name, f"more than {self.max_members} members")
                    self.member(tar, member)
                name = None
            for path, target in self.links:
                self.link(path, target)
        except _TooLarge:
            raise ContextError(
                f"{self.what}: more than {self.max_bytes} bytes uncompressed"
                + (f" (at member {name!r})" if name is not None else "")) from None
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
            at = f" (after member {name!r})" if name is not None else ""
            raise ContextError(f"{self.what}: not a readable tar.gz{at}: "
                               f"{type(e).__name__}: {e}") from None

    def parts(self, name: str) -> tuple[str, ...]:
        """The member's name as path components, refused unless relative and free of
        ``..``; ``.`` and empty components are dropped."""
        if "\0" in name:
            raise self.refuse(name, "a NUL character in the name")
        if name.startswith("/"):
            raise self.refuse(name, "an absolute name (expected a path inside the archive)")
        if len(os.fsencode(name)) > PATH_MAX:
            raise self.refuse(name, f"a name longer than {PATH_MAX} bytes")
        parts = tuple(p for p in name.split("/") if p not in ("", "."))
        if ".." in parts:
            raise self.refuse(name, "a '..' component (expected a path inside the archive)")
        if any(len(os.fsencode(p)) > NAME_MAX for p in parts):
            raise self.refuse(name, f"a component longer than {NAME_MAX} bytes")
        if len(parts) > MAX_DEPTH + 1:
            raise self.refuse(name, f"under more than {MAX_DEPTH} directories")
        return parts

    def member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        name = member.name
        parts = self.parts(name)
        if member.isdir():
            if parts:
                self.directory(name, parts)
            return
        if not parts:
            raise self.refuse(name, "names the archive's root (expected a file name)")
        if member.issym():
            self.check_target(name, parts, member.linkname)
            self.claim(name, parts, "link")
            os.close(self.parent(name, parts))  # the directories it lives in, made now
            self.links.append((parts, member.linkname))
            return
        if member.islnk():
            raise self.refuse(name, f"a hard link (to {member.linkname!r}); only files, "
                                    "directories and symbolic links are accepted")
        if not member.isreg() or member.issparse():
            kind = ("a character device" if member.ischr() else "a block device"
                    if member.isblk() else "a FIFO" if member.isfifo()
                    else "a sparse file" if member.issparse() else f"type {member.type!r}")
            raise self.refuse(name, f"{kind}; only files, directories and symbolic links are "
                                    "accepted")
        if self.written + member.size > self.max_bytes:
            raise ContextError(f"{self.what}: more than {self.max_bytes} bytes uncompressed "
                               f"(at member {name!r}, {member.size} bytes)")
        self.claim(name, parts, "file")
        parent = self.parent(name, parts)
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, 0o755 if member.mode & 0o111 else 0o644,
                         dir_fd=parent)
        finally:
            os.close(parent)
        with os.fdopen(fd, "wb") as out:
            source = tar.extractfile(member)
            assert source is not None  # a regular file always has contents
            left = member.size
            while left:
                chunk = source.read(min(_CHUNK, left))
                if not chunk:
                    raise self.refuse(name, "truncated")
                out.write(chunk)
                left -= len(chunk)
            self.written += member.size

    def claim(self, name: str, parts: tuple[str, ...], kind: str) -> None:
        if parts in self.kinds:
            raise self.refuse(name, f"appears twice (already a {self.kinds[parts]})")
        self.kinds[parts] = kind

    def directory(self, name: str, parts: tuple[str, ...]) -> None:
        """Make directory ``parts`` (and its parents); a directory named twice is fine."""
        kind = self.kinds.get(parts)
        if kind == "dir":
            return
        if kind is not None:
            raise self.refuse(name, f"appears twice (already a {kind})")
        fd = self.parent(name, parts)
        try:
            os.mkdir(parts[-1], 0o755, dir_fd=fd)
        finally:
            os.close(fd)
        self.kinds[parts] = "dir"

    def parent(self, name: str, parts: tuple[str, ...]) -> int:
        """Make the directories ``parts`` lives in; return the last one's descriptor (the
        caller closes it). Refused where one of them is a file or a link."""
        for i in range(1, len(parts)):
            prefix = parts[:i]
            kind = self.kinds.get(prefix)
            if kind == "link":
                raise self.refuse(name, f"under {'/'.join(prefix)!r}, a symbolic link")
            if kind == "file":
                raise self.refuse(name, f"under {'/'.join(prefix)!r}, a file")
            if kind is None:
                self.directory(name, prefix)
        return self.open_dir(name, parts[:-1])

    def open_dir(self, name: str, parts: tuple[str, ...]) -> int:
        """Descriptor of directory ``parts`` (one this unpacking made), opened component by
        component with ``O_NOFOLLOW``: nothing swapped in on disk redirects a write."""
        fd = os.dup(self.root)
        try:
            for p in parts:
                nxt = os.open(p, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def check_target(self, name: str, parts: tuple[str, ...], target: str) -> None:
        """Refuse a link target that is empty, absolute or too long, as its member is read;
        where it leads is checked by :meth:`link`, once every member is known."""
        if not target or "\0" in target:
            raise self.refuse(name, "a symbolic link with an empty target")
        if target.startswith("/"):
            raise self.refuse(name, f"a symbolic link to {target!r}, an absolute path "
                                    "(expected a relative link inside the archive)")
        if len(os.fsencode(target)) > PATH_MAX:
            raise self.refuse(name, f"a symbolic link whose target is longer than {PATH_MAX} "
                                    "bytes")

    def link(self, parts: tuple[str, ...], target: str) -> None:
        """Make link ``parts`` -> ``target`` once every member is known: walked component by
        component from the link's directory (as the kernel resolves it: ``d/..`` is the
        parent of what ``d`` points to, so no component it walks through, all but the last,
        may be a link), ``..`` may not climb above the destination."""
        name = "/".join(parts)
        where = list(parts[:-1])
        components = [c for c in target.split("/") if c not in ("", ".")]
        for i, c in enumerate(components):
            if c == "..":
                if not where:
                    raise self.refuse(name, f"a symbolic link to {target!r}, outside the "
                                            "archive")
                where.pop()
                continue
            where.append(c)
            if i < len(components) - 1 and self.kinds.get(tuple(where)) == "link":
                raise self.refuse(name, f"a symbolic link to {target!r}, through another "
                                        f"link ({'/'.join(where)!r})")
        parent = self.open_dir(name, parts[:-1])
        try:
            os.symlink(target, parts[-1], dir_fd=parent)
        finally:
            os.close(parent)
