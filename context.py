"""Model-definition contexts: the directory a user submits, packed as tar.gz.

Rules (spec: run-training-code, Create an Experiment): files matched by a top-level
``.detignore`` (gitignore syntax) are left out; ``.pyc`` files and ``__pycache__`` directories
always are; a context whose files add up to more than 95 MiB is refused before anything is
written.

Symbolic links are packed as links, not as copies of what they point to: the task sees the
tree the user has, a file reached through several links is stored once, and a link to an
ancestor directory cannot make packing loop. So each link must still work once unpacked: a link
that is absolute, leads outside the context (itself or through other links), walks through
another link on the way to its target (unpacking refuses it: :mod:`det.archives`), dangles, or
points to something ``.detignore`` leaves out is refused at packing time, naming the link
(unpacking would refuse or break it in every task). Entries other than files, directories and
links (pipes, sockets, devices) are refused too.
"""

import io
import os
import stat
import tarfile
from collections.abc import Iterator
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
    applied: regular files, and symbolic links (size 0; never followed).

    Raises:
        ContextError: ``root`` is not a directory, or an entry cannot be packed (a link that
            would not work once unpacked, a pipe, socket or device), naming it.
    """
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
                _check_link(root, rel, spec)
                yield rel, 0
            elif stat.S_ISREG(info.st_mode):
                yield rel, info.st_size
            else:
                raise ContextError(f"context directory {root}: {rel} is not a regular file, "
                                   "directory or symbolic link")


def _check_link(root: Path, rel: Path, spec: pathspec.GitIgnoreSpec) -> None:
    """Raise ``ContextError`` naming the link ``root/rel`` unless it works once unpacked: a
    relative link whose target, and whatever that resolves to, is packed in the context."""
    target = os.readlink(root / rel)
    where = f"context directory {root}: {rel} is a symbolic link to {target}"
    if os.path.isabs(target):
        raise ContextError(f"{where}, an absolute path; use a relative link inside the "
                           "context, or copy the file in")
    # The target as written, relative to the context (the link's own directory joined with it).
    lexical = os.path.normpath(os.path.join(rel.parent, target))
    real_root = os.path.realpath(root)
    resolved = os.path.realpath(root / rel)
    if (lexical == ".." or lexical.startswith("../")
            or os.path.commonpath([real_root, resolved]) != real_root):
        raise ContextError(f"{where}, outside the context; copy the file in instead")
    if not os.path.exists(resolved):
        raise ContextError(f"{where}, which does not exist")
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


def pack(root: Path) -> bytes:
    """Pack the context directory ``root`` into tar.gz bytes.

    Raises:
        ContextError: not a directory, its files exceed 95 MiB (the message gives the size)
            or number more than ``MAX_CONTEXT_MEMBERS``,
            an unreadable file or an entry that cannot be packed (``context_files``).
    """
    files = list(context_files(root))
    if len(files) > MAX_CONTEXT_MEMBERS:
        raise ContextError(
            f"context directory {root} has {len(files)} files and links; the limit is "
            f"{MAX_CONTEXT_MEMBERS} (leave data sets out with a .detignore file)")
    total = sum(size for _, size in files)
    if total > MAX_CONTEXT_BYTES:
        raise ContextError(
            f"context directory {root} is {total / 2**20:.1f} MiB; the limit is 95 MiB "
            "(leave data sets out with a .detignore file and load them in your data loaders)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar, tqdm(
        total=total, unit="B", unit_scale=True, desc="packing context",
        disable=total < PROGRESS_BAR_BYTES,
    ) as bar:
        for rel, size in files:
            try:
                _add(tar, root / rel, rel.as_posix())
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
