"""``det cluster``, ``det db``, ``det agent``, ``det reconcile``: running det's processes.

``det cluster up`` starts the embedded PostgreSQL (unless ``DET_DB_URL`` names one) and, in the
background, a supervisor (:mod:`det.cli.supervisor`) that runs a reconciler and one local
agent, restarts whichever dies, and restarts a dead embedded database. Pid files and logs live
in ``<det home>/run``. ``det cluster down`` stops them.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import typer

from det.cli.output import duration, print_json, print_table
from det.cli.session import db
from det.cli.supervisor import STOP_GRACE, Child, Supervisor, failing, read_pid
from det.db import connect, database_url, det_home, embedded, migrate, owner_url, role_url, roles
from det.db.migrate import require_current
from det.errors import DetError
from det.host_user import AGENT_AS_ROOT, private_files, warn_if_root
from det.reconciler import leader
from det.sql import named

READ = named("queries")
cluster_app = typer.Typer(no_args_is_help=True)
db_app = typer.Typer(no_args_is_help=True)
agent_app = typer.Typer(no_args_is_help=True)

# Processes the supervisor runs: name -> det sub-command. Two reconcilers: one leads, the
# other is its hot standby (a killed leader's place is taken within a poll, not a restart).
# The TLS gateway runs only where `up --listen` asked for one.
PROCESSES = {"reconciler": ["reconcile"], "reconciler2": ["reconcile"], "agent": ["agent", "run"],
             "server": ["serve"], "gateway": ["cluster", "gateway"]}

WEB_PORT = 8080
"""The port `det cluster up` serves the REST API and WebUI on (det serve)."""



def _run_dir() -> Path:
    d = det_home() / "run"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def _embedded_home() -> Path | None:
    """det home when det runs its embedded database, None when DET_DB_URL names one."""
    return None if os.environ.get("DET_DB_URL") else det_home()


@cluster_app.command("up")
def up(
    slots: int = typer.Option(None, help="CPU slots of the local agent (default: the last "
                                         "up's, else the CPU count)."),
    runtime: str = typer.Option(None, help="The local agent's runtime, docker or process "
                                           "(default: the last up's, else docker when an "
                                           "engine answers)."),
    web_port: int = typer.Option(None, "--web-port", min=0, max=65535,
                                 help=f"Port of the REST API and WebUI on 127.0.0.1 (0: none; "
                                      f"default: the last up's, else {WEB_PORT})."),
    listen: str = typer.Option(None, "--listen", metavar="HOST:PORT",
                               help="Also accept TCP connections of agents and CLIs on other "
                                    "hosts at HOST:PORT (an address or name of this host; "
                                    "0.0.0.0 for all), with TLS only, the server's "
                                    "certificate signed by det's CA (`det cluster ca`). "
                                    "Default: the last up's, else a Unix socket only."),
    no_listen: bool = typer.Option(False, "--no-listen",
                                   help="Accept no TCP connections (a Unix socket only), "
                                        "though the last up listened; kept for the next up."),
) -> None:
    """Start the database (embedded unless DET_DB_URL is set) and a supervisor that keeps a
    reconciler and its standby, an agent and the web server (det serve) running. Settings not
    given are the last `up`'s. A web port already taken is refused before anything starts."""
    private_files()  # det home and all below it: this user's alone (det.host_user)
    tcp = _listen_setting(listen, no_listen)
    url = owner_url(start=True)
    with connect(url) as conn:
        migrate(conn)  # the schema is current before the processes start
        home = _embedded_home()
        admin = roles.provision(conn, home) if home is not None else None
    typer.echo(f"database: {url}")
    if admin is not None:
        typer.echo(f"user: {admin} (ClusterAdmin; `det user login` switches)")
    pid = read_pid(_run_dir(), "supervisor")
    if pid:
        typer.echo(f"supervisor: already running (pid {pid}); `det cluster down` stops it")
        return
    settings = _settings({"slots": slots, "runtime": runtime, "web_port": web_port,
                          "listen": "" if no_listen else listen})
    slots, runtime, web_port = settings["slots"], settings["runtime"], settings["web_port"]
    args = [sys.executable, "-m", "det.cli.main", "cluster", "supervise"]
    args += ["--slots", str(slots)] if slots is not None else []
    args += ["--runtime", runtime] if runtime is not None else []
    args += ["--watch-embedded"] if _embedded_home() is not None else []
    args += ["--web-port", str(web_port)]
    args += ["--listen", settings["listen"]] if tcp is not None else []
    logfile = open(_run_dir() / "supervisor.log", "ab")  # noqa: SIM115 (handed to the child)
    proc = subprocess.Popen(args, env=dict(os.environ), stdout=logfile,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    # On record before up returns, so a `down` at once stops it (it writes the same pid once
    # it runs; until then its SIGTERM ends it before it has started anything).
    (_run_dir() / "supervisor.pid").write_text(str(proc.pid))
    typer.echo(f"supervisor: started (pid {proc.pid}), running a reconciler, its standby and "
               f"an agent; logs in {_run_dir()}")
    if tcp is not None:
        from det.db import gateway, tls

        tls.ensure_ca(det_home())  # the URL below names it: there before up returns
        typer.echo(f"remote agents and CLIs, TLS only: {gateway.url(det_home(), roles.AGENT, *tcp)}"
                   " (sslrootcert: det's CA certificate, which `det cluster ca` prints; put it "
                   "at that path on the other host, or give its path there)")
    if web_port:
        who = admin or "a det user"
        typer.echo(f"web: http://127.0.0.1:{web_port}/ (REST API and WebUI; log in as {who} "
                   "once `det user change-password` gave it a password you know)")


def parse_listen(value: str) -> tuple[str, int]:
    """``--listen HOST:PORT`` as (host, port); an IPv6 address in brackets (``[::1]:5433``).

    Raises:
        DetError: not HOST:PORT with a port from 1 to 65535.
    """
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DetError(f"--listen: expected HOST:PORT (e.g. 10.0.0.5:5433), got {value!r}")
    return host, int(port)


def _listen_setting(listen: str | None, no_listen: bool = False) -> tuple[str, int] | None:
    """The TLS gateway's address of this ``up`` (:mod:`det.db.gateway`): ``--listen``'s,
    else None with ``--no-listen``, else the last ``up``'s, else None (a Unix socket only).

    Raises:
        DetError: --listen is malformed, or given with --no-listen, or given while DET_DB_URL
            names the database (det runs no server of its own to listen for).
    """
    if no_listen:
        if listen is not None:
            raise DetError("--no-listen: given with --listen; choose one")
        return None
    if listen is not None and _embedded_home() is None:
        raise DetError("--listen: DET_DB_URL names the database; det runs no server to listen")
    if listen is None:
        try:
            listen = json.loads((_run_dir() / "up.json").read_text()).get("listen")
        except (OSError, ValueError, AttributeError):
            listen = None
    if not isinstance(listen, str) or _embedded_home() is None:
        return None
    return parse_listen(listen)


def _settings(asked: dict) -> dict:
    """The settings of this ``up`` (``slots``, ``runtime``, ``web_port``, ``listen``, "" for
    ``--no-listen``): each one given, else the last ``up``'s (run/up.json), else its default
    (None: the supervisor's, no listening; the web port :data:`WEB_PORT`, 0 meaning no web
    server); recorded for the next ``up`` once the web port is known to be free
    (`--web-port` was forgotten by the next `up`).

    Raises:
        DetError: the web port is taken on 127.0.0.1 (another det's server, or any program):
            the server would only crash-loop there while the URL printed served someone else.
    """
    record = _run_dir() / "up.json"
    try:
        last = json.loads(record.read_text()) if record.exists() else {}
    except (OSError, ValueError):
        last = {}  # det's own note, unreadable: the defaults serve, and it is rewritten below
    last = last if isinstance(last, dict) else {}
    kept = {"slots": isinstance(last.get("slots"), int) and last["slots"] > 0,
            "runtime": last.get("runtime") in ("docker", "process"),
            "web_port": isinstance(last.get("web_port"), int) and 0 <= last["web_port"] < 65536,
            "listen": isinstance(last.get("listen"), str)}
    chosen = {k: v if v is not None else (last[k] if kept[k] else None)
              for k, v in asked.items()}
    if chosen["listen"] == "":
        chosen["listen"] = None  # --no-listen: recorded as never given, the default
    if chosen["web_port"] is None:
        chosen["web_port"] = WEB_PORT
    port = chosen["web_port"]
    if port:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as e:
                raise DetError(f"--web-port {port}: 127.0.0.1:{port} is taken ({e.strerror}); "
                               "choose a free port with --web-port N, or 0 for no web "
                               "server") from None
    record.write_text(json.dumps(chosen) + "\n")
    return chosen


@cluster_app.command("ca")
def ca() -> None:
    """Print det's CA certificate (PEM), which agents and CLIs on other hosts verify the
    server with (sslrootcert= in their URL; `det cluster up --listen` makes it)."""
    from det.db import tls

    path = tls.ca_cert_path(det_home())
    try:
        typer.echo(path.read_text(), nl=False)
    except FileNotFoundError:
        raise DetError(f"{path}: no CA certificate; `det cluster up --listen HOST:PORT` "
                       "makes it") from None


@cluster_app.command("gateway", hidden=True)
def gateway_cmd(listen: str = typer.Option(..., "--listen", metavar="HOST:PORT")) -> None:
    """Run the TLS gateway in the foreground, replacing this process with PgBouncer (what
    the supervisor runs for `det cluster up --listen`)."""
    from det.db import gateway

    argv = gateway.prepare(det_home(), *parse_listen(listen))
    os.execv(argv[0], argv)


@cluster_app.command("supervise", hidden=True)
def supervise(slots: int = typer.Option(None), runtime: str = typer.Option(None),
              watch_embedded: bool = typer.Option(False, "--watch-embedded"),
              web_port: int = typer.Option(0, "--web-port"),
              listen: str = typer.Option(None, "--listen")) -> None:
    """Run the supervisor in the foreground (what `det cluster up` starts). Its children
    connect with DET_DB_URL if set; with the embedded database, each with its own role: the
    reconciler as the owner, the agent as det_agent, giving its tasks det_task's URL."""
    private_files()
    agent = [*PROCESSES["agent"]]
    agent += ["--slots", str(slots)] if slots is not None else []
    agent += ["--runtime", runtime] if runtime is not None else []
    home = det_home() if watch_embedded else None
    urls: dict[str, dict[str, str]] = {name: {} for name in PROCESSES}
    if home is not None:
        owner = embedded.role_url(home, embedded.OWNER)
        agent_urls = {"DET_DB_URL": embedded.role_url(home, roles.AGENT),
                      "DET_TASK_DB_URL": roles.task_url(home)}
        # the reconciler's elastic agents (det.reconciler.local_provider) connect as this one
        urls = {"reconciler": {"DET_DB_URL": owner, "DET_AGENT_DB_URL": agent_urls["DET_DB_URL"],
                               "DET_TASK_DB_URL": agent_urls["DET_TASK_DB_URL"]},
                "server": {"DET_DB_URL": embedded.role_url(home, roles.WEB)},
                "agent": agent_urls}
    # the agents the reconciler starts (elastic and Slurm pools) run tasks as this `up`'s do
    runs_as = {"DET_AGENT_RUNTIME": runtime} if runtime is not None else {}
    children = [Child(name, PROCESSES[name], env={**urls["reconciler"], **runs_as})
                for name in ("reconciler", "reconciler2")]
    children.append(Child("agent", agent, env=urls["agent"]))
    (_run_dir() / "server.url").unlink(missing_ok=True)
    if web_port:
        children.append(Child("server", [*PROCESSES["server"], "--port", str(web_port)],
                              env=urls["server"]))
        (_run_dir() / "server.url").write_text(f"http://127.0.0.1:{web_port}/")
    if listen:
        children.append(Child("gateway", [*PROCESSES["gateway"], "--listen", listen]))
    Supervisor(children, _run_dir(), dict(os.environ), home).run()


@cluster_app.command("down")
def down() -> None:
    """Stop the supervisor with its reconciler and agent, then the embedded database.

    A planned stop, not a failure: the agent gives its running trials up to 10 s to
    checkpoint and exit as on pause, kills what is left, and reports the ends within the
    supervisor's 15 s between its SIGTERM and SIGKILL of each child; this command waits for
    the supervisor up to twice that. The trials resume from those checkpoints on
    `det cluster up`, with no restart counted."""
    # The numbers: det.agent.daemon.STOP_GRACE_SECONDS and det.cli.supervisor.STOP_GRACE.
    pid = read_pid(_run_dir(), "supervisor")
    if pid is None:
        typer.echo("supervisor: not running")
    else:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 2 * STOP_GRACE + 5
        while read_pid(_run_dir(), "supervisor") and time.monotonic() < deadline:
            time.sleep(0.1)
        for name in ("supervisor", *PROCESSES):
            left = read_pid(_run_dir(), name)
            if left:
                os.kill(left, signal.SIGKILL)
            (_run_dir() / f"{name}.pid").unlink(missing_ok=True)
        typer.echo("supervisor: stopped, with its reconciler, agent and web server")
    home = _embedded_home()
    if home is not None:
        stopped = embedded.stop(home)
        typer.echo("database: stopped" if stopped else "database: not running")


@cluster_app.command("status")
def status(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The database, the local processes (one that is failing with its log's last line),
    the leading reconciler, agents and their slots."""
    url = database_url()
    processes = {name: read_pid(_run_dir(), name) for name in ("supervisor", *PROCESSES)}
    failures = {}
    for name in PROCESSES:
        if processes["supervisor"] and (f := failing(_run_dir(), name)) is not None:
            failures[name] = {**f, "log": str(_run_dir() / f"{name}.log")}
    with db() as conn:
        leading = leader.current(conn)
        agents = conn.execute(READ.agents).fetchall()
    web = _web_url() if processes["server"] else None
    if json_:
        print_json({"database": url, "processes": processes, "failing": failures, "web": web,
                    "leader": leading, "agents": agents})
        return
    typer.echo(f"database: {url}")
    for name, pid in processes.items():
        if name in failures:
            typer.echo(failing_line(name, failures[name], time.time()))
            continue
        if name == "gateway" and not pid:
            continue  # only `det cluster up --listen` runs one
        at = f" at {web}" if name == "server" and web else ""
        typer.echo(f"{name}: " + (f"running (pid {pid}){at}" if pid else "not running here"))
    if leading and leading["alive"]:
        typer.echo(f"leader: {leading['holder']} since {leading['since']:%Y-%m-%d %H:%M:%S}, "
                   f"last pass {leading['last_pass']:%H:%M:%S}")
    elif leading:
        typer.echo(f"leader: none; the last leader, {leading['holder']}, is gone "
                   f"(its last pass at {leading['last_pass']:%Y-%m-%d %H:%M:%S})")
    else:
        typer.echo("leader: none; no reconciler has run against this database")
    typer.echo("")
    print_table(agents, ["id", "hostname", "resource_pool", "state", "runtime", "slots", "used",
                         "last_heartbeat"],
                ["Agent", "Host", "Pool", "State", "Runtime", "Slots", "Used", "Heartbeat"])


def failing_line(name: str, failure: dict, now: float) -> str:
    """``det cluster status``'s line for the supervised process ``name`` that is failing:
    ``failure`` as :func:`det.cli.supervisor.failing` reads it, with ``log``; ``now``: Unix
    time."""
    code = failure["exit_code"]
    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    times = failure["failures"]
    line = failure.get("last_log_line") or "(its log is empty)"
    return (f"{name}: failing: {how} after {duration(failure['ran_seconds'])}, "
            f"{times} time{'s' if times > 1 else ''} in a row, the last "
            f"{duration(now - failure['at'])} ago; the supervisor starts it again. Last line "
            f"of {failure['log']}: {line}")


def _web_url() -> str | None:
    """The URL of the web server `det cluster up` started, if any."""
    try:
        return (_run_dir() / "server.url").read_text().strip() or None
    except OSError:
        return None


def running_web_url() -> str | None:
    """The URL of the web server `det cluster up` runs here, while it runs (None if not)."""
    return _web_url() if read_pid(_run_dir(), "server") else None


@db_app.command("migrate")
def migrate_cmd() -> None:
    """Apply the schema migrations this database lacks (idempotent)."""
    with connect(owner_url()) as conn:
        applied = migrate(conn)
    typer.echo(f"applied migrations {applied}" if applied else "schema is up to date")


def reconcile(
    once: bool = typer.Option(False, "--once", help="Run passes until nothing changes, then exit."),
    interval: float = typer.Option(2.0, help="Seconds between passes when nothing wakes it."),
    agent_timeout: float = typer.Option(30.0, help="Seconds without heartbeat before an agent "
                                                   "is lost."),
    lease: float = typer.Option(10.0, help="Seconds a frozen leader keeps leadership before "
                                           "the database ends its session.", min=1.0),
    gc_batch: float = typer.Option(30.0, help="Seconds a running experiment's superseded "
                                              "checkpoints wait to be removed together.", min=0.0),
) -> None:
    """Run the reconciler (one leader; others wait as standbys). It rides out database
    restarts: it reconnects and leads again."""
    from det.db import retry
    from det.reconciler.loop import run
    from det.reconciler.passes import Settings

    private_files()
    url = owner_url()
    retry.call("reconciler: migrate", lambda: _migrate(url),
               give_up_after=60.0 if once else None)
    _exit_on_sigterm()
    run(url, Settings(agent_timeout=agent_timeout, interval=interval, lease=lease,
                      gc_batch=gc_batch), once=once)


@agent_app.command("run")
def agent_run(
    agent_id: str = typer.Option(None, "--id", help="Agent id: 1 to 63 letters, digits, '.', "
                                 "'_' or '-', starting with a letter or digit (default: the "
                                 "hostname)."),
    resource_pool: str = typer.Option(None, "--resource-pool",
                                      help="Its resource pool (default: the pool it was "
                                           "enrolled in, else default)."),
    slots: int = typer.Option(None, help="CPU slots to offer when no GPU is found, or with "
                                         "--slot-type cpu (default: CPU count)."),
    slot_type: str = typer.Option("auto", "--slot-type",
                                  help="auto (GPUs if any, else CPU slots), cuda, cpu (CPU "
                                       "slots even on a GPU host) or none (0-slot tasks "
                                       "only)."),
    work_dir: Path = typer.Option(None, help="Task directories (default: <det home>/agent)."),
    runtime: str = typer.Option(None, envvar="DET_AGENT_RUNTIME",
                                help="docker or process (default: docker when an engine "
                                     "answers, else process)."),
    poll: float = typer.Option(1.0, help="Seconds between two looks at the assignments when "
                                         "no NOTIFY wakes it."),
    warm_start: bool = typer.Option(True, "--warm-start/--cold-start",
                                    envvar="DET_AGENT_WARM_START",
                                    help="Process runtime: fork Python tasks from a zygote "
                                         "with det's harness imported (--cold-start: a fresh "
                                         "interpreter per task)."),
    task_db_url: str = typer.Option(None, envvar="DET_TASK_DB_URL",
                                    help="The database URL its tasks connect with, as a role "
                                         "that runs only task functions (default: the "
                                         "agent's own URL)."),
    task_pooler: bool = typer.Option(True, "--task-pooler/--no-task-pooler",
                                     envvar="DET_AGENT_TASK_POOLER",
                                     help="Process runtime: tasks connect through a "
                                          "session-mode PgBouncer of this agent, which hands "
                                          "each a warm database server process (where "
                                          "pgbouncer is installed; else tasks connect "
                                          "directly)."),
    stop_is_failure: bool = typer.Option(False, "--stop-is-failure", hidden=True,
                                         help="SIGTERM ends its runs as failed (an agent in "
                                              "a Slurm job: det.reconciler.slurm_provider)."),
    one_shot: bool = typer.Option(False, "--one-shot", hidden=True,
                                  help="Serve one assignment, then exit (the agent of a "
                                       "Slurm job run for one allocation)."),
) -> None:
    """Run an agent: register this host's slots and run the tasks assigned to it. What it
    and its tasks create is private to its user (det.host_user); it warns once if it runs as
    root. SIGTERM is a planned stop: its trials checkpoint and exit within 10 s, then it
    kills what is left (det.agent.daemon.Agent.shutdown); one that cannot heartbeat for two
    thirds of the reconciler's agent timeout kills its tasks (det.agent.heartbeat)."""
    from det.agent.daemon import Agent, AgentSettings, check_agent_id
    from det.agent.devices import check_slot_type, discover
    from det.cli.agent_identity import enrolled_identity

    if slots is not None and slots < 0:
        raise DetError("--slots: expected a number >= 0")
    check_slot_type(slot_type)
    if runtime not in (None, "docker", "process"):
        raise DetError(f"--runtime: expected docker or process, got {runtime!r}")
    if poll <= 0:
        raise DetError(f"--poll: expected seconds > 0, got {poll}")
    # enrolled (det agent enroll): its own login, id and pool; else the shared det_agent's
    enrolled = enrolled_identity(agent_id, resource_pool)
    if enrolled is not None:
        agent_id, resource_pool = enrolled.agent_id, enrolled.pool
    if agent_id is None:
        agent_id = socket.gethostname()
        check_agent_id(agent_id, "--id (default: this host's name)")
    check_agent_id(agent_id, "--id")
    resource_pool = resource_pool or "default"
    # Warned once the options are good: a refused command prints its one error line alone.
    private_files()
    warn_if_root("det agent", AGENT_AS_ROOT)
    url = enrolled.url if enrolled is not None else role_url(roles.AGENT)
    with connect(url) as conn:
        require_current(conn)
    settings = AgentSettings(agent_id=agent_id, pool=resource_pool,
                             work_dir=work_dir or det_home() / "agent" / agent_id,
                             runtime=runtime, poll=poll, warm_start=warm_start,
                             task_url=task_db_url, task_pooler=task_pooler,
                             stop_is_failure=stop_is_failure, one_shot=one_shot)
    _exit_on_sigterm()
    Agent(url, settings, discover(slots, slot_type)).run()


def _migrate(url: str) -> None:
    with connect(url) as conn:
        migrate(conn)


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks (the agent's shutdown) run."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
