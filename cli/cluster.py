"""``det cluster``, ``det db``, ``det agent``, ``det reconcile``: running det's processes.

``det cluster up`` starts, in the background, the embedded PostgreSQL (unless ``DET_DB_URL``
names one), a reconciler and one local agent; their pid files and logs live in
``<det home>/run``. ``det cluster down`` stops them.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import typer

from det.cli.output import print_table
from det.cli.session import db
from det.db import database_url, det_home, embedded
from det.errors import DetError

cluster_app = typer.Typer(no_args_is_help=True)
db_app = typer.Typer(no_args_is_help=True)
agent_app = typer.Typer(no_args_is_help=True)

# Background processes of a local cluster: name -> det sub-command.
PROCESSES = {"reconciler": ["reconcile"], "agent": ["agent", "run"]}
STOP_GRACE = 15.0

LEADER = "SELECT holder, since, last_pass FROM reconciler_leader"
AGENTS = """
SELECT g.id, g.hostname, g.resource_pool, g.state::text AS state, g.runtime, g.last_heartbeat,
       count(s.slot_id) AS slots,
       count(h.slot_id) AS used
  FROM agents g
  LEFT JOIN slots s ON s.agent_id = g.id
  LEFT JOIN allocation_slots h ON h.agent_id = s.agent_id AND h.slot_id = s.slot_id
                              AND NOT h.released
 GROUP BY g.id ORDER BY g.id
"""


def _run_dir() -> Path:
    d = det_home() / "run"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _pid(name: str) -> int | None:
    """The pid of the named background process if it is alive."""
    try:
        pid = int((_run_dir() / f"{name}.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


@cluster_app.command("up")
def up(
    slots: int = typer.Option(None, help="CPU slots of the local agent (default: CPU count)."),
    runtime: str = typer.Option(None, help="The local agent's runtime, docker or process "
                                           "(default: docker when an engine answers)."),
) -> None:
    """Start the database (embedded unless DET_DB_URL is set), a reconciler and an agent."""
    url = database_url()
    with db():
        pass  # brings the schema up to date before the processes start
    env = {**os.environ, "DET_DB_URL": url}
    for name, cmd in PROCESSES.items():
        if _pid(name):
            typer.echo(f"{name}: already running (pid {_pid(name)})")
            continue
        args = [sys.executable, "-m", "det.cli.main", *cmd]
        if name == "agent" and slots is not None:
            args += ["--slots", str(slots)]
        if name == "agent" and runtime is not None:
            args += ["--runtime", runtime]
        logfile = open(_run_dir() / f"{name}.log", "ab")  # noqa: SIM115 (handed to the child)
        proc = subprocess.Popen(args, env=env, stdout=logfile, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        (_run_dir() / f"{name}.pid").write_text(str(proc.pid))
        typer.echo(f"{name}: started (pid {proc.pid}, log {_run_dir() / f'{name}.log'})")
    typer.echo(f"database: {url}")


@cluster_app.command("down")
def down() -> None:
    """Stop the agent and the reconciler, then the embedded database."""
    for name in reversed(PROCESSES):
        pid = _pid(name)
        if pid is None:
            typer.echo(f"{name}: not running")
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while _pid(name) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid(name):
            os.kill(pid, signal.SIGKILL)
        (_run_dir() / f"{name}.pid").unlink(missing_ok=True)
        typer.echo(f"{name}: stopped")
    if not os.environ.get("DET_DB_URL"):
        stopped = embedded.stop(det_home())
        typer.echo("database: stopped" if stopped else "database: not running")


@cluster_app.command("status")
def status() -> None:
    """The database, the leading reconciler, agents and their slots."""
    url = database_url(start=False)
    typer.echo(f"database: {url}")
    for name in PROCESSES:
        pid = _pid(name)
        typer.echo(f"{name}: " + (f"running (pid {pid})" if pid else "not running here"))
    with db() as conn:
        leader = conn.execute(LEADER).fetchone()
        agents = conn.execute(AGENTS).fetchall()
    if leader:
        typer.echo(f"leader: {leader['holder']} since {leader['since']:%Y-%m-%d %H:%M:%S}, "
                   f"last pass {leader['last_pass']:%H:%M:%S}")
    typer.echo("")
    print_table(agents, ["id", "hostname", "resource_pool", "state", "runtime", "slots", "used",
                         "last_heartbeat"],
                ["Agent", "Host", "Pool", "State", "Runtime", "Slots", "Used", "Heartbeat"])


@db_app.command("migrate")
def migrate_cmd() -> None:
    """Apply the schema migrations this database lacks (idempotent)."""
    from det.db import connect, migrate

    with connect() as conn:
        applied = migrate(conn)
    typer.echo(f"applied migrations {applied}" if applied else "schema is up to date")


def reconcile(
    once: bool = typer.Option(False, "--once", help="Run passes until nothing changes, then exit."),
    interval: float = typer.Option(2.0, help="Seconds between passes when nothing wakes it."),
    agent_timeout: float = typer.Option(30.0, help="Seconds without heartbeat before an agent "
                                                   "is lost."),
) -> None:
    """Run the reconciler (one leader; others wait as standbys)."""
    from det.reconciler.loop import run
    from det.reconciler.passes import Settings

    with db():
        pass
    _exit_on_sigterm()
    run(database_url(), Settings(agent_timeout=agent_timeout, interval=interval), once=once)


@agent_app.command("run")
def agent_run(
    agent_id: str = typer.Option(None, "--id", help="Agent id: 1 to 63 letters, digits, '.', "
                                 "'_' or '-', starting with a letter or digit (default: the "
                                 "hostname)."),
    resource_pool: str = typer.Option("default", "--resource-pool"),
    slots: int = typer.Option(None, help="CPU slots to offer when no GPU is found "
                                         "(default: CPU count)."),
    work_dir: Path = typer.Option(None, help="Task directories (default: <det home>/agent)."),
    runtime: str = typer.Option(None, envvar="DET_AGENT_RUNTIME",
                                help="docker or process (default: docker when an engine "
                                     "answers, else process)."),
) -> None:
    """Run an agent: register this host's slots and run the tasks assigned to it."""
    from det.agent.daemon import Agent, AgentSettings, check_agent_id
    from det.agent.devices import discover

    if slots is not None and slots < 0:
        raise DetError("--slots: expected a number >= 0")
    if runtime not in (None, "docker", "process"):
        raise DetError(f"--runtime: expected docker or process, got {runtime!r}")
    if agent_id is None:
        agent_id = socket.gethostname()
        check_agent_id(agent_id, "--id (default: this host's name)")
    check_agent_id(agent_id, "--id")
    with db():
        pass
    settings = AgentSettings(agent_id=agent_id, pool=resource_pool,
                             work_dir=work_dir or det_home() / "agent" / agent_id,
                             runtime=runtime)
    _exit_on_sigterm()
    Agent(database_url(), settings, discover(slots)).run()


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks (the agent's shutdown) run."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
