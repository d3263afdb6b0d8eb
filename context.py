"""Model-definition contexts: the directory a user submits, packed as tar.gz.

Rules (spec: run-training-code, Create an Experiment): files matched by a top-level
``.detignore`` (gitignore syntax) are left out; ``.pyc`` files and ``__pycache__`` directories
always are; a context whose files add up to more than 95 MiB is refused before anything is
written.

Symbolic links that stay inside the context are packed as links, not as copies of what they
point to: the task sees the tree the user has, a file reached through several links is stored
once, and a link to an ancestor directory cannot make packing loop. So each such link must
still work once unpacked: one that walks through another link on the way to its target
(unpacking refuses it: :mod:`det.archives`) or points to something ``.detignore`` leaves out
is refused at packing time, naming the link. A link that leads outside the context (absolute,
or out through ``..`` or other links) to a regular file is followed, as Determined 0.38's CLI
does (its ``detignore.os_walk_to_v1Files`` reads each file through its links): the target's
content is packed under the link's name, counts towards the size limit, and packing says so in
one line per link (e2e fixtures link their ``model_def.py`` to an example elsewhere in the
checkout). A link outside to a directory, a dangling link and a link loop are refused, naming
the link. This is the CLI reading the user's own checkout: an uploaded archive's links are
still checked member by member when unpacked (:mod:`det.archives`). Entries other than files,
directories and links (pipes, sockets, devices) are refused too.
"""

import errno
import gzip
import io
import os
import stat
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pathspec
from tqdm import tqdm

from det.archives import unpack_tar_gz
from det.errors import ContextError

MAX_CONTEXT_BYTES = 95 * 1024 * 1024
MAX_CONTEXT_MEMBERS = 30_000
"""Most members (files, directories, links) a context may have when unpacked."""
# Above this many bytes, packing shows a progress bar.
PROGRESS_BAR_BYTES = 8 * 1024 * 1024
_ALWAYS_IGNORED = ["__pycache__/", "*.pyc"]


def context_files(root: Path) -> Iterator[tuple[Path, int]]:
    """Yield ``(relative path, size in bytes)`` of the entries to pack, sorted, with ignores
    applied: regular files, symbolic links kept as links (size 0) and links followed out of
    the context (the size of the file they lead to).

    Raises:
        ContextError: ``root`` is not a directory, or an entry cannot be packed (a link that
            would not work once unpacked, a pipe, socket or device), naming it.
    """
    for rel, size, _ in _entries(root):
        yield rel, size


def _entries(root: Path) -> Iterator[tuple[Path, int, Path | None]]:
    """``context_files``'s entries, each with the file a followed link is read from (an
    absolute path; ``None`` for a file or a link packed as a link)."""
    if not root.is_dir():
        raise ContextError(f"context directory {root}: not a directory")
    patterns = list(_ALWAYS_IGNORED)
    ignore_file = root / ".detignore"
    if ignore_file.is_file():
        try:
            patterns += ignore_file.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ContextError(f"context directory {root}: cannot read .detignore: {e}") from None
    spec = pathspec.GitIgnoreSpec.from_lines(patterns)

    def unreadable(e: OSError) -> None:  # os.walk would skip the directory silently
        raise ContextError(f"context directory {root}: cannot read {e.filename}: {e.strerror}")

    # os.walk lists links to directories among ``dirnames`` but does not descend into them.
    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        rel_dir = Path(dirpath).relative_to(root)
        links = [d for d in dirnames if (root / rel_dir / d).is_symlink()]
        dirnames[:] = sorted(d for d in dirnames if d not in links
                             and not spec.match_file(f"{(rel_dir / d).as_posix()}/"))
        for name in sorted([*filenames, *links]):
            rel = rel_dir / name
            if spec.match_file(rel.as_posix()):
                continue
            info = (root / rel).lstat()
            if stat.S_ISLNK(info.st_mode):
                followed = _check_link(root, rel, spec)
                yield rel, followed.stat().st_size if followed else 0, followed
            elif stat.S_ISREG(info.st_mode):
                yield rel, info.st_size, None
            else:
                raise ContextError(f"context directory {root}: {rel} is not a regular file, "
                                   "directory or symbolic link")


def _check_link(root: Path, rel: Path, spec: pathspec.GitIgnoreSpec) -> Path | None:
    """Check the link ``root/rel``: ``None`` if it is packed as a link (a relative link whose
    target, and whatever that resolves to, is packed in the context), or the regular file
    outside the context it is followed to. Raises ``ContextError`` naming the link if
    neither (dangling, a loop, a directory outside, or a link that would break unpacked)."""
    target = os.readlink(root / rel)
    where = f"context directory {root}: {rel} is a symbolic link to {target}"
    try:
        info = os.stat(root / rel)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ContextError(f"{where}, which loops (links lead back to each other)") from None
        if e.errno == errno.ENOENT:
            raise ContextError(f"{where}, which does not exist") from None
        raise ContextError(f"{where}, which cannot be read: {e.strerror}") from None
    # The target as written, relative to the context (the link's own directory joined with it).
    lexical = os.path.normpath(os.path.join(rel.parent, target))
    real_root = os.path.realpath(root)
    resolved = os.path.realpath(root / rel)
    if (os.path.isabs(target) or lexical == ".." or lexical.startswith("../")
            or os.path.commonpath([real_root, resolved]) != real_root):
        if stat.S_ISREG(info.st_mode):
            return Path(resolved)
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ContextError(f"{where}, {kind} outside the context; only links to files are "
                           "followed: copy it in, or add it with --include")
    # Unpacking refuses a link whose target walks through another link (det.archives), so
    # packing does too, naming it: each directory on the way must be a real one.
    walked = list(rel.parent.parts)
    components = [c for c in target.split("/") if c not in ("", ".")]
    for c in components[:-1]:
        if c == "..":
            walked.pop()
            continue
        walked.append(c)
        if (root / Path(*walked)).is_symlink():
            raise ContextError(f"{where}, through another link ({Path(*walked)}); point it "
                               "at the real path")
    for path in (lexical, os.path.relpath(resolved, real_root)):
        suffix = "/" if os.path.isdir(os.path.join(real_root, path)) else ""
        if path != "." and spec.match_file(Path(path).as_posix() + suffix):
            raise ContextError(f"{where}, which .detignore leaves out")
    return None


def pack(root: Path, note: Callable[[str], None] | None = None) -> bytes:
    """Pack the context directory ``root`` into tar.gz bytes. Each link followed out of the
    context is told to ``note`` in one line (default: printed to stderr, where packing's
    progress bar goes too).

    Raises:
        ContextError: not a directory, its files (followed links' targets included) exceed
            95 MiB (the message gives the size) or number more than ``MAX_CONTEXT_MEMBERS``,
            an unreadable file or an entry that cannot be packed (``context_files``).
    """
    files = list(_entries(root))
    if len(files) > MAX_CONTEXT_MEMBERS:
        raise ContextError(
            f"context directory {root} has {len(files)} files and links; the limit is "
            f"{MAX_CONTEXT_MEMBERS} (leave data sets out with a .detignore file)")
    total = sum(size for _, size, _ in files)
    if total > MAX_CONTEXT_BYTES:
        raise ContextError(
            f"context directory {root} is {total / 2**20:.1f} MiB; the limit is 95 MiB "
            "(leave data sets out with a .detignore file and load them in your data loaders)")
    if note is None:
        def note(line: str) -> None:
            print(line, file=sys.stderr, flush=True)
    for rel, _, followed in files:
        if followed is not None:
            note(f"context: {rel} is a symbolic link to {os.readlink(root / rel)} outside the "
                 f"context; packed a copy of {followed}")
    buf = io.BytesIO()
    # mtime 0: gzip's header would otherwise hold the time of packing, and the same files
    # would make a new context (context_blobs are stored, and unpacked by agents, once per sha256)
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar, tqdm(
        total=total, unit="B", unit_scale=True, desc="packing context",
        disable=total < PROGRESS_BAR_BYTES,
    ) as bar:
        for rel, size, followed in files:
            try:
                _add(tar, followed or root / rel, rel.as_posix())
            except OSError as e:
                raise ContextError(f"context directory {root}: cannot read {rel}: "
                                   f"{e.strerror}") from None
            bar.update(size)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    """Add the file or link ``path`` as ``arcname``. A file with other hard links in the
    context is stored whole each time, not as tarfile's hard-link member: unpacking refuses
    hard links (:mod:`det.archives`)."""
    info = tar.gettarinfo(path, arcname=arcname)
    if info.issym():
        tar.addfile(info)
        return
    with open(path, "rb") as f:
        info.type, info.linkname, info.size = tarfile.REGTYPE, "", os.fstat(f.fileno()).st_size
        tar.addfile(info, f)


def unpack(data: bytes, dest: Path, what: str = "context") -> None:
    """Unpack the tar.gz context ``data`` into ``dest`` (created; if it exists, empty) with
    :func:`det.archives.unpack_tar_gz`: members checked one by one, at most
    ``MAX_CONTEXT_BYTES`` uncompressed and ``MAX_CONTEXT_MEMBERS`` members. ``what`` names
    the context in errors (``"context 12"``).

    Raises:
        ContextError: not a tar.gz, over a cap, or a member that is not a file, directory or
            link staying inside, naming the member.
    """
    unpack_tar_gz(data, dest, what=what, max_bytes=MAX_CONTEXT_BYTES,
                  max_members=MAX_CONTEXT_MEMBERS)
