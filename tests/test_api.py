"""det serve's REST API against a real server process (``det serve``) and a real database:
every endpoint, bad input naming the field, missing / bad / expired tokens, illegal
transitions (409), metrics downsampled in SQL, and the event streams fed by LISTEN/NOTIFY."""

import base64
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det import context
from det.cli.users import password_verifier
from det.db import channels

REPO = Path(__file__).resolve().parent.parent

CONFIG = """
name: api-test
entrypoint: model_def:MyTrial
hyperparameters: {lr: 0.1}
searcher: {name: single, metric: loss, max_length: {batches: 100}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ``det serve`` process on a free port, and a client logged in to it."""

    def __init__(self, env: dict[str, str], logdir: Path, token_ttl: float = 3600) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = logdir / f"serve-{self.port}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "det.cli.main", "serve", "--port", str(self.port),
                 "--token-ttl", str(token_ttl)],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/api/v1/openapi.json", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"det serve did not start:\n{self.log.read_text()}")
            time.sleep(0.2)
        self.user, self.password = "tester", "tester's password"
        with psycopg.connect(env["DET_DB_URL"], autocommit=True) as c:
            if not c.execute("SELECT 1 FROM users WHERE username = %s", (self.user,)).fetchone():
                c.execute("SELECT det_user.user_create(%s, %s, true)",
                          (self.user, password_verifier(c, self.user, self.password)))
        self.token = self.login().json()["token"]
        self.client = httpx.Client(base_url=self.url, timeout=30,
                                   headers={"Authorization": f"Bearer {self.token}"})

    def login(self, password: str | None = None) -> httpx.Response:
        return httpx.post(f"{self.url}/api/v1/auth/login",
                          json={"username": self.user,
                                "password": self.password if password is None else password})

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server(det_env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    s = Server(det_env, tmp_path)
    yield s
    s.stop()


@pytest.fixture
def api(server: Server) -> httpx.Client:
    return server.client


def packed(ctx: Path) -> str:
    return base64.b64encode(context.pack(ctx)).decode()


def create(api: httpx.Client, ctx: Path, config: str = CONFIG) -> int:
    r = api.post("/api/v1/experiments", json={"config": config, "context": packed(ctx)})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, f"{r.status_code}: {r.text}"
    return r.json()["error"]


def running_trial(conn, exp_id: int) -> tuple[int, str]:
    """Give the experiment a trial with a live run (as the reconciler and an agent would);
    returns (trial id, the run's token)."""
    conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}, {"slot_id": 1, "type": "cpu"}]),))
    trial = conn.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) "
                         "VALUES (%s, gen_random_uuid(), '{\"lr\": 0.1}', 0) RETURNING id",
                         (exp_id,)).fetchone()["id"]
    alloc = conn.execute(
        "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
        "state, agent_id) SELECT job_id, %s, 1, 'default', 1, '{}', 'ASSIGNED', 'a1' "
        "FROM experiments WHERE id = %s RETURNING id", (trial, exp_id)).fetchone()["id"]
    conn.execute("INSERT INTO allocation_slots (allocation_id, agent_id, slot_id) "
                 "VALUES (%s, 'a1', 0)", (alloc,))
    token = conn.execute("SELECT det_agent.claim('a1', %s) AS t", (alloc,)).fetchone()["t"]
    conn.execute("SELECT det_task.info(%s)", (token,))
    return trial, token


# --- auth ---------------------------------------------------------------------------------


def test_login_gives_a_token_stored_hashed(server: Server, conn) -> None:
    r = server.login()
    assert r.status_code == 200
    body = r.json()
    assert body["username"] == server.user and len(body["token"]) >= 32
    assert "det_token" in r.cookies
    hashes = [bytes(row["token_hash"]) for row in
              conn.execute("SELECT token_hash FROM web_sessions").fetchall()]
    assert len(hashes) == 2 and all(body["token"].encode() not in h for h in hashes)
    assert server.client.get("/api/v1/me").json() == {"username": server.user}


def test_bad_logins_and_tokens_are_401(server: Server, api: httpx.Client) -> None:
    assert error(server.login("wrong"), 401) == "invalid username or password"
    r = httpx.post(f"{server.url}/api/v1/auth/login", json={"username": "mallory"})
    assert error(r, 401) == "invalid username or password"
    assert "not logged in" in error(httpx.get(f"{server.url}/api/v1/experiments"), 401)
    r = httpx.get(f"{server.url}/api/v1/experiments", headers={"Authorization": "Bearer nope"})
    assert error(r, 401) == "invalid or expired token: log in again"
    r = httpx.get(f"{server.url}/api/v1/experiments", headers={"Authorization": "Basic x"})
    assert error(r, 401) == "Authorization: expected 'Bearer TOKEN'"
    assert error(httpx.post(f"{server.url}/api/v1/auth/login", json={"user": "x"}), 400) \
        .startswith("username: ")
    # logging out ends the token
    assert api.post("/api/v1/auth/logout").status_code == 204
    assert error(api.get("/api/v1/experiments"), 401) == "invalid or expired token: log in again"


def test_an_expired_token_is_refused(det_env, tmp_path: Path, conn) -> None:
    s = Server(det_env, tmp_path, token_ttl=1)
    try:
        assert s.client.get("/api/v1/me").status_code == 200
        time.sleep(1.5)
        assert error(s.client.get("/api/v1/me"), 401) == "invalid or expired token: log in again"
        # a later login clears expired rows
        s.login()
        assert conn.execute("SELECT count(*) AS n FROM web_sessions").fetchone()["n"] == 1
    finally:
        s.stop()


def test_the_cookie_logs_the_webui_in(server: Server) -> None:
    with httpx.Client(base_url=server.url) as browser:
        browser.post("/api/v1/auth/login", json={"username": server.user,
                                                 "password": server.password})
        assert browser.get("/api/v1/me").json() == {"username": server.user}


def test_openapi_and_docs_are_served(server: Server) -> None:
    spec = httpx.get(f"{server.url}/api/v1/openapi.json").json()
    for path in ("/api/v1/experiments", "/api/v1/trials/{trial_id}/metrics",
                 "/api/v1/job-queue", "/api/v1/jobs/{job_id}/move-to-top", "/api/v1/agents",
                 "/api/v1/resource-pools", "/api/v1/cluster", "/api/v1/auth/login"):
        assert path in spec["paths"], path
    assert httpx.get(f"{server.url}/api/v1/docs").status_code == 200


# --- experiments ----------------------------------------------------------------------------


def test_create_get_and_list_experiments(api: httpx.Client, ctx: Path, server: Server) -> None:
    first = create(api, ctx)
    second = create(api, ctx, CONFIG.replace("api-test", "other"))
    exp = api.get(f"/api/v1/experiments/{first}").json()
    assert exp["name"] == "api-test" and exp["state"] == "ACTIVE"
    assert exp["owner"] == server.user and exp["config"]["searcher"]["metric"] == "loss"
    assert exp["trials"] == [] and exp["checkpoints"] == []
    assert exp["original_config"] == CONFIG
    page = api.get("/api/v1/experiments").json()
    assert [e["id"] for e in page["experiments"]] == [second, first]  # newest first
    assert page["pagination"] == {"offset": 0, "limit": 100, "total": 2}
    page = api.get("/api/v1/experiments", params={"sort": "id", "limit": 1, "offset": 1}).json()
    assert [e["id"] for e in page["experiments"]] == [second]
    assert page["pagination"]["total"] == 2
    assert [e["id"] for e in api.get("/api/v1/experiments",
                                      params={"name": "OTH"}).json()["experiments"]] == [second]
    assert api.get("/api/v1/experiments", params={"state": "PAUSED"}).json()["experiments"] == []
    assert api.get("/api/v1/experiments",
                   params={"owner": "nobody"}).json()["pagination"]["total"] == 0


def test_bad_input_is_400_naming_the_field(api: httpx.Client, ctx: Path) -> None:
    assert error(api.get("/api/v1/experiments", params={"sort": "color"}), 400).startswith(
        "sort: expected one of id, name")
    assert error(api.get("/api/v1/experiments", params={"limit": "x"}), 400).startswith("limit:")
    assert error(api.get("/api/v1/experiments", params={"limit": 5000}), 400) == \
        "limit: expected 0 to 1000, not 5000"
    assert error(api.get("/api/v1/experiments/abc"), 400).startswith("exp_id:")
    bad = CONFIG.replace("metric: loss", "metric: ''")
    msg = error(api.post("/api/v1/experiments", json={"config": bad, "context": packed(ctx)}),
                400)
    assert msg.startswith("config: searcher.metric:"), msg
    msg = error(api.post("/api/v1/experiments", json={"config": CONFIG, "context": "%%%"}), 400)
    assert msg.startswith("context: expected base64")
    msg = error(api.post("/api/v1/experiments",
                         json={"config": CONFIG.replace("MyTrial", "Nope"),
                               "context": packed(ctx)}), 400)
    assert msg == "entrypoint: model_def:Nope: model_def.py defines no class Nope"
    assert error(api.post("/api/v1/experiments", json={"config": CONFIG}), 400) == \
        "context: Field required"
    assert error(api.post("/api/v1/experiments", json={"config": CONFIG, "context": "",
                                                       "colour": 1}), 400).startswith("colour:")
    assert api.get("/api/v1/experiments").json()["pagination"]["total"] == 0


def test_actions_and_illegal_transitions(api: httpx.Client, ctx: Path, conn) -> None:
    exp = create(api, ctx)
    assert api.post(f"/api/v1/experiments/{exp}/pause").json() == {"id": exp, "state": "PAUSED"}
    assert api.post(f"/api/v1/experiments/{exp}/activate").json()["state"] == "ACTIVE"
    assert error(api.put(f"/api/v1/experiments/{exp}/archived", json={"archived": True}),
                 409) == f"experiment {exp} is ACTIVE: only an ended experiment can be archived"
    assert api.post(f"/api/v1/experiments/{exp}/kill").json()["state"] == "STOPPING_KILLED"
    assert error(api.post(f"/api/v1/experiments/{exp}/pause"), 409) == \
        f"experiment {exp}: cannot pause an experiment in state STOPPING_KILLED"
    assert error(api.post(f"/api/v1/experiments/{exp}/explode"), 400).startswith("action:")
    assert error(api.post("/api/v1/experiments/999/pause"), 404) == "experiment 999 not found"
    conn.execute("UPDATE experiments SET state = 'CANCELED', end_time = now() WHERE id = %s",
                 (exp,))
    assert error(api.post(f"/api/v1/experiments/{exp}/activate"), 409) == \
        f"experiment {exp}: cannot activate an experiment in state CANCELED"
    assert api.put(f"/api/v1/experiments/{exp}/archived",
                   json={"archived": True}).json()["archived"] is True
    assert api.get("/api/v1/experiments").json()["experiments"] == []
    assert len(api.get("/api/v1/experiments",
                       params={"archived": True}).json()["experiments"]) == 1
    assert api.post(f"/api/v1/experiments/{exp}/cancel").status_code == 409


def test_priority_and_weight(api: httpx.Client, ctx: Path, det) -> None:
    exp = create(api, ctx)
    assert api.patch(f"/api/v1/experiments/{exp}", json={"weight": 2.5}).json()["weight"] == 2.5
    assert api.get(f"/api/v1/experiments/{exp}").json()["weight"] == 2.5
    # fair share is the default scheduler: priority is refused by det_user.job_update's rule
    msg = error(api.patch(f"/api/v1/experiments/{exp}", json={"priority": 5}), 400)
    assert "priority applies only under the priority scheduler" in msg
    assert error(api.patch(f"/api/v1/experiments/{exp}", json={"weight": -1}), 400).startswith(
        "weight:")
    assert error(api.patch(f"/api/v1/experiments/{exp}", json={}), 400).startswith(
        "nothing to update")
    assert error(api.patch("/api/v1/experiments/999", json={"weight": 1}), 404) == \
        "experiment 999 not found"


# --- trials, metrics, logs, checkpoints -------------------------------------------------------


def test_trial_metrics_logs_and_checkpoints(api: httpx.Client, ctx: Path, conn,
                                            det_env) -> None:
    exp = create(api, ctx)
    trial, token = running_trial(conn, exp)
    for step in range(1, 101):
        conn.execute("SELECT det_task.report_metrics(%s, 'training', %s, %s)",
                     (token, step * 10, Jsonb({"loss": 1.0 / step})))
    conn.execute("SELECT det_task.report_metrics(%s, 'validation', 1000, %s)",
                 (token, Jsonb({"loss": 0.01})))
    alloc = conn.execute("SELECT id FROM allocations WHERE trial_id = %s", (trial,)).fetchone()
    conn.execute("SELECT det_agent.append_logs(%s, %s, %s)",
                 (alloc["id"], ["stdout"] * 3, ["one", "two", "three"]))
    t = api.get(f"/api/v1/trials/{trial}").json()
    # batches trained show before any checkpoint
    assert t["state"] == "ACTIVE" and t["batches"] == 1000 and t["steps_completed"] == 0
    assert t["best_validation"] == 0.01
    assert [(r["run"], r["state"], r["agent_id"]) for r in t["run_history"]] == \
        [(1, "RUNNING", "a1")]
    rows = api.get(f"/api/v1/trials/{trial}/metrics").json()["rows"]
    assert [r["steps_completed"] for r in rows] == [s * 10 for s in range(1, 101)]
    rows = api.get(f"/api/v1/trials/{trial}/metrics", params={"max_points": 10}).json()["rows"]
    steps = [r["steps_completed"] for r in rows]
    assert len(rows) == 10 and steps[0] == 10 and steps[-1] == 1000 and steps == sorted(steps)
    assert error(api.get(f"/api/v1/trials/{trial}/metrics", params={"max_points": 1}), 400) == \
        "max_points: expected 2 to 100000, not 1"
    val = api.get(f"/api/v1/trials/{trial}/metrics", params={"group": "validation"}).json()
    assert [r["values"] for r in val["rows"]] == [{"loss": 0.01}]
    curves = api.get(f"/api/v1/experiments/{exp}/metrics",
                     params={"group": "training", "max_points": 5}).json()
    assert [c["trial_id"] for c in curves["trials"]] == [trial]
    assert len(curves["trials"][0]["rows"]) == 5
    logs = api.get(f"/api/v1/trials/{trial}/logs").json()["logs"]
    assert [x["line"] for x in logs] == ["one", "two", "three"]
    tail = api.get(f"/api/v1/trials/{trial}/logs", params={"tail": 2}).json()["logs"]
    assert [x["line"] for x in tail] == ["two", "three"]
    after = api.get(f"/api/v1/trials/{trial}/logs", params={"after": logs[0]["id"]}).json()
    assert [x["line"] for x in after["logs"]] == ["two", "three"]
    uuid = "5a1e0c6e-3d3f-4c1e-9a53-0b6f3c1d2e4f"
    conn.execute("SELECT det_task.report_checkpoint(%s, %s, 1000, %s, '{}')",
                 (token, uuid, Jsonb({"model.pt": 123})))
    ckpts = api.get(f"/api/v1/trials/{trial}/checkpoints").json()["checkpoints"]
    assert [(c["steps_completed"], c["size_bytes"], c["state"]) for c in ckpts] == \
        [(1000, 123, "COMPLETED")]
    exp_ckpts = api.get(f"/api/v1/experiments/{exp}/checkpoints").json()["checkpoints"]
    assert exp_ckpts[0]["validation"] == {"loss": 0.01}
    assert api.get(f"/api/v1/experiments/{exp}/trials").json()["trials"][0]["batches"] == 1000
    # download: the files from the checkpoint's storage (the default shared_fs), as a tar.gz
    assert error(api.get(f"/api/v1/checkpoints/{uuid}/download"), 502).startswith(
        f"checkpoint {uuid} not found at ")
    ckpt_dir = Path(det_env["DET_HOME"]) / "checkpoints" / uuid
    ckpt_dir.mkdir(parents=True)
    (ckpt_dir / "model.pt").write_bytes(b"x" * 123)
    r = api.get(f"/api/v1/checkpoints/{uuid}/download")
    assert r.status_code == 200 and r.headers["content-type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        assert {m.name: m.size for m in tar.getmembers() if m.isfile()} == \
            {f"{uuid}/model.pt": 123}
    assert error(api.get(f"/api/v1/checkpoints/{uuid[:-1]}0/download"), 404).endswith(
        "not found")
    assert error(api.get("/api/v1/trials/999"), 404) == "trial 999 not found"
    assert error(api.get("/api/v1/trials/999/logs"), 404) == "trial 999 not found"


# --- job queue, agents, slots, pools, cluster ------------------------------------------------

PRIORITY = "resource_manager:\n  scheduler: {type: priority}\nresource_pools:\n  - name: default\n"


def test_job_queue_update_and_move_to_top(api: httpx.Client, ctx: Path, det,
                                          tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(PRIORITY)
    det("cluster", "config", "apply", str(tmp_path / "cluster.yaml"))
    exps = [create(api, ctx) for _ in range(3)]
    jobs = api.get("/api/v1/job-queue").json()["jobs"]
    assert [j["experiment_id"] for j in jobs] == exps
    assert all(j["status"] == "STATE_QUEUED" and j["reasons"] for j in jobs)
    assert any("no reconciler is running" in r for r in jobs[0]["reasons"])
    last = jobs[-1]["job_id"]
    moved = api.post(f"/api/v1/jobs/{last}/move-to-top").json()
    assert [j["job_id"] for j in moved["jobs"]][0] == last
    # at the head already: nothing moves
    again = api.post(f"/api/v1/jobs/{last}/move-to-top").json()
    assert [j["job_id"] for j in again["jobs"]] == [j["job_id"] for j in moved["jobs"]]
    first = jobs[0]["job_id"]
    assert api.patch(f"/api/v1/jobs/{first}", json={"priority": 10}).status_code == 200
    order = [j["job_id"] for j in api.get("/api/v1/job-queue").json()["jobs"]]
    assert order[0] == first
    assert error(api.patch(f"/api/v1/jobs/{first}", json={"priority": 0}), 400).startswith(
        "priority:")
    assert error(api.patch(f"/api/v1/jobs/{first}", json={"weight": 2}), 400).startswith(
        f"job {first}: weight applies only under the fair_share scheduler")
    assert error(api.patch("/api/v1/jobs/999", json={"priority": 3}), 404) == "job 999 not found"
    # a batch applies all or none
    r = api.post("/api/v1/job-queue/update-batch", json={"changes": [
        {"job_id": jobs[1]["job_id"], "field": "priority", "value": 1},
        {"job_id": 999, "field": "priority", "value": 1}]})
    assert error(r, 404) == "job 999 not found"
    assert api.get("/api/v1/job-queue").json()["jobs"][0]["job_id"] == first
    r = api.post("/api/v1/job-queue/update-batch", json={"changes": [
        {"job_id": jobs[1]["job_id"], "field": "priority", "value": 1}]})
    assert r.json() == {"applied": 1}
    assert api.get("/api/v1/job-queue").json()["jobs"][0]["job_id"] == jobs[1]["job_id"]
    assert error(api.post("/api/v1/jobs/999/move-to-top"), 404) == "job 999 not found"
    api.post(f"/api/v1/experiments/{exps[0]}/kill")
    det("reconcile", "--once")
    assert error(api.post(f"/api/v1/jobs/{first}/move-to-top"), 409) == \
        f"job {first} has ended: it is no longer queued"


def test_agents_slots_pools_and_cluster(api: httpx.Client, conn) -> None:
    conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}, {"slot_id": 1, "type": "cpu"}]),))
    agents = api.get("/api/v1/agents").json()["agents"]
    assert [(a["id"], a["state"], a["slots"], a["used"]) for a in agents] == \
        [("a1", "ACTIVE", 2, 0)]
    assert api.post("/api/v1/agents/a1/disable").json() == {"id": "a1", "state": "DISABLED"}
    assert api.post("/api/v1/agents/a1/enable").json()["state"] == "ACTIVE"
    assert error(api.post("/api/v1/agents/a1/explode"), 400).startswith("action:")
    assert api.post("/api/v1/agents/nope/disable").status_code == 404
    assert api.post("/api/v1/agents/a1/slots/1/disable").json()["enabled"] is False
    slots = api.get("/api/v1/slots", params={"agent_id": "a1"}).json()["slots"]
    assert [(s["slot_id"], s["enabled"]) for s in slots] == [(0, True), (1, False)]
    assert api.post("/api/v1/agents/a1/slots/7/disable").status_code == 404
    pools = api.get("/api/v1/resource-pools").json()["resource_pools"]
    assert [(p["name"], p["agents"], p["slots_total"]) for p in pools] == [("default", 1, 1)]
    cluster = api.get("/api/v1/cluster").json()
    assert cluster["effective"]["default"]["type"] == "fair_share"
    assert cluster["leader"] is None


# --- event streams -----------------------------------------------------------------------------


class Events:
    """Reads an SSE stream in a thread; ``wait(event, pred)`` waits for a matching event."""

    def __init__(self, server: Server, path: str) -> None:
        self.events: list[tuple[str, object, float]] = []
        self.cv = threading.Condition()
        self.client = httpx.Client(base_url=server.url, timeout=None,
                                   headers={"Authorization": f"Bearer {server.token}"})
        self.thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self.thread.start()

    def _read(self, path: str) -> None:
        try:
            with self.client.stream("GET", path) as r:
                name = None
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: "):
                        with self.cv:
                            self.events.append((name, json.loads(line[6:]), time.monotonic()))
                            self.cv.notify_all()
        except httpx.HTTPError:
            pass

    def wait(self, name: str, pred=lambda d: True, timeout: float = 15.0):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for n, d, at in self.events:
                    if n == name and pred(d):
                        return d, at
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {name} event; got {self.events}")
                self.cv.wait(left)

    def close(self) -> None:
        self.client.close()


def test_experiment_stream_sends_state_and_new_metrics(server: Server, api, ctx, conn) -> None:
    exp = create(api, ctx)
    trial, token = running_trial(conn, exp)
    events = Events(server, f"/api/v1/events/experiments/{exp}")
    try:
        ready, _ = events.wait("ready")
        events.wait("experiment", lambda d: d["state"] == "ACTIVE" and len(d["trials"]) == 1)
        # the server takes its lease on events within a tick of its first stream
        deadline = time.monotonic() + 5
        while not conn.execute("SELECT det_internal.web_watched() AS w").fetchone()["w"]:
            assert time.monotonic() < deadline, "det serve took no lease on det_web events"
            time.sleep(0.05)
        sent = time.monotonic()
        conn.execute("SELECT det_task.report_metrics(%s, 'training', 10, %s)",
                     (token, Jsonb({"loss": 0.5})))
        rows, at = events.wait("metrics")
        assert [(r["trial_id"], r["steps_completed"], r["values"]) for r in rows] == \
            [(trial, 10, {"loss": 0.5})]
        assert rows[0]["id"] > ready["metrics_after"]
        assert at - sent < 1.5
        api.post(f"/api/v1/experiments/{exp}/pause")
        events.wait("experiment", lambda d: d["state"] == "PAUSED")
    finally:
        events.close()


def test_trial_stream_tails_logs(server: Server, api, ctx, conn) -> None:
    exp = create(api, ctx)
    trial, _ = running_trial(conn, exp)
    alloc = conn.execute("SELECT id FROM allocations WHERE trial_id = %s", (trial,)).fetchone()
    events = Events(server, f"/api/v1/events/trials/{trial}")
    try:
        events.wait("ready")
        conn.execute("SELECT det_agent.append_logs(%s, %s, %s)",
                     (alloc["id"], ["stdout"], ["hello"]))
        lines, _ = events.wait("logs")
        assert [x["line"] for x in lines] == ["hello"]
    finally:
        events.close()
    assert httpx.get(f"{server.url}/api/v1/events/trials/999",
                     headers={"Authorization": f"Bearer {server.token}"}).status_code == 404
    assert httpx.get(f"{server.url}/api/v1/events/job-queue").status_code == 401


def test_queue_and_cluster_streams(server: Server, api, ctx, conn) -> None:
    queue = Events(server, "/api/v1/events/job-queue")
    cluster = Events(server, "/api/v1/events/cluster")
    try:
        queue.wait("queue", lambda d: d["jobs"] == [])
        exp = create(api, ctx)
        queue.wait("queue", lambda d: [j["experiment_id"] for j in d["jobs"]] == [exp])
        cluster.wait("cluster", lambda d: d["agents"] == [])
        conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                     (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
        cluster.wait("cluster", lambda d: [a["id"] for a in d["agents"]] == ["a1"])
        api.post("/api/v1/agents/a1/disable")
        cluster.wait("cluster", lambda d: [a["state"] for a in d["agents"]] == ["DISABLED"])
    finally:
        queue.close()
        cluster.close()


def test_metrics_notify_sparingly(conn, db_url: str) -> None:
    """A trial reporting many batches a second wakes the servers a few times a second, not
    once per batch (web_event_marks); each NOTIFY is one statement's, never one per row."""
    exp = conn.execute("SELECT det_user.create_experiment(%s, '', NULL) AS id", (Jsonb({
        "name": "x", "resources": {"slots_per_trial": 1, "resource_pool": "default",
                                   "weight": 1.0},
        "searcher": {"name": "single", "metric": "loss", "smaller_is_better": True}}),)
    ).fetchone()["id"]
    _, token = running_trial(conn, exp)
    conn.execute("SELECT det_web.watch('test', 60)")
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as listener:
        channels.listen(listener, channels.WEB)
        start = time.monotonic()
        for step in range(200):
            conn.execute("SELECT det_task.report_metrics_batch(%s, NULL, NULL, %s, %s, %s)",
                         (token, ["training"] * 50, list(range(step * 50, step * 50 + 50)),
                          [Jsonb({"loss": 1.0})] * 50))
        elapsed = time.monotonic() - start
        got = [n.payload for n in listener.notifies(timeout=0.5)]
    metric_events = [p for p in got if "trial:" in p]
    assert 1 <= len(metric_events) <= elapsed / 0.2 + 2, (len(metric_events), elapsed)


def test_events_only_while_a_server_watches(conn, db_url: str) -> None:
    """The det_web triggers send nothing while no det serve holds a lease (issue 11: ~1 ms of
    PostgreSQL time a trivial task went to events no page read); while one does they name
    what changed; a lease ended or run out stops them again."""
    config = Jsonb({"name": "x",
                    "resources": {"slots_per_trial": 1, "resource_pool": "default", "weight": 1.0},
                    "searcher": {"name": "single", "metric": "loss", "smaller_is_better": True}})

    def events_of_a_submission() -> list[str]:
        with psycopg.connect(db_url, autocommit=True) as listener:
            channels.listen(listener, channels.WEB)
            exp = conn.execute("SELECT det_user.create_experiment(%s, '', NULL) AS id",
                               (config,)).fetchone()["id"]
            return [n.payload for n in listener.notifies(timeout=0.3)
                    if f"experiment:{exp}" in n.payload.split()]

    assert events_of_a_submission() == []
    conn.execute("SELECT det_web.watch('server-a', 60)")
    assert len(events_of_a_submission()) == 1
    conn.execute("SELECT det_web.watch('server-a', 0)")
    assert events_of_a_submission() == []
    conn.execute("SELECT det_web.watch('server-b', 0.2)")
    time.sleep(0.3)
    assert events_of_a_submission() == []


def test_progress_counts_batches_before_any_validation(api, ctx: Path, conn, det) -> None:
    """A single-trial experiment's progress moves with the batches its training metrics
    report, before any validation or checkpoint (issue 15); the CLI shows the same figure."""
    conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    exp = create(api, ctx)  # max_length: 100 batches
    det("reconcile", "--once")
    alloc = conn.execute("SELECT id FROM allocations WHERE state = 'ASSIGNED'").fetchone()["id"]
    token = conn.execute("SELECT det_agent.claim('a1', %s) AS t", (alloc,)).fetchone()["t"]
    conn.execute("SELECT det_task.info(%s)", (token,))
    assert api.get(f"/api/v1/experiments/{exp}").json()["progress"] == 0
    conn.execute("SELECT det_task.report_metrics(%s, 'training', 50, %s)",
                 (token, Jsonb({"loss": 1})))
    assert api.get(f"/api/v1/experiments/{exp}").json()["progress"] == 0.5
    assert api.get("/api/v1/experiments").json()["experiments"][0]["progress"] == 50
    listed = json.loads(det("experiment", "list", "--json").stdout)
    assert listed[0]["progress"] == 50
    trials = api.get(f"/api/v1/experiments/{exp}").json()["trials"]
    assert [t["batches"] for t in trials] == [50]


def test_preview_search(api) -> None:
    asha = CONFIG.replace("searcher: {name: single, metric: loss, max_length: {batches: 100}}",
                          "searcher: {name: adaptive_asha, metric: loss, max_trials: 4, "
                          "max_length: {batches: 100}}")
    plan = api.post("/api/v1/preview-search", json={"config": asha}).json()
    assert plan["searcher"] == "adaptive_asha" and plan["trials"] == 4 and plan["rungs"]
    single = api.post("/api/v1/preview-search", json={"config": CONFIG}).json()
    assert single == {"searcher": "single", "unit": "batches", "trials": 1, "units": 100,
                      "plan": [{"trials": 1, "length": 100, "units": 100}]}
    bad = api.post("/api/v1/preview-search", json={"config": "name: x\n"})
    assert error(bad, 400).startswith("config: ")


def test_the_server_rides_out_a_database_restart(private_pg, tmp_path: Path) -> None:
    """Requests and event streams carry on after the database restarts (the pool replaces
    dropped connections; the listener reconnects and re-LISTENs)."""
    env = {**os.environ, "DET_DB_URL": private_pg.url, "DET_HOME": str(tmp_path / "home"),
           "DET_USER": "tester", "PYTHONUNBUFFERED": "1"}
    server = Server(env, tmp_path)
    events = Events(server, "/api/v1/events/cluster")
    try:
        events.wait("cluster", lambda d: d["agents"] == [])
        private_pg.restart()
        assert server.client.get("/api/v1/agents").json() == {"agents": []}
        with psycopg.connect(private_pg.url, autocommit=True) as c:
            c.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                      (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
        events.wait("cluster", lambda d: [a["id"] for a in d["agents"]] == ["a1"], timeout=30)
    finally:
        events.close()
        server.stop()


def test_two_servers_behave_as_one(det_env, tmp_path: Path, ctx: Path) -> None:
    """Stateless servers: a token from one works on the other, and a change made through one
    reaches the other's event streams (through the database, nothing else)."""
    a, b = Server(det_env, tmp_path), Server(det_env, tmp_path)
    try:
        with httpx.Client(base_url=b.url, timeout=30,
                          headers={"Authorization": f"Bearer {a.token}"}) as b_with_a_token:
            assert b_with_a_token.get("/api/v1/me").json() == {"username": a.user}
        events = Events(b, "/api/v1/events/job-queue")
        try:
            events.wait("queue", lambda d: d["jobs"] == [])
            exp = create(a.client, ctx)
            events.wait("queue", lambda d: [j["experiment_id"] for j in d["jobs"]] == [exp])
        finally:
            events.close()
        assert b.client.post(f"/api/v1/experiments/{exp}/pause").json()["state"] == "PAUSED"
        assert a.client.get(f"/api/v1/experiments/{exp}").json()["state"] == "PAUSED"
    finally:
        a.stop()
        b.stop()


def test_the_api_runs_as_the_logged_in_user(server: Server, api, ctx: Path, conn) -> None:
    """Row-level security applies to the API as to psql: a request runs as its user's role."""
    conn.execute("SELECT det_user.workspace_create('vision', NULL, NULL, NULL)")
    conn.execute("SELECT det_user.project_create('vision', 'p', '')")
    for name in ("vic", "olga"):
        conn.execute("SELECT det_user.user_create(%s, %s, false)",
                     (name, password_verifier(conn, name, "pw of " + name)))
    conn.execute("SELECT det_user.role_assign('Viewer', 'vic', NULL, 'vision', true)")
    exp = conn.execute("SELECT det_user.create_experiment(%s, '', NULL, 'vision', 'p') AS id",
                       (Jsonb({"name": "theirs", "entrypoint": "true", "resources": {
                           "slots_per_trial": 1, "resource_pool": "default", "weight": 1.0},
                           "searcher": {"name": "single", "metric": "loss",
                                        "max_length": {"batches": 1}}}),)).fetchone()["id"]

    def client(name: str) -> httpx.Client:
        r = httpx.post(f"{server.url}/api/v1/auth/login",
                       json={"username": name, "password": "pw of " + name})
        return httpx.Client(base_url=server.url, timeout=30,
                            headers={"Authorization": f"Bearer {r.json()['token']}"})

    with client("vic") as vic, client("olga") as olga:
        assert [e["id"] for e in vic.get("/api/v1/experiments").json()["experiments"]] == [exp]
        assert error(vic.post(f"/api/v1/experiments/{exp}/pause"), 403) == (
            f"permission denied: needs Editor on workspace 'vision' to pause experiment {exp}")
        assert olga.get("/api/v1/experiments").json()["experiments"] == []
        assert error(olga.get(f"/api/v1/experiments/{exp}"), 404) == f"experiment {exp} not found"
        assert error(olga.post(f"/api/v1/experiments/{exp}/kill"), 404).startswith("cannot kill")
        assert olga.get("/api/v1/me").json() == {"username": "olga"}
        conn.execute("SELECT det_user.user_set_active('olga', false)")
        assert olga.get("/api/v1/me").status_code == 401
