"""Model-definition contexts: the directory a user submits, packed as tar.gz.

Rules (spec: run-training-code, Create an Experiment): files matched by a top-level
``.detignore`` (gitignore syntax) are left out; ``.pyc`` files and ``__pycache__`` directories
always are; a context whose files add up to more than 95 MiB is refused before anything is
written.
"""

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pathspec
from tqdm import tqdm

from det.errors import ContextError

MAX_CONTEXT_BYTES = 95 * 1024 * 1024
# Above this many bytes, packing shows a progress bar.
PROGRESS_BAR_BYTES = 8 * 1024 * 1024
_ALWAYS_IGNORED = ["__pycache__/", "*.pyc"]


def context_files(root: Path) -> Iterator[tuple[Path, int]]:
    """Yield ``(relative path, size in bytes)`` of the files to pack, sorted, with ignores
    applied.

    Raises:
        ContextError: ``root`` is not a directory.
    """
    if not root.is_dir():
        raise ContextError(f"context directory {root}: not a directory")
    patterns = list(_ALWAYS_IGNORED)
    ignore_file = root / ".detignore"
    if ignore_file.is_file():
        patterns += ignore_file.read_text().splitlines()
    spec = pathspec.GitIgnoreSpec.from_lines(patterns)
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames
                             if not spec.match_file(f"{(rel_dir / d).as_posix()}/"))
        for name in sorted(filenames):
            rel = rel_dir / name
            if not spec.match_file(rel.as_posix()):
                yield rel, (root / rel).stat().st_size


def pack(root: Path) -> bytes:
    """Pack the context directory ``root`` into tar.gz bytes.

    Raises:
        ContextError: not a directory, or its files exceed 95 MiB (the message gives the size).
    """
    files = list(context_files(root))
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
            tar.add(root / rel, arcname=rel.as_posix(), recursive=False)
            bar.update(size)
    return buf.getvalue()


def unpack(data: bytes, dest: Path) -> None:
    """Unpack tar.gz ``data`` into ``dest`` (created if needed); refuses members that would
    land outside ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")
