"""Progress of checkpoint uploads and downloads, in bytes.

fsspec reports a multi-file ``put`` / ``get`` to one callback per call (files done) and to a
child callback per file (bytes). :class:`ByteProgress` folds the bytes of every file into one
tqdm bar; where the output is not a terminal (a task's log) it writes one summary line
instead of a bar.
"""

import os
import sys
import time
from typing import IO, Any

from fsspec.callbacks import Callback
from tqdm import tqdm


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


class ByteProgress(Callback):
    """Pass as ``callback=`` to ``fs.put`` / ``fs.get`` (recursive). ``what``: the bar's label
    (``"upload <uuid>"``); ``total``: bytes expected (None if unknown); ``upload``: True when
    the local files are the sources (so a file fsspec copies without byte updates, as the local
    filesystem does, is counted by its local size). ``file``: where to write (stderr)."""

    def __init__(self, what: str, total: int | None, *, upload: bool,
                 file: IO[str] | None = None) -> None:
        super().__init__()
        self.what = what
        self.upload = upload
        self.out = file if file is not None else sys.stderr
        self.bytes = 0
        self.started = time.monotonic()
        tty = hasattr(self.out, "isatty") and self.out.isatty()
        self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=what,
                        file=self.out, disable=not tty, leave=True)

    def add(self, n: int) -> None:
        """Count ``n`` more bytes moved."""
        self.bytes += n
        self.bar.update(n)

    def branched(self, path_1: str, path_2: str, **kwargs: Any) -> Callback:
        return _FileBytes(self, path_1 if self.upload else path_2)

    def close(self) -> None:
        """End the bar, or write the summary line ``<what>: <bytes> in <s> s (<rate>/s)``."""
        if self.bar.disable:
            seconds = max(time.monotonic() - self.started, 1e-9)
            print(f"{self.what}: {_human(self.bytes)} in {seconds:.2f} s "
                  f"({_human(self.bytes / seconds)}/s)", file=self.out, flush=True)
        self.bar.close()


class _FileBytes(Callback):
    """One file's transfer: forwards its bytes to the parent's bar."""

    def __init__(self, parent: ByteProgress, local_path: str) -> None:
        super().__init__()
        self.parent = parent
        self.local_path = local_path

    def relative_update(self, inc: int = 1) -> None:
        self.value += inc
        self.parent.add(inc)

    def absolute_update(self, value: int) -> None:
        self.relative_update(value - self.value)

    def close(self) -> None:
        if self.value == 0 and os.path.isfile(self.local_path):
            self.relative_update(os.path.getsize(self.local_path))
