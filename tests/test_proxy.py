"""det serve's proxy to interactive tasks (``/proxy/<job>/``, det.api.proxy; issue 33), against
a real HTTP + WebSocket server started here (uvicorn, in a thread) standing in for the task's
JupyterLab, and real task rows: a notebook submitted through the API, its run made RUNNING
with its ``allocations.address`` set to that server, as the task's agent would.

What each test injects: no login, a user of another workspace and a Viewer (RLS and roles);
a browser cookie and bearer token that must not reach the task, a task that sets det's
cookie and writes its Jupyter token into its page; a body that must stream both ways
(the task answers its first chunk only, until the test has read it); WebSocket frames both
ways and close codes from each side; another site's Origin; an ended, a waiting and a dead
task.
"""

import asyncio
import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import uvicorn
import websockets
import websockets.sync.client as ws_client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from test_api import Server, free_port

from det.api.proxy import GRANT_TTL_S
from det.cli.users import password_verifier


class TaskServer:
    """The stand-in for a task's web server: answers under ``/proxy/<job>/`` only with the
    task's Jupyter token (``Authorization: token ...``), and records what reached it."""

    def __init__(self) -> None:
        self.token = ""
        self.seen: list[dict] = []  # each request's method, path, headers
        self.ws_closes: list[int] = []  # close codes the browser's side sent
        self.release = threading.Event()  # lets /stream send its second half
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        app = Starlette(routes=[
            Route("/proxy/{job}/echo", self.echo, methods=["GET", "POST", "PUT", "DELETE"]),
            Route("/proxy/{job}/stream", self.stream),
            Route("/proxy/{job}/lab", self.page),
            WebSocketRoute("/proxy/{job}/ws", self.ws),
        ])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the task's server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def _authorised(self, headers) -> bool:
        return headers.get("authorization") == f"token {self.token}"

    async def echo(self, request: Request):
        body = await request.body()
        self.seen.append({"method": request.method, "path": request.url.path,
                          "query": request.url.query, "headers": dict(request.headers)})
        if not self._authorised(request.headers):
            return JSONResponse({"error": "no token"}, status_code=403)
        response = JSONResponse({"method": request.method, "bytes": len(body),
                                 "sha256": hashlib.sha256(body).hexdigest()})
        response.set_cookie("_xsrf", "xsrf-value", path=request.url.path)
        response.set_cookie("username-127-0-0-1", "jupyter-login", httponly=True)
        response.set_cookie("det_token", "planted")
        return response

    async def stream(self, request: Request):
        async def body():
            yield b"a" * 65536
            # The second half waits until the test has read the first through det serve.
            while not self.release.is_set():
                await asyncio.sleep(0.02)
            yield b"b" * 65536

        return StreamingResponse(body(), media_type="application/octet-stream")

    async def page(self, request: Request):
        if not self._authorised(request.headers):
            return JSONResponse({"error": "no token"}, status_code=403)
        token = self.token.encode()

        async def body():
            # JupyterLab's page config carries the token; here it is split across chunks.
            yield b'<html><script id="jupyter-config-data">{"token": "' + token[:7]
            yield token[7:] + b'", "x": 1}</script>' + b"." * 5000 + token + b"</html>"

        return StreamingResponse(body(), media_type="text/html; charset=UTF-8")

    async def ws(self, websocket: WebSocket):
        if not self._authorised(websocket.headers):
            await websocket.close(1008)
            return
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=offered[0] if offered else None)
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    self.ws_closes.append(message.get("code", 0))
                    return
                if message.get("text") is not None:
                    text = message["text"]
                    if text.startswith("close:"):
                        await websocket.close(int(text[6:]), "bye")
                        return
                    await websocket.send_text(f"echo {text}")
                else:
                    await websocket.send_bytes(message["bytes"][::-1])
        except WebSocketDisconnect as e:
            self.ws_closes.append(e.code)


@pytest.fixture
def task_server() -> Iterator[TaskServer]:
    s = TaskServer()
    yield s
    s.stop()


@pytest.fixture
def serve(det_env, tmp_path: Path) -> Iterator[Server]:
    s = Server(det_env, tmp_path)
    yield s
    s.stop()


def start_notebook(server: Server, conn: psycopg.Connection, address: str | None,
                   state: str = "RUNNING", workspace: str | None = None,
                   project: str | None = None) -> tuple[int, str]:
    """A notebook submitted through the API, its run moved to ``state`` with its server at
    ``address`` (what the task's agent and det_task.ready record); returns (job id, its
    Jupyter token)."""
    r = server.client.post("/api/v1/notebooks", json={
        "force": True, "workspace": workspace, "project": project,
        "overrides": ["resources.slots=0"]})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    assert r.json()["url"] == f"/proxy/{job}/"
    conn.execute("INSERT INTO agents (id, hostname, resource_pool, runtime) "
                 "VALUES ('a1', 'host-1', 'default', 'process') ON CONFLICT DO NOTHING")
    conn.execute("UPDATE allocations SET state = %s, address = %s, ended_at = %s, "
                 "agent_id = CASE WHEN %s <> 'PENDING' THEN 'a1' END WHERE job_id = %s",
                 (state, address, "now" if state == "TERMINATED" else None, state, job))
    token = conn.execute("SELECT jupyter_token FROM task_secrets WHERE job_id = %s",
                         (job,)).fetchone()["jupyter_token"]
    return job, token


def login(server: Server, conn: psycopg.Connection, name: str) -> str:
    conn.execute("SELECT det_user.user_create(%s, %s, false)",
                 (name, password_verifier(conn, name, "pw of " + name)))
    r = httpx.post(f"{server.url}/api/v1/auth/login",
                   json={"username": name, "password": "pw of " + name})
    return r.json()["token"]


def test_only_a_login_that_may_open_the_task_reaches_it(serve, conn, task_server) -> None:
    conn.execute("SELECT det_user.workspace_create('vision', NULL, NULL, NULL)")
    conn.execute("SELECT det_user.project_create('vision', 'p', '')")
    job, task_server.token = start_notebook(serve, conn, task_server.address,
                                            workspace="vision", project="p")
    url = f"{serve.url}/proxy/{job}/echo"
    vic, olga = login(serve, conn, "vic"), login(serve, conn, "olga")
    conn.execute("SELECT det_user.role_assign('Viewer', 'vic', NULL, 'vision', true)")

    r = httpx.get(url)
    assert r.status_code == 401 and "not logged in" in r.json()["error"]
    assert httpx.get(url, headers={"Authorization": "Bearer forged"}).status_code == 401
    # no role in the workspace: the task does not exist for olga
    r = httpx.get(url, headers={"Authorization": f"Bearer {olga}"})
    assert r.status_code == 404 and r.json()["error"] == f"task {job}: not found"
    # a Viewer sees the notebook but may not open it: it runs code as its owner
    r = httpx.get(url, headers={"Authorization": f"Bearer {vic}"})
    assert r.status_code == 403 and f"open notebook {job}" in r.json()["error"]
    assert task_server.seen == []  # none of them reached the task
    with pytest.raises(websockets.InvalidStatus) as refused:
        ws_client.connect(f"ws://127.0.0.1:{serve.port}/proxy/{job}/ws",
                          additional_headers={"Authorization": f"Bearer {vic}"})
    assert refused.value.response.status_code == 403

    before = conn.execute("SELECT last_activity FROM tasks WHERE job_id = %s",
                          (job,)).fetchone()["last_activity"]
    time.sleep(5.1)  # det_user.task_open touches last_activity at most once per 5 s
    r = serve.client.get(url)
    assert r.status_code == 200, r.text
    after = conn.execute("SELECT last_activity FROM tasks WHERE job_id = %s",
                         (job,)).fetchone()["last_activity"]
    assert before is None or after > before  # proxied traffic counts as use


def test_a_role_taken_away_or_a_logout_closes_the_proxy_within_a_grant(
        serve, conn, task_server) -> None:
    """det_user.task_open's answer is reused for GRANT_TTL_S (det.api.proxy.Grants): a role taken
    away, or a logout, stops the next request once that has passed, HTTP and WebSocket."""
    conn.execute("SELECT det_user.workspace_create('vision', NULL, NULL, NULL)")
    conn.execute("SELECT det_user.project_create('vision', 'p', '')")
    job, task_server.token = start_notebook(serve, conn, task_server.address,
                                            workspace="vision", project="p")
    eve = login(serve, conn, "eve")
    conn.execute("SELECT det_user.role_assign('Editor', 'eve', NULL, 'vision', true)")
    url = f"{serve.url}/proxy/{job}/echo"
    headers = {"Authorization": f"Bearer {eve}"}
    assert httpx.get(url, headers=headers).status_code == 200
    conn.execute("SELECT det_user.role_assign('Editor', 'eve', NULL, 'vision', false)")
    time.sleep(GRANT_TTL_S + 0.2)
    assert httpx.get(url, headers=headers).status_code == 404
    with pytest.raises(websockets.InvalidStatus) as refused:
        ws_client.connect(f"ws://127.0.0.1:{serve.port}/proxy/{job}/ws",
                          additional_headers=headers)
    assert refused.value.response.status_code == 404

    assert serve.client.get(url).status_code == 200
    assert serve.client.post("/api/v1/auth/logout").status_code == 204
    time.sleep(GRANT_TTL_S + 0.2)
    assert serve.client.get(url).status_code == 401


def test_credentials_and_cookies_are_swapped_at_the_proxy(serve, conn, task_server) -> None:
    job, task_server.token = start_notebook(serve, conn, task_server.address)
    cookies = {"det_token": serve.token, "theme": "dark"}
    # The browser's way: det's cookie, from det's own page (Origin), no X-Det-Request (a
    # proxied page cannot add it), and a body.
    with httpx.Client(base_url=serve.url, cookies=cookies, timeout=30) as browser:
        r = browser.post(f"/proxy/{job}/echo?a=1&b=%2F", content=b"x" * 1000,
                         headers={"Origin": serve.url})
        assert r.status_code == 200, r.text
        assert r.json() == {"method": "POST", "bytes": 1000,
                            "sha256": hashlib.sha256(b"x" * 1000).hexdigest()}
        seen = task_server.seen[-1]
        assert seen["query"] == "a=1&b=%2F"
        assert seen["headers"]["authorization"] == f"token {task_server.token}"
        assert seen["headers"]["cookie"] == "theme=dark"  # never det's login
        assert serve.token not in str(seen["headers"])
        # a header's bytes that are not ASCII (a browser sends Latin-1 as it is) pass as bytes
        r = browser.get(f"/proxy/{job}/echo", headers={
            "X-Note": "café".encode("latin-1"),
            "Cookie": f"det_token={serve.token}; name=Zoë".encode("latin-1")})
        assert r.status_code == 200, r.text
        assert task_server.seen[-1]["headers"]["x-note"] == "café"
        assert task_server.seen[-1]["headers"]["cookie"] == "name=Zoë"
        r = browser.post(f"/proxy/{job}/echo", content=b"x" * 1000,
                         headers={"Origin": serve.url})
        # Only Jupyter's XSRF cookie comes back: not its login cookie, not a planted det_token
        set_cookies = r.headers.get_list("set-cookie")
        assert [c.split("=")[0] for c in set_cookies] == ["_xsrf"], set_cookies
        # proxied answers may be framed by det's own origin only, and carry no det CSP
        assert r.headers["x-frame-options"] == "SAMEORIGIN"
        assert r.headers["content-security-policy"] == "frame-ancestors 'self'"

        # another site's page posting with the user's cookie: refused before the task
        n = len(task_server.seen)
        r = browser.post(f"/proxy/{job}/echo", content=b"{}",
                         headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and "cross-site" in r.json()["error"]
        assert len(task_server.seen) == n

        # the Jupyter token in the page (even split across chunks) never reaches the browser
        r = browser.get(f"/proxy/{job}/lab")
        assert r.status_code == 200 and r.text.startswith("<html>")
        assert task_server.token not in r.text and r.text.endswith("</html>")
        assert '{"token": "", "x": 1}' in r.text


def test_bodies_stream_both_ways(serve, conn, task_server) -> None:
    job, task_server.token = start_notebook(serve, conn, task_server.address)
    # the answer: the first half arrives while the task still holds back the second
    with serve.client.stream("GET", f"/proxy/{job}/stream") as r:
        chunks = r.iter_bytes()
        got = b""
        while len(got) < 65536:
            got += next(chunks)
        assert not task_server.release.is_set()  # no buffering of the whole answer
        task_server.release.set()
        got += b"".join(chunks)
    assert got == b"a" * 65536 + b"b" * 65536

    # the request: 20 MiB, chunked (no length), the most JupyterLab sends in one upload
    blob = bytes(range(256)) * (20 * 4096)

    def pieces():
        for i in range(0, len(blob), 1 << 20):
            yield blob[i:i + (1 << 20)]

    r = serve.client.put(f"/proxy/{job}/echo", content=pieces())
    assert r.json() == {"method": "PUT", "bytes": len(blob),
                        "sha256": hashlib.sha256(blob).hexdigest()}


def test_websockets_relay_frames_and_close_codes(serve, conn, task_server) -> None:
    job, task_server.token = start_notebook(serve, conn, task_server.address)
    url = f"ws://127.0.0.1:{serve.port}/proxy/{job}/ws"
    auth = {"Authorization": f"Bearer {serve.token}"}
    with ws_client.connect(url, additional_headers=auth,
                           subprotocols=["v1.kernel.websocket.jupyter.org"]) as ws:
        assert ws.subprotocol == "v1.kernel.websocket.jupyter.org"  # the task's choice
        for i in range(20):
            ws.send(f"hello {i}")
            assert ws.recv(10) == f"echo hello {i}"
            ws.send(bytes([i, 0, 255]))
            assert ws.recv(10) == bytes([255, 0, i])
        ws.send("close:4001")  # the task's server closes with its own code
        with pytest.raises(websockets.ConnectionClosed):
            ws.recv(10)
    assert ws.close_code == 4001 and ws.close_reason == "bye"

    # the browser closes with its code: the task's server gets it
    with ws_client.connect(url, additional_headers=auth) as ws:
        ws.send("x")
        ws.recv(10)
        ws.close(4002, "tab closed")
    deadline = time.monotonic() + 10
    while 4002 not in task_server.ws_closes:
        assert time.monotonic() < deadline, task_server.ws_closes
        time.sleep(0.05)

    # a browser on another site with the user's cookie: refused before it reaches the task
    n = len(task_server.seen)
    for origin, status in (("https://evil.example", 403), (None, 401)):
        with pytest.raises(websockets.InvalidStatus) as refused:
            ws_client.connect(url, origin=origin,
                              additional_headers=None if origin is None else
                              {"Cookie": f"det_token={serve.token}"})
        assert refused.value.response.status_code == status
    # the page itself may
    with ws_client.connect(url, origin=f"http://127.0.0.1:{serve.port}",
                           additional_headers={"Cookie": f"det_token={serve.token}"}) as ws:
        ws.send("same origin")
        assert ws.recv(10) == "echo same origin"
    assert len(task_server.seen) == n


def test_a_task_not_running_answers_a_page_naming_its_state(serve, conn, task_server) -> None:
    waiting, _ = start_notebook(serve, conn, None, state="PENDING")
    r = serve.client.get(f"/proxy/{waiting}")  # relative links need the trailing slash
    assert r.status_code == 307 and r.headers["location"] == f"/proxy/{waiting}/"
    r = serve.client.get(f"/proxy/{waiting}/lab")
    assert r.status_code == 503 and "text/html" in r.headers["content-type"]
    assert f"Notebook {waiting} is PENDING" in r.text and 'http-equiv="refresh"' in r.text

    ended, _ = start_notebook(serve, conn, task_server.address, state="TERMINATED")
    conn.execute("UPDATE tasks SET end_reason = 'idle for 10m0s' WHERE job_id = %s", (ended,))
    r = serve.client.get(f"/proxy/{ended}/lab")
    assert r.status_code == 410
    assert f"Notebook {ended} is TERMINATED" in r.text and "idle for 10m0s" in r.text
    with pytest.raises(websockets.InvalidStatus) as refused:
        ws_client.connect(f"ws://127.0.0.1:{serve.port}/proxy/{ended}/ws",
                          additional_headers={"Authorization": f"Bearer {serve.token}"})
    assert refused.value.response.status_code == 410

    # a shell: its address is its sshd's, nothing a browser may be sent to
    r = serve.client.post("/api/v1/shells", json={"force": True})
    assert r.status_code == 201 and r.json()["url"] is None
    shell = r.json()["id"]
    conn.execute("UPDATE allocations SET state = 'RUNNING', agent_id = 'a1', address = %s "
                 "WHERE job_id = %s", (f"root@{task_server.address}", shell))
    r = serve.client.get(f"/proxy/{shell}/echo")
    assert r.status_code == 404 and r.json()["error"] == (
        f"shell {shell} has no web server to open (only notebooks and TensorBoards have one)")
    with pytest.raises(websockets.InvalidStatus) as refused:
        ws_client.connect(f"ws://127.0.0.1:{serve.port}/proxy/{shell}/ws",
                          additional_headers={"Authorization": f"Bearer {serve.token}"})
    assert refused.value.response.status_code == 404

    # running, but its server is gone (its port closed): a page, not a bare 502
    dead, _ = start_notebook(serve, conn, f"127.0.0.1:{free_port()}")
    r = serve.client.get(f"/proxy/{dead}/lab")
    assert r.status_code == 502 and "text/html" in r.headers["content-type"]
    assert f"Notebook {dead} is RUNNING" in r.text and "does not answer" in r.text
    assert task_server.seen == []


def test_the_tasks_api_starts_lists_kills_and_refuses_bad_input(serve, conn) -> None:
    api = serve.client
    conn.execute("SELECT det_user.workspace_create('vision', NULL, NULL, NULL)")
    conn.execute("SELECT det_user.project_create('vision', 'p', '')")
    r = api.post("/api/v1/notebooks", json={
        "config": "description: my lab\nidle_timeout: 10m\n", "overrides": ["resources.slots=0"],
        "workspace": "vision", "project": "p"})
    assert r.status_code == 201, r.text
    job = r.json()["id"]

    tasks = api.get("/api/v1/tasks").json()["tasks"]
    assert [(t["id"], t["kind"], t["description"], t["owner"], t["workspace"], t["url"])
            for t in tasks] == [(job, "NOTEBOOK", "my lab", serve.user, "vision",
                                 f"/proxy/{job}/")]
    task = api.get(f"/api/v1/tasks/{job}").json()
    assert task["config"]["idle_timeout"] == 600 and task["state"] == "PENDING"
    assert "jupyter_token" not in str(task)
    assert api.get("/api/v1/tasks/99999").status_code == 404

    # its output, by log id and as a tail
    run = conn.execute("SELECT id FROM allocations WHERE job_id = %s", (job,)).fetchone()["id"]
    for i in range(5):
        conn.execute("INSERT INTO task_logs (allocation_id, stream, line) "
                     "VALUES (%s, 'stdout', %s)", (run, f"line {i}"))
    logs = api.get(f"/api/v1/tasks/{job}/logs").json()["logs"]
    assert [x["line"] for x in logs] == [f"line {i}" for i in range(5)]
    after = api.get(f"/api/v1/tasks/{job}/logs", params={"after": logs[2]["id"]}).json()
    assert [x["line"] for x in after["logs"]] == ["line 3", "line 4"]
    tail = api.get(f"/api/v1/tasks/{job}/logs", params={"tail": 2}).json()
    assert [x["line"] for x in tail["logs"]] == ["line 3", "line 4"]

    # roles: a Viewer sees it but may not kill it; a user of no role there does not see it
    vic, olga = login(serve, conn, "vic"), login(serve, conn, "olga")
    conn.execute("SELECT det_user.role_assign('Viewer', 'vic', NULL, 'vision', true)")
    with httpx.Client(base_url=serve.url, headers={"Authorization": f"Bearer {vic}"}) as v:
        assert [t["id"] for t in v.get("/api/v1/tasks?all=true").json()["tasks"]] == [job]
        assert v.post(f"/api/v1/tasks/{job}/kill").status_code == 403
        assert v.post("/api/v1/notebooks", json={"workspace": "vision",
                                                  "project": "p"}).status_code == 403
    with httpx.Client(base_url=serve.url, headers={"Authorization": f"Bearer {olga}"}) as o:
        assert o.get("/api/v1/tasks?all=true").json()["tasks"] == []
        assert o.get(f"/api/v1/tasks/{job}").status_code == 404
        assert o.post(f"/api/v1/tasks/{job}/kill").status_code == 404

    r = api.post(f"/api/v1/tasks/{job}/kill")
    assert r.status_code == 200, r.text
    assert api.get(f"/api/v1/tasks/{job}").json()["end_reason"] == f"killed by {serve.user}"

    # bad input: one line naming the field (slots: an agent of one slot is the pool's largest)
    conn.execute("INSERT INTO agents (id, hostname, resource_pool, runtime) "
                 "VALUES ('a1', 'host-1', 'default', 'process')")
    conn.execute("INSERT INTO slots (agent_id, slot_id, type) VALUES ('a1', 0, 'cpu')")
    for path, body, status, says in [
        ("/api/v1/notebooks", {"config": "foo: 1"}, 400, "foo"),
        ("/api/v1/notebooks", {"config": "notebook_idle_type: sometimes"}, 400,
         "notebook_idle_type"),
        ("/api/v1/notebooks", {"overrides": ["resources.slots=64"]}, 400, "slots"),
        ("/api/v1/notebooks", {"template": "nope"}, 404, "nope"),
        ("/api/v1/notebooks", {"context": "not base64!"}, 400, "context"),
        ("/api/v1/commands", {"command": []}, 400, "command"),
        ("/api/v1/tensorboards", {}, 400, "experiment"),
        ("/api/v1/tensorboards", {"experiment_ids": [999]}, 404, "experiment 999"),
    ]:
        r = api.post(path, json=body)
        assert r.status_code == status and says in r.json()["error"], (path, body, r.text)
