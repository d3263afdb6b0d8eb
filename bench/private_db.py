"""What every benchmark needs: a database of its own, and det processes against it.

Benchmarks are run by hand (``python bench/NAME.py``); this module sits beside them and is
imported as ``private_db``.
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg

from det.db import embedded, migrate, roles


@dataclass(frozen=True)
class BenchDb:
    """``url`` of the benchmark's database (its owner's); ``home`` its temporary DET_HOME
    (the embedded server's directory), None when ``DET_DB_URL`` named the server."""

    url: str
    home: Path | None


@contextmanager
def private_database(embedded_only: bool = False) -> Iterator[BenchDb]:
    """A migrated database for one run: the server ``DET_DB_URL`` names (unless
    ``embedded_only``: benches that stop and restart the server need their own), else an
    embedded PostgreSQL in a fresh temporary DET_HOME, also set in ``os.environ`` so det
    processes started from here use it. On exit the embedded server is stopped and its files
    (often over 100 MB) are removed. The embedded server's actor roles get their passwords as
    ``det cluster up`` gives them (:func:`det.db.roles.provision`), so that agents and tasks
    connect as they do there (see :func:`det_process`)."""
    external = None if embedded_only else os.environ.get("DET_DB_URL")
    home = None if external else Path(tempfile.mkdtemp(prefix="det-bench-"))
    if home is not None:
        os.environ.pop("DET_DB_URL", None)
        os.environ["DET_HOME"] = str(home)
    try:
        url = external or embedded.ensure_running(home)
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            if home is not None:
                roles.provision(conn, home)
        yield BenchDb(url, home)
    finally:
        if home is not None:
            embedded.stop(home)
            shutil.rmtree(home, ignore_errors=True)


def det_process(url: str, *args: str, profile: Path | None = None) -> subprocess.Popen:
    """``det ARGS`` in the background against ``url``, output discarded; with ``profile``,
    under cProfile writing to that file. An agent of the embedded server connects as
    ``det_agent`` and gives its tasks ``det_task``'s URL, as under ``det cluster up``."""
    prefix = [sys.executable]
    if profile is not None:
        prefix += ["-m", "cProfile", "-o", str(profile)]
    env = {**os.environ, "DET_DB_URL": url}
    home = os.environ.get("DET_HOME")
    if args[:1] == ("agent",) and home and url == embedded.role_url(Path(home), embedded.OWNER):
        env.update(DET_DB_URL=embedded.role_url(Path(home), roles.AGENT),
                   DET_TASK_DB_URL=roles.task_url(Path(home)))
    return subprocess.Popen([*prefix, "-m", "det.cli.main", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process, then wait for each (their ``finally`` blocks run)."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def postgres_cpu(home: Path | None) -> float:
    """CPU seconds of the embedded server under ``home`` (0 for another server): its
    postmaster with its exited backends (counted in its children's times), and its live
    processes."""
    if home is None:
        return 0.0
    main = next((p for p in psutil.process_iter(["name", "cmdline"])
                 if p.info["name"] == "postgres"
                 and str(home) in " ".join(p.info["cmdline"] or ())  # None: it just exited
                 and "-D" in (p.info["cmdline"] or ())), None)
    if main is None:
        return 0.0
    total = 0.0
    for p in [main, *main.children()]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def own_cpu(proc) -> float:
    t = psutil.Process(proc.pid).cpu_times()
    return t.user + t.system


def tasks_cpu(agent) -> float:
    """CPU seconds of the agent's tasks: the ones it reaped, and its live children (the
    zygote, with the tasks it reaped), but not its task pooler (:func:`pooler_cpu`)."""
    p = psutil.Process(agent.pid)
    t = p.cpu_times()
    total = t.children_user + t.children_system
    for c in p.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if c.name() != "pgbouncer":
                ct = c.cpu_times()
                total += ct.user + ct.system + ct.children_user + ct.children_system
    return total


def pooler_cpu(agent) -> float:
    """CPU seconds of the agent's task pooler (PgBouncer), 0 without one."""
    total = 0.0
    for c in psutil.Process(agent.pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if c.name() == "pgbouncer":
                total += sum(c.cpu_times()[:2])
    return total


def busy_cpu() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - t.iowait
