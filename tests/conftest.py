"""Fixtures: a real PostgreSQL for every test that needs one.

The server is the one ``DET_DB_URL`` names (the tests create and drop databases in it), else
an embedded server in a temporary directory. The schema is migrated once into a template
database; each test gets a fresh database cloned from it (``CREATE DATABASE ... TEMPLATE``).
"""

import functools
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import tuple_row

from det.agent import image
from det.db import migrate
from det.db.embedded import ensure_running
from det.db.roles import MACHINE_SCRAM_ITERATIONS, verifier

REPO = Path(__file__).resolve().parent.parent

# Test modules that share something of the host's besides their own databases: Docker's
# containers (named det-<agent>-<allocation>, the same in every test database) and its
# session-wide task image build; elastic agents, found and killed by their name
# (det-instance-<row id>, the same in every test database) in the host's /proc, Slurm's
# included. They run in one pytest-xdist worker, one after another.
HOST_GROUPS = {"test_docker": "docker", "test_image": "docker",
               "test_interactive_servers": "docker",
               "test_provisioner": "instances", "test_slurm": "instances"}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): three workers for the suite or a long list of test
    files — on two cores, most of a test's time is spent waiting on det's processes — and
    none (one plain process) for a file or two, or on a server named by ``DET_DB_URL``: the
    roles tests create are the server's, and workers sharing one would collide."""
    if os.environ.get("DET_DB_URL"):
        return 0
    files = [a for a in config.args if not a.startswith("-")]
    return 3 if not files or len(files) > 2 or any(Path(a).is_dir() for a in files) else 0


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist hands each test module to one worker whole, so module-scoped clusters
    start once, and the modules of a HOST_GROUPS group to the same worker, one after another.
    (xdist's own ``--dist loadgroup`` ignored its marks under pytest 9: modules were split.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return HOST_GROUPS.get(Path(path).stem, path)

    return ModuleGroups(config, log)


def _admin(url: str) -> psycopg.Connection:
    return psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True)


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A URL of the test server, naming its ``postgres`` database."""
    url = os.environ.get("DET_DB_URL")
    home = None
    if not url:
        home = tmp_path_factory.mktemp("pg")
        url = ensure_running(home)
    yield make_conninfo(url, dbname="postgres")
    if home is not None:
        from det.db.embedded import stop

        stop(home)


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> Iterator[str]:
    """Name of a database holding the migrated schema, used as the template of each test's."""
    name = f"det_template_{os.getpid()}"
    with _admin(pg_server) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(make_conninfo(pg_server, dbname=name), autocommit=True) as conn:
        migrate(conn)
        # det_task's password, which agents hand their tasks (DET_TASK_DB_URL): a task
        # container sees the socket directory and nothing else, no password file
        conn.execute(sql.SQL("ALTER ROLE det_task PASSWORD {}").format(
            sql.Literal(verifier(conn, "det_task", TASK_PASSWORD,
                                 iterations=MACHINE_SCRAM_ITERATIONS))))
    yield name
    with _admin(pg_server) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def db_url(pg_server: str, template_db: str) -> Iterator[str]:
    """URL of a fresh database with det's schema, dropped after the test."""
    name = f"det_test_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
    url = make_conninfo(pg_server, dbname=name)
    yield url
    drop_database(pg_server, url)


def drop_database(pg_server: str, url: str) -> None:
    """Drop a test's database and the roles of the det users, enrolled agents and enrollment
    tokens it created (roles are the server's, not the database's: another test may create a
    user of the same name)."""
    with psycopg.connect(url, autocommit=True) as c:
        users = [u for (u,) in c.execute(
            "SELECT username FROM users UNION ALL SELECT role_name FROM agent_logins "
            "UNION ALL SELECT role_name FROM agent_enrollment_tokens").fetchall()]
    with _admin(pg_server) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(psycopg.conninfo.conninfo_to_dict(url)["dbname"])))
        for u in users:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(u)))


class PrivateServer:
    """A PostgreSQL server of one test's own, with det's schema in database ``det``, that the
    test may stop, start and restart under running det processes (``url`` stays the same)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.url = ensure_running(home)
        with psycopg.connect(self.url) as c:
            migrate(c)

    def stop(self) -> None:
        """Fast shutdown: every session is disconnected, as in a restart or failover."""
        from det.db.embedded import stop_fast

        stop_fast(self.home)

    def start(self) -> None:
        ensure_running(self.home)

    def restart(self, down: float = 0.5) -> None:
        """Stop, stay down ``down`` seconds, start again."""
        self.stop()
        time.sleep(down)
        self.start()


@pytest.fixture
def private_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateServer]:
    """A restartable PostgreSQL server for this test alone (see :class:`PrivateServer`)."""
    from det.db.embedded import stop

    server = PrivateServer(tmp_path_factory.mktemp("private-pg"))
    yield server
    stop(server.home)


@pytest.fixture
def ctx(tmp_path: Path) -> Path:
    """A context directory whose model_def.py defines an (empty) MyTrial."""
    d = tmp_path / "ctx"
    d.mkdir()
    (d / "model_def.py").write_text("class MyTrial:\n    pass\n")
    return d


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection (dict rows) to the test's database."""
    from psycopg.rows import dict_row

    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        yield c


TASK_PASSWORD = "tests-det-task-password"


def task_url(db_url: str) -> str:
    """The URL tasks of the test's agents connect with: det_task, its password inline."""
    params = {k: v for k, v in conninfo_to_dict(db_url).items() if k not in ("passfile",)}
    return make_conninfo(**{**params, "user": "det_task", "password": TASK_PASSWORD})


def private_env(det_env: dict[str, str], url: str) -> dict[str, str]:
    """``det_env`` for a private server at ``url``: its tasks use the agent's own URL."""
    return {**{k: v for k, v in det_env.items() if k != "DET_TASK_DB_URL"}, "DET_DB_URL": url}


@pytest.fixture
def det_env(db_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for running det processes against the test's database (its tasks as
    det_task, as `det cluster up` sets it)."""
    return {**os.environ, "DET_DB_URL": db_url, "DET_TASK_DB_URL": task_url(db_url),
            "DET_HOME": str(tmp_path / "home"),
            "DET_USER": "tester", "PYTHONUNBUFFERED": "1",
            # Agents run tasks as processes unless a test asks for containers.
            "DET_AGENT_RUNTIME": "process"}


class Det:
    """Runs ``det`` commands and background det processes (reconcilers, agents) for a test."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []

    def __call__(self, *args: str, check: bool = True, timeout: float = 300,
                 input: str | None = None, cwd: Path = REPO,
                 **env: str) -> subprocess.CompletedProcess:
        """Run ``det ARGS`` in ``cwd`` (``input``: its stdin, e.g. answers to its questions);
        with ``check``, fail the test on a non-zero exit."""
        r = subprocess.run([sys.executable, "-m", "det.cli.main", *args], cwd=cwd,
                           env={**self.env, **env}, capture_output=True, text=True,
                           timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise AssertionError(f"det {' '.join(args)} exited {r.returncode}:\n"
                                 f"{r.stdout}\n{r.stderr}")
        return r

    def start(self, name: str, *args: str) -> subprocess.Popen:
        """Start ``det ARGS`` in the background; its output goes to ``<logdir>/<name>.log``."""
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        p = subprocess.Popen([sys.executable, "-m", "det.cli.main", *args], cwd=REPO,
                             env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        return (self.logdir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def det(det_env: dict[str, str], tmp_path: Path) -> Iterator[Det]:
    """A :class:`Det` runner bound to the test's database; stops what it started."""
    d = Det(det_env, tmp_path)
    yield d
    d.stop_all()


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    """A client of the Docker engine; the test is skipped, saying why, when none answers."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        pytest.skip(f"no Docker engine answers: {e}")
    return client


@pytest.fixture(scope="session")
def task_image(docker_client) -> str:
    """det's default task image, built offline (debootstrap) once if the engine lacks it or
    has an older one (image.image_revision)."""
    tarball = image.rootfs_tarball()
    if not (docker_client.images.list(image.DEFAULT_IMAGE)
            or docker_client.images.list(image.OFFLINE_BASE) or tarball.is_file()):
        if shutil.which("debootstrap") is None:
            pytest.skip("the task image is missing and debootstrap is not installed")
        if os.geteuid() != 0:
            pytest.skip("the task image is missing and building it offline needs root")
    return image.ensure_default_image(docker_client)


def processes(argv: list[str]) -> list[int]:
    """Pids of the live processes whose command line is exactly ``argv`` (a zombie has
    none)."""
    want = b"".join(a.encode() + b"\0" for a in argv)
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == want:
                out.append(int(pid))
        except OSError:
            pass
    return out


@functools.cache
def _names_before_0062() -> dict[str, str]:
    """``schema.name`` -> the function's name before migration 0062 moved det's functions into
    the actors' schemas, read from that migration's own list."""
    text = (REPO / "db" / "migrations" / "0062_actor_schemas.sql").read_text()
    return {f"{s}.{n}": old for old, s, n in re.findall(r"\('(det_\w+)', '(\w+)', '(\w+)'\)", text)}


def spelled(conn: psycopg.Connection, statement: str) -> str:
    """``statement`` as ``conn``'s database names det's functions: unchanged on a current
    one, with the names before migration 0062 (``det_agent.claim`` -> ``det_agent_claim``) on
    one a test built at an older migration."""
    current = conn.cursor(row_factory=tuple_row).execute(
        "SELECT to_regnamespace('det_user') IS NOT NULL").fetchone()[0]
    if current:
        return statement
    old = _names_before_0062()
    return re.sub(r"\bdet(?:_\w+)?\.\w+", lambda m: old.get(m.group(0), m.group(0)), statement)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll ``predicate`` until it returns a truthy value (returned), or fail after
    ``timeout`` seconds saying ``what`` never happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# -- Checkpoint GC (issue 16): ended experiments built row by row -------------------------------

GC_CONFIG = """\
name: gc
entrypoint: model_def:MyTrial
searcher: {name: random, metric: loss, max_trials: 1, max_length: {batches: 10}}
"""


class EndedExperiments:
    """Builds ended experiments with trials, checkpoints (files on disk under ``storage``)
    and validation metrics straight into the test's database, as a finished run leaves them.
    """

    def __init__(self, conn: psycopg.Connection, storage: Path) -> None:
        self.conn = conn
        self.storage = storage

    def make(self, trials: list[list[tuple[int, float | None]]], *,
             smaller_is_better: bool = True, policy: tuple[int, int, int] = (0, 1, 1),
             searcher_extra: str = "", checkpoint_storage: dict | None = None,
             file_bytes: int = 64, ended: bool = True) -> tuple[int, list[list[str]]]:
        """An experiment whose trial i wrote a checkpoint at each ``(steps, metric)`` of
        ``trials[i]`` (with a validation of that metric at that step, or none for None),
        COMPLETED unless ``ended`` is false (then still ACTIVE). Returns (experiment id, the
        checkpoint uuids per trial in the same order)."""
        from psycopg.types.json import Jsonb

        from det.configs import load_experiment_config

        text = GC_CONFIG.replace("max_trials: 1", f"max_trials: 1{searcher_extra}")
        if not smaller_is_better:
            text = text.replace("metric: loss", "metric: loss, smaller_is_better: false")
        cfg = load_experiment_config(text).expanded()
        cfg["checkpoint_storage"] = checkpoint_storage or {
            "type": "shared_fs", "host_path": str(self.storage), "storage_path": None}
        seb, stb, stl = policy
        cfg["checkpoint_storage"].update(save_experiment_best=seb, save_trial_best=stb,
                                         save_trial_latest=stl)
        c = self.conn
        eid = c.execute("SELECT det_user.create_experiment(%s, %s, NULL) AS id",
                        (Jsonb(cfg), text)).fetchone()["id"]
        job = c.execute("SELECT job_id FROM experiments WHERE id = %s", (eid,)).fetchone()
        uuids: list[list[str]] = []
        for points in trials:
            tid = c.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed, state,"
                            " end_time) VALUES (%s, gen_random_uuid(), '{}', 1, 'COMPLETED', "
                            "now()) RETURNING id", (eid,)).fetchone()["id"]
            alloc = c.execute(
                "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, "
                "spec, state, ended_at, exit_code, settled) VALUES (%s, %s, 1, 'default', 1, "
                "'{}', 'TERMINATED', now(), 0, true) RETURNING id",
                (job["job_id"], tid)).fetchone()["id"]
            mine = []
            for steps, metric in points:
                u = str(uuid.uuid4())
                if checkpoint_storage is None:
                    d = self.storage / u
                    d.mkdir(parents=True)
                    (d / "state.bin").write_bytes(b"x" * file_bytes)
                c.execute("INSERT INTO checkpoints (uuid, trial_id, allocation_id, "
                          "steps_completed, storage, resources) VALUES (%s, %s, %s, %s, %s, %s)",
                          (u, tid, alloc, steps, Jsonb(cfg["checkpoint_storage"]),
                           Jsonb({"state.bin": file_bytes})))
                if metric is not None:
                    c.execute("INSERT INTO metrics (trial_id, allocation_id, \"group\", "
                              "steps_completed, \"values\") VALUES (%s, %s, 'validation', %s, %s)",
                              (tid, alloc, steps, Jsonb({"loss": metric})))
                mine.append(u)
            uuids.append(mine)
        if ended:
            c.execute("UPDATE experiments SET state = 'COMPLETED', end_time = now() "
                      "WHERE id = %s", (eid,))
        return eid, uuids


@pytest.fixture
def ended(conn: psycopg.Connection, tmp_path: Path) -> EndedExperiments:
    """An :class:`EndedExperiments` writing checkpoint files under ``tmp_path/ckpts``."""
    return EndedExperiments(conn, tmp_path / "ckpts")
