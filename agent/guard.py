"""The ``process`` runtime's tasks die with their agent: a guard process per agent.

The agent starts the guard once, in a session of its own (a terminal's ^C or a signal to the
agent's group does not reach it), with a pipe of which the agent holds the only write end.
Every task's environment carries ``DET_AGENT_GUARD=<token>``, a random token of this agent
process, and the task's children inherit it. When the pipe reads end-of-file the agent is
gone, however it ended (``kill -9`` included): the guard SIGKILLs every process whose
environment carries the token, scanning ``/proc`` again until none is left, and exits.

Each task used to start as ``setpriv --pdeathsig HUP sh -c WRAPPER``: the kernel
signalled the wrapper shell, which killed the task's process group. That cost two exec()s and
a fork a task, ~1.8 ms of CPU of the ~10 ms a trivial task cost; a task now starts as its own
command. The scan also finds what a task moved out of its process group (``setsid``), which
the wrapper missed; a process that replaced its environment (``env -i``) escapes it.
"""

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

VAR = "DET_AGENT_GUARD"
"""The environment variable that marks a task (and its children) as an agent's."""

_SCANS = 200  # passes over /proc before the guard gives up on a task that keeps forking
_SCAN_PAUSE = 0.01  # seconds between two passes: SIGKILLed processes leave /proc meanwhile


class Guard:
    """The agent's side: :attr:`env` goes into every task's environment; :meth:`ensure`
    before each launch starts the guard process (again, if it died). Thread-safe."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self.env = {VAR: self.token}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._write_end: int | None = None

    def ensure(self) -> None:
        """Start the guard unless it runs. Raises ``OSError`` when it cannot start."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            if self._write_end is not None:
                os.close(self._write_end)
                self._write_end = None
            read_end, write_end = os.pipe()  # neither is inherited by tasks (O_CLOEXEC)
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "det.agent.guard", self.token],
                    stdin=read_end, stdout=subprocess.DEVNULL, start_new_session=True)
            except BaseException:
                os.close(write_end)
                raise
            finally:
                os.close(read_end)
            self._write_end = write_end

    def close(self) -> None:
        """End the guard now (what the agent's exit does): it kills what carries the token
        and exits; waits for that."""
        with self._lock:
            proc, write_end = self._proc, self._write_end
            self._proc = self._write_end = None
        if write_end is not None:
            os.close(write_end)
        if proc is not None:
            proc.wait()


def marked(marker: bytes) -> list[int]:
    """Pids of the processes whose environment holds the entry ``marker`` (``VAR=token``),
    this one excepted; processes this user may not read are passed over."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(name))
    return found


def kill_marked(marker: bytes) -> int:
    """SIGKILL every process :func:`marked` finds until a pass finds none (at most
    ``_SCANS`` passes: a process that forks faster than it is killed). Returns how many
    were signalled."""
    killed = 0
    for _ in range(_SCANS):
        pids = marked(marker)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(_SCAN_PAUSE)
    return killed


def main() -> None:
    """``python -m det.agent.guard TOKEN``: wait for end-of-file on standard input (the
    agent's end of the pipe closing), then kill the processes marked with TOKEN."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    marker = f"{VAR}={sys.argv[1]}".encode()
    while os.read(0, 4096):
        pass
    killed = kill_marked(marker)
    if killed:
        print(f"det agent guard: the agent is gone; killed {killed} of its task processes",
              file=sys.stderr)


if __name__ == "__main__":
    main()
