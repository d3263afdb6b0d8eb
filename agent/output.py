"""The output of an agent's process tasks: one thread reads every task's pipes.

A thread of its own per task (its start, its epoll set, its stack) cost the agent ~1.2 ms of
wall time and ~0.8 ms of CPU at every launch, and launches are sequential (1,000
tiny tasks on 32 slots start in batches of 32). One reader thread, woken by a pipe when a
task is added or stopped, serves them all.
"""

import os
import selectors
import threading
from collections.abc import Sequence
from typing import IO

from det.agent.logs import LogShipper

_READ_BYTES = 65_536


class _Followed:
    """One task's pipes: the line each has begun, and whether reading it is over."""

    def __init__(self, allocation_id: int, pipes: Sequence[tuple[IO[bytes], str]]) -> None:
        self.allocation_id = allocation_id
        self.pipes = {p.fileno(): (p, stream) for p, stream in pipes}
        self.partial = dict.fromkeys(self.pipes, b"")
        self.done = threading.Event()


class OutputReader:
    """Reads the stdout and stderr of process tasks into ``logs``, a line at a time, on one
    daemon thread (started with the first task)."""

    def __init__(self, logs: LogShipper) -> None:
        self.logs = logs
        self._lock = threading.Lock()
        self._added: list[_Followed] = []
        self._stopped: list[int] = []
        self._by_alloc: dict[int, _Followed] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._thread: threading.Thread | None = None

    def follow(self, allocation_id: int,
               pipes: Sequence[tuple[IO[bytes], str]]) -> threading.Event:
        """Read ``pipes`` (each a pipe and its stream name, ``stdout`` or ``stderr``) until
        every process that holds them closed them, or until :meth:`stop`. Returns an event
        set once reading is over: the pipes are closed and every line is in ``logs``."""
        followed = _Followed(allocation_id, pipes)
        for fd in followed.pipes:
            os.set_blocking(fd, False)
        with self._lock:
            self._added.append(followed)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="task-output")
                self._thread.start()
        os.write(self._wake_w, b"+")
        return followed.done

    def stop(self, allocation_id: int) -> None:
        """Stop reading a task's pipes (a process that left its session still holds them):
        its begun lines are shipped, its pipes closed, its event set."""
        with self._lock:
            self._stopped.append(allocation_id)
        os.write(self._wake_w, b"-")

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fd == self._wake_r:
                        self._changes(sel)
                    else:
                        self._read(sel, key.data, key.fd)

    def _changes(self, sel: selectors.BaseSelector) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            added, self._added = self._added, []
            stopped, self._stopped = self._stopped, []
        for followed in added:
            self._by_alloc[followed.allocation_id] = followed
            for fd in followed.pipes:
                sel.register(fd, selectors.EVENT_READ, followed)
        for allocation_id in stopped:
            followed = self._by_alloc.get(allocation_id)
            for fd in list(followed.pipes if followed else ()):
                self._close(sel, followed, fd)

    def _read(self, sel: selectors.BaseSelector, followed: _Followed, fd: int) -> None:
        try:
            data = os.read(fd, _READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(sel, followed, fd)
            return
        stream = followed.pipes[fd][1]
        *lines, followed.partial[fd] = (followed.partial[fd] + data).split(b"\n")
        if len(followed.partial[fd]) > _READ_BYTES:  # a line without end: ship it
            lines.append(followed.partial[fd])
            followed.partial[fd] = b""
        for raw in lines:
            self._add(followed, stream, raw)

    def _close(self, sel: selectors.BaseSelector, followed: _Followed, fd: int) -> None:
        """The end of one pipe: its begun line is shipped; the last pipe ends the task's."""
        pipe, stream = followed.pipes.pop(fd)
        sel.unregister(fd)
        if followed.partial[fd]:
            self._add(followed, stream, followed.partial[fd])
        pipe.close()
        if not followed.pipes:
            if self._by_alloc.get(followed.allocation_id) is followed:
                del self._by_alloc[followed.allocation_id]
            followed.done.set()

    def _add(self, followed: _Followed, stream: str, raw: bytes) -> None:
        self.logs.add(followed.allocation_id, stream, raw.decode(errors="replace"))
