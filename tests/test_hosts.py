"""Agents on other hosts over TLS (issue 35), the hosts made as Linux network namespaces.

One `det cluster up --listen` (its local agent offers no slots), a bridge on this machine with
the cluster's address, and two namespaces, each with a veth pair into the bridge and an address
of its own: an agent started in a namespace reaches the database only through the TLS gateway
(det.db.gateway), verifying it with det's CA; its tasks reach it through the agent's task
pooler over the same TLS link.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from conftest import REPO, Det, wait_for
from test_checkpoint_storage import CREDENTIALS, TRAIN, free_port
from test_e2e_digits import DIGITS, digits_config

from det.cli.supervisor import read_pid
from det.db import embedded, passfile

SUBNET = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
GATEWAY = f"{SUBNET}.1"
PORT = 15433


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def hosts() -> list[str]:
    """Two "hosts": network namespaces with addresses of their own on a bridge of this
    machine, which holds GATEWAY. Removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = str(os.getpid() % 100000)
    bridge, names = f"detbr{tag}", [f"det-h{i}-{tag}" for i in (1, 2)]
    _ip("link", "add", bridge, "type", "bridge")
    _ip("addr", "add", f"{GATEWAY}/24", "dev", bridge)
    _ip("link", "set", bridge, "up")
    # Docker's FORWARD policy is DROP, and bridged frames go through iptables where
    # br_netfilter is loaded: the hosts could reach the cluster but not each other.
    forward = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
    iptables = shutil.which("iptables")
    if iptables:
        subprocess.run([iptables, "-I", *forward], check=True, capture_output=True)
    try:
        for i, ns in enumerate(names, start=2):
            outside, inside = f"detv{i}o{tag}", f"detv{i}i{tag}"
            _ip("netns", "add", ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            for args in (["addr", "add", f"{SUBNET}.{i}/24", "dev", inside],
                         ["link", "set", inside, "up"], ["link", "set", "lo", "up"]):
                _ip("-n", ns, *args)
        yield names
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        if iptables:
            subprocess.run([iptables, "-D", *forward], capture_output=True)


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory) -> Det:
    """`det cluster up --listen GATEWAY:PORT`, its own agent with no slots."""
    tmp = tmp_path_factory.mktemp("hosts")
    env = {k: v for k, v in os.environ.items() if k not in ("DET_DB_URL", "DET_TASK_DB_URL")}
    env.update(DET_HOME=str(tmp / "home"), DET_USER="tester", PYTHONUNBUFFERED="1")
    d = Det(env, tmp)
    out = d("cluster", "up", "--listen", f"{GATEWAY}:{PORT}", "--runtime", "process",
            "--slots", "0", "--web-port", "0").stdout
    assert f"@{GATEWAY}:{PORT}/det?sslmode=verify-full&sslrootcert=" in out
    # the CA certificate up's URL names is there when up returns (a user copies it at once)
    assert "BEGIN CERTIFICATE" in (tmp / "home" / "tls" / "ca.crt").read_text()
    wait_for(lambda: _reaches(_remote_url(d, "det_agent")), 60, "the TLS gateway to listen")
    yield d
    d.stop_all()
    d("cluster", "down", check=False, timeout=120)


def _remote_url(cluster: Det, role: str, host: str = GATEWAY, **params: str) -> str:
    home = Path(cluster.env["DET_HOME"])
    password = passfile.lookup(passfile.path(home), role)
    query = {"sslmode": "verify-full", "sslrootcert": str(home / "tls" / "ca.crt"), **params}
    return (f"postgresql://{role}:{password}@{host}:{PORT}/det?"
            + "&".join(f"{k}={v}" for k, v in query.items()))


def _reaches(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=5).close()
        return True
    except psycopg.OperationalError:
        return False


def _start_agent(cluster: Det, ns: str, agent_id: str, slots: int,
                 runtime: str = "process") -> subprocess.Popen:
    """An agent enrolled from namespace ``ns`` (a one-time token, det's CA certificate as
    `det cluster ca` prints it, det home of its own), then `det agent run` there with its own
    login over TLS, tasks under ``runtime``; its tasks as det_task through its pooler."""
    home = Path(cluster.logdir) / f"home-{agent_id}"
    home.mkdir()
    (home / "ca.crt").write_text(cluster("cluster", "ca").stdout)
    token = cluster("agent", "token", "create").stdout.strip()
    env = {**cluster.env, **CREDENTIALS, "DET_HOME": str(home),
           "DET_TASK_DB_URL": _remote_url(cluster, "det_task", sslrootcert=str(home / "ca.crt"))}
    master = f"postgresql://{GATEWAY}:{PORT}/det?sslmode=verify-full&sslrootcert={home}/ca.crt"
    det = [sys.executable, "-m", "det.cli.main"]
    subprocess.run(["ip", "netns", "exec", ns, *det, "agent", "enroll", "--master", master,
                    "--token", token, "--id", agent_id], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=120)
    log = open(Path(cluster.logdir) / f"{agent_id}.log", "ab")  # noqa: SIM115 (with the process)
    p = subprocess.Popen(["ip", "netns", "exec", ns, *det, "agent", "run", "--id", agent_id,
                          "--runtime", runtime, "--slot-type", "cpu", "--slots", str(slots)],
                         cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    cluster.procs.append(p)
    return p


def _in_ns(ns: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)


def test_only_tls_verified_against_dets_ca_reaches_the_database(cluster, hosts) -> None:
    good = _remote_url(cluster, "det_agent")
    plain = _remote_url(cluster, "det_agent", sslmode="disable")
    wrong_ca = _remote_url(cluster, "det_agent",
                           sslrootcert="/etc/ssl/certs/ca-certificates.crt")
    probe = ("import psycopg, sys\n"
             "try:\n"
             "    c = psycopg.connect(sys.argv[1], connect_timeout=5)\n"
             "    print('OK', c.execute('SELECT current_user').fetchone()[0])\n"
             "except psycopg.OperationalError as e:\n"
             "    print('REFUSED', str(e).strip())\n")
    results = {}
    for name, url in (("good", good), ("plain", plain), ("wrong_ca", wrong_ca)):
        r = subprocess.run(["ip", "netns", "exec", hosts[0], sys.executable, "-c", probe, url],
                           capture_output=True, text=True, timeout=60)
        results[name] = r.stdout.strip()
    assert results["good"] == "OK det_agent"
    assert results["plain"].startswith("REFUSED") and "SSL required" in results["plain"]
    assert results["wrong_ca"].startswith("REFUSED")
    assert "certificate verify failed" in results["wrong_ca"]
    # A name the certificate does not carry fails verify-full even with det's CA.
    with pytest.raises(psycopg.OperationalError, match="does not match"):
        psycopg.connect(good, host="not-det.invalid", hostaddr=GATEWAY, connect_timeout=5)
    ca = cluster("cluster", "ca").stdout
    assert ca.startswith("-----BEGIN CERTIFICATE-----")
    assert ca == (Path(cluster.env["DET_HOME"]) / "tls" / "ca.crt").read_text()
    run = Path(cluster.env["DET_HOME"]) / "run"
    assert json.loads((run / "up.json").read_text())["listen"] == f"{GATEWAY}:{PORT}"
    status = cluster("cluster", "status").stdout
    assert "gateway: running" in status
    assert oct((Path(cluster.env["DET_HOME"]) / "tls" / "ca.key").stat().st_mode)[-3:] == "600"


def _experiment(cluster: Det, tmp: Path, **overrides) -> int:
    cfg = digits_config(tmp, **{"searcher.max_length": {"batches": 40},
                                "min_validation_period": {"batches": 20}, **overrides})
    out = cluster("experiment", "create", str(cfg), str(DIGITS)).stdout
    return int(out.split("Created experiment ")[1].split()[0])


def _owner(cluster: Det) -> psycopg.Connection:
    return psycopg.connect(embedded.role_url(Path(cluster.env["DET_HOME"]), embedded.OWNER),
                           autocommit=True)


def _where_trials_ran(cluster: Det, eid: int) -> list[str]:
    with _owner(cluster) as c:
        return [r[0] for r in c.execute(
            "SELECT DISTINCT s.agent_id FROM allocations a JOIN trials t ON t.id = a.trial_id"
            " JOIN allocation_slots s ON s.allocation_id = a.id WHERE t.experiment_id = %s"
            " ORDER BY 1", (eid,))]


@pytest.fixture(scope="module")
def remote_agents(cluster, hosts) -> list[str]:
    """An enrolled agent of one CPU slot on each namespaced host."""
    ids = [f"remote-{i}" for i in (1, 2)]
    for ns, agent_id in zip(hosts, ids, strict=True):
        _start_agent(cluster, ns, agent_id, slots=1)
    with _owner(cluster) as c:
        wait_for(lambda: c.execute("SELECT count(*) FROM agents WHERE id = ANY(%s) AND state ="
                                   " 'ACTIVE'", (ids,)).fetchone()[0] == 2, 120,
                 "the agents of both hosts to register")
        # each logged in as its own role, through the gateway
        logins = {r[0] for r in c.execute("SELECT usename FROM pg_stat_activity WHERE "
                                          "usename LIKE 'det\\_agent\\_%'")}
    assert logins == {f"det_agent_{i}" for i in ids}
    return ids


def _completes(cluster: Det, eid: int, steps: int) -> dict:
    assert cluster("experiment", "wait", str(eid), timeout=300).returncode == 0
    exp = json.loads(cluster("experiment", "describe", str(eid), "--json").stdout)
    assert exp["state"] == "COMPLETED"
    [trial] = exp["trials"]
    assert trial["state"] == "COMPLETED" and trial["steps_completed"] == steps
    assert "run ended with exit code 0" in cluster("trial", "logs", str(trial["id"])).stdout
    return trial


def test_a_digits_trial_runs_on_an_agent_of_another_host(cluster, remote_agents,
                                                         tmp_path) -> None:
    eid = _experiment(cluster, tmp_path)
    _completes(cluster, eid, 40)
    [where] = _where_trials_ran(cluster, eid)
    assert where in remote_agents
    # Its task reached the database through that agent's pooler, over the agent's TLS link.
    assert "task pooler: pgbouncer" in (Path(cluster.logdir) / f"{where}.log").read_text()


def test_a_two_slot_trial_spans_agents_of_two_hosts(cluster, remote_agents, tmp_path) -> None:
    eid = _experiment(cluster, tmp_path, **{"resources.slots_per_trial": 2})
    _completes(cluster, eid, 40)
    assert _where_trials_ran(cluster, eid) == remote_agents


def test_checkpoints_go_to_s3_from_another_host(cluster, remote_agents, tmp_path) -> None:
    """S3 (moto's server, on the cluster's address) needs nothing shared between hosts: a
    task on a namespaced host writes its checkpoints there, the cluster's host downloads."""
    import fsspec

    port = free_port()
    log = open(tmp_path / "moto.log", "wb")  # noqa: SIM115 (closed below)
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", GATEWAY, "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **CREDENTIALS})
    endpoint = f"http://{GATEWAY}:{port}"
    try:
        fs = fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True,
                               key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                               secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        wait_for(lambda: moto.poll() is not None or _listening(GATEWAY, port), 30,
                 "moto's S3 server to listen")
        fs.mkdir("ckpts")
        ctx = tmp_path / "ctx"
        ctx.mkdir()
        (ctx / "train.py").write_text(TRAIN)
        cfg = tmp_path / "exp.yaml"
        cfg.write_text(f"""\
name: s3-remote
entrypoint: {sys.executable} train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 3}}}}
checkpoint_storage: {{type: s3, bucket: ckpts, prefix: remote, endpoint_url: '{endpoint}'}}
max_restarts: 0
""")
        out = cluster("experiment", "create", str(cfg), str(ctx)).stdout
        eid = int(out.split("Created experiment ")[1].split()[0])
        assert cluster("experiment", "wait", str(eid), timeout=180).returncode == 0
        [where] = _where_trials_ran(cluster, eid)
        assert where in remote_agents
        with _owner(cluster) as c:
            best = c.execute("SELECT uuid::text FROM checkpoints c JOIN trials t ON t.id ="
                             " c.trial_id WHERE t.experiment_id = %s AND c.steps_completed = 2",
                             (eid,)).fetchone()[0]
        fs.invalidate_cache()
        assert f"ckpts/remote/{best}/weights.bin" in fs.find("ckpts/remote")
        got = tmp_path / "download"
        cluster("checkpoint", "download", best, "-o", str(got), **CREDENTIALS)
        assert (got / "weights.bin").read_bytes() == bytes(range(256)) * 80
    finally:
        moto.terminate()
        moto.wait(10)
        log.close()


def _listening(host: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def test_a_revoked_agent_of_another_host_is_cut_off_and_its_trial_completes_elsewhere(
        cluster, remote_agents, tmp_path) -> None:
    """Revoked mid-run over TLS (its sessions through the gateway end with their server
    sessions): the agent exits with one line, the run ends as a lost agent's, and the trial
    completes on the other host's agent, its runs never overlapping. Last: it spends an agent."""
    eid = _experiment(cluster, tmp_path, **{"searcher.max_length": {"batches": 300},
                                            "min_validation_period": {"batches": 50}})
    running = ("SELECT a.agent_id FROM allocations a JOIN trials t ON t.id = a.trial_id "
               "WHERE t.experiment_id = %s AND a.state = 'RUNNING' AND EXISTS (SELECT 1 FROM "
               "checkpoints c WHERE c.trial_id = t.id)")
    with _owner(cluster) as c:
        victim = wait_for(lambda: (c.execute(running, (eid,)).fetchone() or [None])[0], 180,
                          "the trial to run and checkpoint")
        assert "revoked" in cluster("agent", "revoke", victim).stdout
        log = Path(cluster.logdir) / f"{victim}.log"
        wait_for(lambda: "the database refused its login" in log.read_text(), 60,
                 f"{victim} to be cut off")
        _completes(cluster, eid, 300)
        runs = c.execute("SELECT a.agent_id, a.exit_reason, a.started_at, a.ended_at FROM "
                         "allocations a JOIN trials t ON t.id = a.trial_id WHERE "
                         "t.experiment_id = %s AND a.spec->>'kind' = 'trial' ORDER BY a.run",
                         (eid,)).fetchall()
    [other] = [a for a in remote_agents if a != victim]
    assert [(r[0], r[1]) for r in runs] == [(victim, "agent lost"), (other, None)], runs
    assert runs[0][3] <= runs[1][2]  # the second run started after the first had ended


def test_no_listen_turns_the_gateway_off_for_this_up_and_the_next(cluster) -> None:
    """The next `up` keeps `--listen` (run/up.json); `--no-listen` turns it off, and the
    next `up` keeps that too. Last: it restarts the cluster without its gateway."""
    r = cluster("cluster", "up", "--listen", f"{GATEWAY}:{PORT}", "--no-listen", check=False)
    assert r.returncode == 1 and "--no-listen: given with --listen" in r.stderr
    cluster("cluster", "down", timeout=120)
    out = cluster("cluster", "up", "--no-listen").stdout
    assert "supervisor: started" in out and "TLS only" not in out
    run = Path(cluster.env["DET_HOME"]) / "run"
    assert json.loads((run / "up.json").read_text())["listen"] is None
    pid = wait_for(lambda: read_pid(run, "supervisor"), 30, "the supervisor's pid file")
    assert b"--listen" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert not _reaches(_remote_url(cluster, "det_agent"))
    assert "gateway" not in cluster("cluster", "status").stdout


def test_listen_takes_host_and_port() -> None:
    from det.cli.cluster import parse_listen
    from det.errors import DetError

    assert parse_listen("10.0.0.5:5433") == ("10.0.0.5", 5433)
    assert parse_listen("[::1]:5433") == ("::1", 5433)
    for bad in ("10.0.0.5", ":5433", "db:0", "db:x", "db:70000"):
        with pytest.raises(DetError, match="--listen: expected HOST:PORT"):
            parse_listen(bad)


def test_the_server_certificate_is_kept_while_it_names_the_host(tmp_path) -> None:
    from cryptography import x509

    from det.db import tls

    cert, key = tls.ensure_server_cert(tmp_path, tmp_path, ["10.0.0.5", "db1"])
    first = cert.read_bytes()
    assert tls.ensure_server_cert(tmp_path, tmp_path, ["db1"])[0].read_bytes() == first
    tls.ensure_server_cert(tmp_path, tmp_path, ["10.0.0.6"])  # another address: a new one
    made = x509.load_pem_x509_certificate(cert.read_bytes())
    ca = x509.load_pem_x509_certificate(tls.ca_cert_path(tmp_path).read_bytes())
    assert made.issuer == ca.subject and cert.read_bytes() != first
    made.verify_directly_issued_by(ca)
    assert oct(key.stat().st_mode)[-3:] == "600"


def test_the_task_pooler_verifies_the_server_as_its_agent_does() -> None:
    from psycopg.conninfo import conninfo_to_dict

    from det.agent.pooler import config, pooled_url

    url = "postgresql://det_task:pw@10.0.0.1:5433/det?sslmode=verify-full&sslrootcert=/h/ca.crt"
    ini, _ = config(url, Path("/tmp/p"), 2)
    assert "server_tls_sslmode = verify-full\nserver_tls_ca_file = /tmp/p/ca.crt\n" in ini
    assert "server_tls" not in config(url.split("?")[0], Path("/tmp/p"), 2)[0]
    # Tasks reach the pooler's socket; the TLS link is the pooler's.
    pooled = conninfo_to_dict(pooled_url(url, Path("/tmp/p")))
    assert pooled["host"] == "/tmp/p" and "sslmode" not in pooled and "sslrootcert" not in pooled
