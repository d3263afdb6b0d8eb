"""A control plane that survives losing its database server (issue 35): det on a Patroni
cluster (deploy/ha/ha.sh: etcd, two PostgreSQL 15 nodes, synchronous replication), given as
a multi-host URL. The primary's postmaster is killed (kill -9) during a digits trial; Patroni
promotes the synchronous replica; the reconciler, the agent, the task's harness, the CLI and
det serve find the new primary, and the trial completes with 0 restarts, its metrics,
checkpoints and log lines stored exactly once each.

One HA cluster for the module (about 30 s to bring up). Skipped, saying why, where patroni or
etcd is not installed (.ci/run installs them: Debian's patroni and etcd-server)."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import psycopg
import pytest
from conftest import REPO, Det, wait_for
from psycopg.rows import dict_row
from test_api import Server
from test_e2e_digits import DIGITS, digits_config

HA = REPO / "deploy" / "ha" / "ha.sh"
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))

missing = [what for what, ok in (("patroni", shutil.which("patroni")),
                                 ("etcd", shutil.which("etcd")),
                                 (f"PostgreSQL 15 ({PG_BIN})", (PG_BIN / "postgres").exists()))
           if not ok]
pytestmark = pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)} "
                                "(Debian: apt-get install patroni etcd-server postgresql-15)")


class Cluster:
    """The HA cluster ha.sh brought up in ``dir``, its nodes' ports from ``base``."""

    def __init__(self, dir: Path, base: int, url: str) -> None:
        self.dir, self.base, self.url = dir, base, url

    def is_primary(self, node: int) -> bool:
        try:
            with urlopen(f"http://127.0.0.1:{self.base + 20 + node}/primary", timeout=2):
                return True
        except (URLError, OSError):
            return False

    def is_sync(self, node: int) -> bool:
        try:
            with urlopen(f"http://127.0.0.1:{self.base + 20 + node}/sync", timeout=2):
                return True
        except (URLError, OSError):
            return False

    def primary(self) -> int | None:
        return next((n for n in (1, 2) if self.is_primary(n)), None)

    def postmaster(self, node: int) -> int:
        return int((self.dir / f"node{node}" / "data" / "postmaster.pid").read_text().split()[0])


@pytest.fixture(scope="module")
def ha(tmp_path_factory) -> Iterator[Cluster]:
    """The cluster of deploy/ha/ha.sh (two nodes, etcd); its Patroni, PostgreSQL and etcd
    logs are kept under the test run's temporary directory (``ha-logs*``): who held the
    leader key when is what explains a failover test's failure."""
    dir = Path(tempfile.mkdtemp(prefix="det-ha-"))
    base = 20000 + (os.getpid() % 1000) * 40
    env = {**os.environ, "BASE_PORT": str(base), "PG_BIN": str(PG_BIN)}
    try:
        up = subprocess.run([str(HA), "up", str(dir)], env=env, capture_output=True, text=True,
                            timeout=300)
        assert up.returncode == 0, up.stderr
        yield Cluster(dir, base, up.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([str(HA), "down", str(dir)], env=env, timeout=120)
        shutil.copytree(dir, tmp_path_factory.mktemp("ha-logs"), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("data", "etcd", "*.pid", "*.yml"))
        shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture
def hdet(ha: Cluster, tmp_path: Path) -> Iterator[Det]:
    """det processes on the HA cluster's multi-host URL; tasks use the agent's URL."""
    d = Det({**os.environ, "DET_DB_URL": ha.url, "DET_HOME": str(tmp_path / "home"),
             "DET_USER": "tester", "PYTHONUNBUFFERED": "1", "DET_AGENT_RUNTIME": "process"},
            tmp_path)
    yield d
    d.stop_all()


def trial_through(ha: Cluster, hdet: Det, tmp_path: Path, request: pytest.FixtureRequest,
                  fault: Callable[[int], None],
                  reconciler_args: tuple[str, ...] = ()) -> None:
    """A digits trial on ``hdet``; once it trains, ``fault(primary node)``, then Patroni must
    promote the other node. The trial must complete with 0 restarts and 1 run, each metrics
    row, checkpoint and log line the task reported stored once; det serve must answer."""
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 300},
                                     "min_validation_period": {"batches": 100},
                                     "min_checkpoint_period": {"batches": 100},
                                     "scheduling_unit": 10})
    old = wait_for(ha.primary, 60, "a primary")
    wait_for(lambda: ha.is_sync(3 - old), 300, "a synchronous replica")
    hdet.start("reconciler", "reconcile", "--interval", "0.5", *reconciler_args)
    hdet.start("agent", "agent", "run", "--slots", "1")
    hdet("experiment", "create", str(cfg), str(DIGITS))
    server = Server(hdet.env, tmp_path)  # det serve, logged in before the failover
    request.addfinalizer(server.stop)

    def conn() -> psycopg.Connection:
        # a frozen node holds a connection attempt for its connect_timeout
        return psycopg.connect(ha.url, autocommit=True, row_factory=dict_row,
                               connect_timeout=5)

    with conn() as c:
        exp_id = c.execute("SELECT max(id) AS id FROM experiments").fetchone()["id"]
        trial_id = wait_for(lambda: c.execute(
            "SELECT m.trial_id FROM metrics m JOIN trials t ON t.id = m.trial_id "
            "WHERE t.experiment_id = %s AND m.\"group\" = 'training' LIMIT 1", (exp_id,)
        ).fetchone(), 180, "training to start")["trial_id"]
        steps = c.execute("SELECT steps_completed FROM trials WHERE id = %s", (trial_id,)
                          ).fetchone()["steps_completed"]
        assert steps < 300
    fault(old)
    wait_for(lambda: ha.primary() not in (None, old), 60, "Patroni to promote the replica")

    assert hdet("experiment", "wait", str(exp_id), timeout=300).returncode == 0
    exp = json.loads(hdet("experiment", "describe", str(exp_id), "--json").stdout)
    assert exp["state"] == "COMPLETED"
    r = server.client.get(f"/api/v1/experiments/{exp_id}")
    assert r.status_code == 200 and r.json()["state"] == "COMPLETED", r.text
    with conn() as c:
        trial = c.execute("SELECT state::text, restarts, runs, steps_completed FROM trials "
                          "WHERE id = %s", (trial_id,)).fetchone()
        assert trial == {"state": "COMPLETED", "restarts": 0, "runs": 1,
                         "steps_completed": 300}
        metrics = c.execute("SELECT \"group\", steps_completed FROM metrics "
                            "WHERE trial_id = %s ORDER BY id", (trial_id,)).fetchall()
        ckpts = c.execute("SELECT steps_completed FROM checkpoints WHERE trial_id = %s "
                          "ORDER BY steps_completed", (trial_id,)).fetchall()
        lines = [r["line"] for r in c.execute(
            "SELECT line FROM task_logs WHERE trial_id = %s ORDER BY id", (trial_id,))]
    # what the task reported: a training row every 10 batches, validations and checkpoints
    # every 100
    training = [m["steps_completed"] for m in metrics if m["group"] == "training"]
    validation = [m["steps_completed"] for m in metrics if m["group"] == "validation"]
    assert training == list(range(10, 301, 10))
    assert validation == [100, 200, 300]
    assert [c["steps_completed"] for c in ckpts] == [100, 200, 300]
    assert sum("validated at batch" in ln for ln in lines) == 3
    assert sum("saved checkpoint" in ln for ln in lines) == 3
    assert len(lines) == len(set(lines)), "no log line stored twice"


@pytest.mark.slow
def test_a_trial_completes_through_a_failover_with_nothing_lost_or_doubled(
        ha: Cluster, hdet: Det, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    trial_through(ha, hdet, tmp_path, request,
                  lambda node: os.kill(ha.postmaster(node), signal.SIGKILL))


FROZEN_SECONDS = 60


@pytest.mark.slow
def test_a_trial_completes_through_a_frozen_primary_with_nothing_lost_or_doubled(
        ha: Cluster, hdet: Det, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The whole primary (Patroni, the postmaster and its backends) SIGSTOPped for 60 s: its
    kernel still acknowledges, so det's calls to it get no error, only no answer; each fails
    at det's call deadline (det.db.reconnect) and reconnects to the promoted replica. When
    it resumes, Patroni demotes it: what it had not committed is not committed twice. Until
    then it still says read-write: det serve, whose pooled connection waited out the freeze,
    answered from its old state there (the completed experiment ACTIVE) before each request
    had to prove its server the primary (det.db.reconnect.confirm_primary). And Patroni 3.0's
    etcd v3 client let the woken node take its leader key back and rewind the promoted one
    (deploy/ha/ha.sh uses the v2 API with it).

    An agent timeout of 45 s (the agent's lease 30 s): Patroni promotes only after its ttl
    (10 s) and a loop, ~13 s, and the agent must beat again within its lease: up to a
    heartbeat interval (5 s) + the promotion + a reconnect after the call deadline, ~20 s,
    past the default lease of 20 s."""
    def freeze(node: int) -> None:
        pids = [int((ha.dir / f"node{node}" / "patroni.pid").read_text()), ha.postmaster(node)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        # Its backends only once the postmaster is stopped: one it forked between a listing
        # and its stop (a det process reconnecting) ran on, serving the frozen node's old
        # state and committing locally while waiting for the replica: a host half frozen.
        children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pids[1])],
                                  capture_output=True, text=True).stdout.split()
        for pid in (int(p) for p in children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            pids.append(pid)
        def resume() -> None:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # demoted: restarted
                    os.kill(pid, signal.SIGCONT)

        timer = threading.Timer(FROZEN_SECONDS, resume)
        timer.start()
        request.addfinalizer(lambda: (timer.cancel(), resume()))

    trial_through(ha, hdet, tmp_path, request, freeze, ("--agent-timeout", "45"))
