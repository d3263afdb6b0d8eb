"""What the three servers share: the task's transport and settings, a port, the loop that starts
a server, waits for it to answer, reports its use and stops it (see the package docstring)."""

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psutil
import psycopg

from det.configs.task import TaskSpec
from det.harness.errors import TaskEnvironmentError
from det.harness.transport import DbTransport
from det.sql import named

Q = named("harness")

START_TIMEOUT_SECONDS = 120.0
"""How long a server may take to answer before the task fails (``DET_SERVER_START_TIMEOUT``
overrides it, in seconds). JupyterLab answers in ~3 s on an idle host; a loaded one takes
several times that."""

ACTIVITY_POLL_SECONDS = 5.0
"""How often the server's own view of its use is read and reported: a quarter of the
shortest idle timeout the issue tests (20 s), so an idle end comes within a few seconds of
it."""

STOP_GRACE_SECONDS = 5.0
"""How long a server has to exit after SIGTERM (Jupyter shuts its kernels down in ~1 s) before
it is killed: half the agent's stop grace (det.agent.daemon.STOP_GRACE_SECONDS), so a planned
stop ends it before the agent kills the task."""

_PROBE_PAUSE = 0.1  # seconds between two looks at a server that does not answer yet
_TICK = 0.5  # seconds between two looks at a running server (has it exited?)
_HTTP_TIMEOUT = 2.0  # seconds one HTTP request to the server may take


class ServerError(Exception):
    """The server could not be started or never answered; the message is the task's one-line
    reason."""


class TaskTransport(DbTransport):
    """The task's side of the database: the allocation token's interactive functions
    (``schema.sql``: ``det_task.secrets``, ``det_task.ready``, ``det_task.activity``,
    ``det_task.tensorboard_sources``) over the harness's transport, which rides out database
    restarts, watches ``det_task.should_preempt`` and ends the process when the cluster ended the
    run (its token refused)."""

    def secrets(self) -> dict[str, Any]:
        """``{job_id, jupyter_token, ssh_public_key}`` of this task."""
        return self._call("task secrets", Q.task_secrets) or {}

    def ready(self, address: str) -> None:
        """Record that the server answers at ``address``.

        Raises ``DetError`` for an address the function refuses."""
        self._call("task ready", Q.task_ready, address)

    def activity(self, at: datetime) -> bool:
        """Report use of the server at ``at``; False when the database stayed away for
        ``ACTIVITY_POLL_SECONDS`` (the next poll reports again)."""
        try:
            self._run("task activity",
                      lambda conn: conn.execute(Q.task_activity, (self._token, at)),
                      give_up_after=ACTIVITY_POLL_SECONDS)
        except psycopg.OperationalError:
            return False
        return True

    def tensorboard_sources(self) -> list[dict[str, Any]]:
        """``det_task.tensorboard_sources``: ``{experiment_id, trial_id, storage}`` rows."""
        def rows(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
            cur = conn.execute(Q.task_tensorboard_sources, (self._token,))
            return [dict(zip(("experiment_id", "trial_id", "storage"), r, strict=True))
                    for r in cur]

        return self._run("tensorboard sources", rows)


def task_spec(env: Mapping[str, str]) -> TaskSpec:
    """The task's spec from ``DET_TASK_SPEC`` (``allocations.spec.task`` as JSON, set by the
    agent).

    Raises:
        TaskEnvironmentError: the variable is missing or is not a task spec.
    """
    raw = env.get("DET_TASK_SPEC")
    if not raw:
        raise TaskEnvironmentError("missing environment variable DET_TASK_SPEC: "
                                   "det.harness.interactive runs inside a det task")
    try:
        return TaskSpec.model_validate(json.loads(raw))
    except ValueError as e:
        raise TaskEnvironmentError(f"DET_TASK_SPEC: not a task spec ({e})") from None


def start_timeout(env: Mapping[str, str]) -> float:
    """Seconds a server may take to answer: ``DET_SERVER_START_TIMEOUT`` or
    :data:`START_TIMEOUT_SECONDS`.

    Raises:
        TaskEnvironmentError: the variable is not a positive number.
    """
    raw = env.get("DET_SERVER_START_TIMEOUT")
    if raw is None:
        return START_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise TaskEnvironmentError(f"DET_SERVER_START_TIMEOUT: expected a positive number of "
                                   f"seconds, got {raw!r}")
    return value


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_get(url: str, headers: Mapping[str, str] | None = None) -> Any:
    """The JSON body of a GET of ``url``, or None when the server does not answer it with 200
    (not yet listening, starting, an error)."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT) as response:
            body = response.read()
    except (OSError, urllib.error.URLError):
        return None
    try:
        return json.loads(body) if body else {}
    except ValueError:
        return {}


@dataclass
class Server:
    """One server to run: ``what`` names it in the log (``JupyterLab``), ``argv``/``env`` start
    it, ``address`` is what ``det_task.ready`` records; ``answers()`` says whether it answers
    yet; ``activity()`` (None: the server reports none) the latest sign of its use, or None
    when there is none; ``pid`` is its process's once started."""

    what: str
    argv: list[str]
    env: dict[str, str]
    address: str
    answers: Callable[[], bool]
    activity: Callable[[], datetime | None] | None = None
    cwd: str | None = None
    pid: int | None = None


def say(line: str) -> None:
    """One line in the task's log."""
    print(f"det.harness.interactive: {line}", file=sys.stderr, flush=True)


def serve(server: Server, transport: TaskTransport, timeout: float) -> int:
    """Run ``server`` (see the package docstring, steps 2 to 4) and return the task's exit code.

    Raises:
        ServerError: it exited before it answered, or did not answer within ``timeout``
            seconds (it is stopped first).
    """
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    say(f"starting {server.what}: {' '.join(server.argv)}")
    proc = subprocess.Popen(server.argv, env=server.env, cwd=server.cwd,
                            stdin=subprocess.DEVNULL)
    server.pid = proc.pid
    try:
        started = time.monotonic()
        while not server.answers():
            if (code := proc.poll()) is not None:
                raise ServerError(f"{server.what} exited with code {code} before it answered "
                                  f"at {server.address} (its output is above)")
            if time.monotonic() - started > timeout:
                raise ServerError(f"{server.what} did not answer at {server.address} within "
                                  f"{timeout:.0f} s")
            if stop.wait(_PROBE_PAUSE):
                return 0
        transport.ready(server.address)
        say(f"{server.what} answers at {server.address} after "
            f"{time.monotonic() - started:.1f} s")
        return _watch(server, proc, transport, stop)
    finally:
        _stop_process(proc, server.what)


def _watch(server: Server, proc: subprocess.Popen, transport: TaskTransport,
           stop: threading.Event) -> int:
    """Report the server's use until it exits (its code) or is to stop (0)."""
    reported: datetime | None = None
    next_poll = time.monotonic()
    while not stop.is_set() and not transport.should_preempt():
        if (code := proc.poll()) is not None:
            say(f"{server.what} exited with code {code}")
            return code
        if server.activity is not None and time.monotonic() >= next_poll:
            next_poll = time.monotonic() + ACTIVITY_POLL_SECONDS
            at = server.activity()
            # only news is written: a row update per poll of an idle server is no use
            if at is not None and (reported is None or at > reported) and transport.activity(at):
                reported = at
        stop.wait(_TICK)
    say(f"stopping {server.what}")
    return 0


def _stop_process(proc: subprocess.Popen, what: str) -> None:
    """SIGTERM, then SIGKILL after ``STOP_GRACE_SECONDS``; then SIGKILL what it started that
    is still there (sshd leaves its connections' processes running when it stops, by design);
    nothing if it has exited."""
    if proc.poll() is not None:
        return
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.terminate()
    try:
        proc.wait(STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        say(f"{what} ignored SIGTERM for {STOP_GRACE_SECONDS:.0f} s; killing it")
        proc.kill()
        proc.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()

