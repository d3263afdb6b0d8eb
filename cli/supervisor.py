"""The local cluster's supervisor: what ``det cluster up`` leaves running in the background.

It runs two reconcilers (one leads, the other waits as a hot standby and takes over within
a poll of the leader's death: det.reconciler.leader) and the local agent as its children and
starts again any that dies, and, with the embedded database, starts the server again when it
is found dead. So nothing that crashed waits for a person to type ``det cluster up`` (issue
10, item 4), and a killed leader leaves no gap beyond the standby's takeover.

When a child is started again (:func:`restart_delay`): a child killed by a signal after it had
run ``QUICK_SECONDS`` (SIGKILL, the OOM killer, a person's ``kill``: an event from outside, not
its own failure) is started again at once; a child that exits on its own with any code, or
dies within ``QUICK_SECONDS`` of its start however it died, is failing, and waits an
exponential backoff (0.5 s doubling to 30 s) over its consecutive failures; a child that ran
``STEADY_SECONDS`` starts its count again. On SIGTERM the supervisor stops its children
(SIGTERM, ``STOP_GRACE`` seconds, SIGKILL) and exits. Elsewhere systemd or Kubernetes plays
this part.

Its pid file and its children's pid files and logs live in ``<det home>/run``. A child that is
failing (a server crash-looping on a taken port while ``det cluster status`` said it
ran) has ``<name>.failing`` there too, from its failed exit until it has run
``STEADY_SECONDS``: what ``det cluster status`` reports, with its log's last line.
"""

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import tenacity

from det.db import embedded

log = logging.getLogger("det.supervisor")

CHECK_SECONDS = 1.0
"""How often children and the embedded database are checked."""

STEADY_SECONDS = 60.0
"""A child that ran this long before dying is restarted at once (its backoff resets)."""

QUICK_SECONDS = 5.0
"""A child that dies sooner than this after its start is failing, even when a signal ended
it (a start that is killed again and again is a crash loop, not bad luck)."""

STOP_GRACE = 15.0
"""Seconds a child gets between SIGTERM and SIGKILL."""

_BACKOFF = tenacity.wait_exponential(multiplier=0.5, max=30)


def alive(pid: int | None) -> bool:
    """Whether ``pid`` is a running process (a zombie is not)."""
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def read_pid(run_dir: Path, name: str) -> int | None:
    """The pid recorded in ``<run_dir>/<name>.pid`` if that process is alive, else None."""
    try:
        pid = int((run_dir / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def failing(run_dir: Path, name: str) -> dict | None:
    """How the child ``name`` is failing, as its supervisor recorded it: ``failures`` (exits
    in a row, each a failure by :func:`restart_delay`), ``exit_code`` (negative: the signal),
    ``ran_seconds``, ``at`` (Unix time) and ``last_log_line`` (its log's, as it exited) of
    the last; None while it is not failing."""
    try:
        return json.loads((run_dir / f"{name}.failing").read_text())
    except (OSError, ValueError):
        return None


def last_line(path: Path, tail: int = 4096) -> str | None:
    """The last non-blank line of the file at ``path`` (of its last ``tail`` bytes), None if
    it has none or cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), None)


@dataclass
class Child:
    """One supervised det process: ``argv`` after ``det``; ``env``: what it adds to the
    supervisor's environment (its database URL); its log is ``<run_dir>/<name>.log``. Its
    database sessions are named ``det-<name>`` (``application_name``, in pg_stat_activity)."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    started: float = 0.0
    failures: int = 0
    next_start: float = 0.0


class Supervisor:
    """Keeps ``children`` (and, when ``home`` is given, the embedded database there) running.

    ``env`` is the children's environment; ``run_dir`` holds pid files and logs."""

    def __init__(self, children: list[Child], run_dir: Path, env: dict[str, str],
                 home: Path | None) -> None:
        self.children = children
        self.run_dir = run_dir
        self.env = env
        self.home = home
        self._stop = threading.Event()

    def run(self) -> None:
        """Supervise until SIGTERM or SIGINT."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        (self.run_dir / "supervisor.pid").write_text(str(os.getpid()))
        for child in self.children:  # a former supervisor's record says nothing of these
            (self.run_dir / f"{child.name}.failing").unlink(missing_ok=True)
        try:
            while not self._stop.is_set():
                self._check_database()
                for child in self.children:
                    self._check(child)
                self._stop.wait(CHECK_SECONDS)
        finally:
            self._stop_children()
            (self.run_dir / "supervisor.pid").unlink(missing_ok=True)

    def _check_database(self) -> None:
        if self.home is None or embedded.running_url(self.home) is not None:
            return
        log.warning("the embedded database is not running; starting it")
        try:
            embedded.ensure_running(self.home)
        except Exception as e:  # noqa: BLE001 -- any start failure: log, try on the next check
            log.error("could not start the embedded database: %s", e)

    def _check(self, child: Child) -> None:
        now = time.monotonic()
        if child.proc is not None:
            code = child.proc.poll()
            if code is None:
                if child.failures and now - child.started >= STEADY_SECONDS:
                    child.failures = 0  # as restart_delay would count it: recovered
                    (self.run_dir / f"{child.name}.failing").unlink(missing_ok=True)
                return
            ran = now - child.started
            child.failures, delay = restart_delay(code, ran, child.failures)
            if child.failures:
                # The log's last line now, the one it died with: its restart soon writes more.
                (self.run_dir / f"{child.name}.failing").write_text(json.dumps(
                    {"failures": child.failures, "exit_code": code,
                     "ran_seconds": round(ran, 1), "at": time.time(),
                     "last_log_line": last_line(self.run_dir / f"{child.name}.log")}))
            log.warning("%s exited with code %s after %.0f s; restarting in %.1f s",
                        child.name, code, ran, delay)
            child.proc = None
            child.next_start = now + delay
        if now < child.next_start:
            return
        logfile = open(self.run_dir / f"{child.name}.log", "ab")  # noqa: SIM115 (the child's)
        child.proc = subprocess.Popen([sys.executable, "-m", "det.cli.main", *child.argv],
                                      env={**self.env, "PGAPPNAME": f"det-{child.name}",
                                           **child.env}, stdout=logfile,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        logfile.close()
        child.started = now
        (self.run_dir / f"{child.name}.pid").write_text(str(child.proc.pid))
        log.info("%s started (pid %d)", child.name, child.proc.pid)

    def _stop_children(self) -> None:
        running = [c for c in reversed(self.children) if c.proc and c.proc.poll() is None]
        for c in running:
            c.proc.terminate()
        deadline = time.monotonic() + STOP_GRACE
        for c in running:
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
            log.info("%s stopped", c.name)
        for c in self.children:
            with contextlib.suppress(OSError):
                (self.run_dir / f"{c.name}.pid").unlink()
            (self.run_dir / f"{c.name}.failing").unlink(missing_ok=True)


def restart_delay(code: int, ran: float, failures: int) -> tuple[int, float]:
    """A child exited with ``code`` (negative: killed by that signal) after running ``ran``
    seconds, having failed ``failures`` times in a row before: its new failure count and the
    seconds to wait before starting it again (the rule in this module's docstring)."""
    if ran >= STEADY_SECONDS:
        return 0, 0.0
    if code < 0 and ran >= QUICK_SECONDS:
        return failures, 0.0
    return failures + 1, _BACKOFF(_attempt(failures + 1))


def _attempt(n: int) -> tenacity.RetryCallState:
    """A retry state at attempt ``n``, to ask tenacity's wait strategy for its delay."""
    state = tenacity.RetryCallState(None, None, (), {})
    state.attempt_number = n
    return state
