"""det serve's perimeter (issue 32, "Request limits" and "Browser protections"), against a real
``det serve`` process and database: body caps (413) enforced before a body is read, NUL and
out-of-range numbers refused as bad input, cross-site requests refused (CSRF), security
headers on every answer, the API docs served from det's own files, TLS with
``--certfile/--keyfile``, and a schemathesis run over every operation of the OpenAPI document
that finds no 5xx, anonymous or logged in."""

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from test_api import CONFIG, REPO, Server, create, error, free_port, packed
from test_webui import browser, click, text, wait_for  # noqa: F401 (a fixture)

from det.api.perimeter import MAX_BODY, MAX_UPLOAD_BODY
from det.cli.users import password_verifier
from det.context import MAX_CONTEXT_BYTES

EXAMPLES = int(os.environ.get("DET_SCHEMATHESIS_EXAMPLES", 6))
"""Examples per operation, generation mode and caller (more for a deliberate hunt)."""


@pytest.fixture
def server(det_env: dict[str, str], tmp_path: Path):
    s = Server(det_env, tmp_path)
    yield s
    s.stop()


def raw_request(server: Server, head: str, body: bytes = b"") -> tuple[int, dict, bytes]:
    """Send ``head`` (request line and headers, no blank line) and ``body`` on a plain socket;
    the answer's status, headers and body, read until the server closes or 10 s pass."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        top, _, rest = data.partition(b"\r\n\r\n")
        lines = top.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        need = int(headers.get("content-length", 0))
        while len(rest) < need:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return int(lines[0].split()[1]), headers, rest


# --- body caps --------------------------------------------------------------------------------


def test_body_caps_fit_the_largest_upload() -> None:
    # a 95 MiB context as base64 (4/3), beside a 1 MiB config JSON-escaped (6 bytes a char)
    assert MAX_UPLOAD_BODY > MAX_CONTEXT_BYTES * 4 / 3 + 6 * 2**20
    assert MAX_BODY >= 6 * 2**20 + 2**20


def test_an_oversize_body_is_413_before_it_is_read(server: Server) -> None:
    # Content-Length over the upload cap, no token, and no byte of the body sent: the answer
    # comes at once, so the server never waited for (or held) the body.
    start = time.monotonic()
    status, headers, body = raw_request(
        server, f"POST /api/v1/experiments HTTP/1.1\nHost: 127.0.0.1\n"
                f"Content-Type: application/json\nContent-Length: {MAX_UPLOAD_BODY + 1}")
    assert status == 413, body
    assert "request body: more than" in json.loads(body)["error"]
    assert time.monotonic() - start < 5
    # every other route: 8 MiB
    status, _, body = raw_request(
        server, f"POST /api/v1/auth/login HTTP/1.1\nHost: 127.0.0.1\n"
                f"Content-Type: application/json\nContent-Length: {MAX_BODY + 1}")
    assert status == 413, body


def chunked(total: int, piece: int = 2**20):
    """A body of ``total`` blanks in pieces: httpx sends it chunked, with no Content-Length."""
    for start in range(0, total, piece):
        yield b" " * min(piece, total - start)


def test_a_streamed_body_is_cut_off_at_the_cap(server: Server) -> None:
    # No Content-Length (chunked): the bytes are counted as they arrive.
    r = httpx.post(f"{server.url}/api/v1/auth/login", content=chunked(MAX_BODY + 2**20),
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert error(r, 413).startswith("request body: more than 8388608 bytes")


def test_a_large_upload_without_a_live_token_is_refused_unread(server: Server) -> None:
    """The issue's 60 MB JSON body with no token: refused after at most 8 MiB, and det serve's
    memory does not grow by the body's size."""
    proc = psutil.Process(server.proc.pid)
    before = proc.memory_info().rss
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        r = httpx.post(f"{server.url}/api/v1/experiments", content=chunked(60 * 10**6),
                       headers={"Content-Type": "application/json", **headers}, timeout=60)
        assert r.status_code == 401, r.text
    assert proc.memory_info().rss - before < 30 * 2**20
    # with a Content-Length, refused before a byte is read
    status, _, body = raw_request(
        server, "POST /api/v1/experiments HTTP/1.1\nHost: 127.0.0.1\n"
                f"Content-Type: application/json\nContent-Length: {60 * 10**6}")
    assert status == 401, body
    assert json.loads(body)["error"].startswith("not logged in")


def test_a_large_upload_with_a_live_token_is_read(server: Server, ctx: Path) -> None:
    (ctx / "weights.bin").write_bytes(os.urandom(9 * 2**20))  # incompressible
    body = json.dumps({"config": CONFIG, "context": packed(ctx)})
    assert len(body) > MAX_BODY
    r = server.client.post("/api/v1/experiments", content=body,
                           headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text


# --- NUL and numbers ------------------------------------------------------------------------


def test_nul_in_the_path_or_query_is_400(server: Server) -> None:
    api = server.client
    assert error(api.get("/api/v1/experiments/1%00"), 400) == "path: NUL bytes are not allowed"
    assert error(api.get("/api/v1/experiments", params={"name": "a\x00b"}), 400) \
        == "query: NUL bytes are not allowed"
    assert error(api.get("/api/v1/agents/a%00b"), 400).startswith("path: NUL")


def test_nul_in_a_body_is_400(server: Server) -> None:
    # PostgreSQL text cannot hold NUL: psycopg refuses to send it (DataError), or a login
    # connection cannot name such a user.
    r = httpx.post(f"{server.url}/api/v1/auth/login", json={"username": "a\x00b",
                                                             "password": "secret"})
    assert r.status_code in (400, 401), r.text
    r = server.client.post("/api/v1/job-queue/update-batch",
                           json={"changes": [{"job_id": 1, "field": "priority",
                                              "value": "4\x00"}]})
    assert r.status_code in (400, 404), r.text
    r = server.client.put("/api/v1/experiments/1/archived", json={"archived": True})
    assert r.status_code == 404, r.text


def test_out_of_range_numbers_are_bad_input(server: Server) -> None:
    api = server.client
    for path in ("/api/v1/experiments/9223372036854775808", "/api/v1/trials/-99999999999999999999",
                 "/api/v1/experiments/99999999999999999999/metrics"):
        r = api.get(path)
        assert r.status_code in (400, 404), (path, r.status_code, r.text)
    r = api.get("/api/v1/experiments", params={"offset": 10**30})
    assert r.status_code == 400, r.text
    r = api.post("/api/v1/jobs/99999999999999999999/move-to-top")
    assert r.status_code in (400, 404), r.text


def test_bad_submissions_are_400_not_500(server: Server, ctx: Path) -> None:
    """What schemathesis found as 500s: a context of non-ASCII "base64", and half a placement
    (ConfigError was called with one argument)."""
    api = server.client
    r = api.post("/api/v1/experiments", json={"config": CONFIG, "context": "é"})
    assert error(r, 400).startswith("context: expected base64 of a tar.gz")
    r = api.post("/api/v1/experiments", json={"config": CONFIG + "workspace: w\n",
                                              "context": packed(ctx)})
    assert error(r, 400) == ("config: workspace and project: give both or neither "
                             "(neither: Uncategorized)")
    r = api.post("/api/v1/experiments", json={"config": CONFIG, "context": packed(ctx),
                                              "workspace": "w"})
    assert error(r, 400) == ("--workspace and --project: give both or neither "
                             "(neither: Uncategorized)")
    r = api.post("/api/v1/experiments", json={"config": CONFIG, "context": packed(ctx),
                                              "workspace": "w", "project": "p",
                                              "project_id": 1})
    assert error(r, 400) == "--project_id: give it, or --workspace and --project, not both"


# --- browser protections ------------------------------------------------------------------


def log_in_by_cookie(client: httpx.Client, server: Server) -> None:
    """Log ``client`` in as the WebUI does: it then holds the cookie, and no Authorization."""
    r = client.post("/api/v1/auth/login",
                    json={"username": server.user, "password": server.password})
    assert r.status_code == 200 and "det_token" in client.cookies


def test_a_cross_site_post_with_the_cookie_is_refused(server: Server, ctx: Path,
                                                      conn) -> None:
    exp = create(server.client, ctx)
    state = lambda: conn.execute("SELECT state::text AS s FROM experiments WHERE id = %s",  # noqa: E731
                                 (exp,)).fetchone()["s"]
    with httpx.Client(base_url=server.url, timeout=30) as b:
        log_in_by_cookie(b, server)
        evil = {"Origin": "http://evil.example", "X-Det-Request": "1"}
        assert error(b.post(f"/api/v1/experiments/{exp}/pause", headers=evil), 403) \
            .startswith("cross-site request refused: Origin 'http://evil.example'")
        # a form post of another site can send neither the header nor our Origin
        r = b.post(f"/api/v1/experiments/{exp}/kill",
                   headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        r = b.post(f"/api/v1/experiments/{exp}/kill", headers={"Referer": "http://evil.example/x"})
        assert r.status_code == 403
        assert error(b.post(f"/api/v1/experiments/{exp}/kill"), 403).endswith(
            "carry Origin or Referer; this one has neither")
        # det's own origin without the header (a same-site form): refused too
        own = server.url
        assert error(b.post(f"/api/v1/experiments/{exp}/pause", headers={"Origin": own}), 403) \
            .endswith("the header 'X-Det-Request: 1' is missing")
        assert error(b.put(f"/api/v1/experiments/{exp}/archived", json={"archived": True},
                           headers={"Origin": "null", "X-Det-Request": "1"}), 403)
        assert error(b.patch(f"/api/v1/experiments/{exp}", json={"priority": 10},
                             headers=evil), 403)
        assert error(b.post("/api/v1/agents/a1/disable", headers=evil), 403)
        assert error(b.post("/api/v1/auth/logout", headers=evil), 403)
        assert state() == "ACTIVE"
        # reading is not refused (a cross-site page cannot read the answer anyway)
        assert b.get(f"/api/v1/experiments/{exp}", headers=evil).status_code == 200
        # det's own page: Origin (or Referer) of this server and the header
        ok = {"Origin": own, "X-Det-Request": "1"}
        r = b.post(f"/api/v1/experiments/{exp}/pause", headers=ok)
        assert r.status_code == 200 and r.json()["state"] == "PAUSED", r.text
        r = b.post(f"/api/v1/experiments/{exp}/activate",
                   headers={"Referer": f"{own}/ui/", "X-Det-Request": "1"})
        assert r.status_code == 200, r.text
    # a Bearer token (the CLI, scripts) is not sent by a browser on its own: it passes
    r = server.client.post(f"/api/v1/experiments/{exp}/pause", headers={"Origin": "http://x"})
    assert r.status_code == 200 and state() == "PAUSED", r.text


def test_every_answer_carries_the_security_headers(server: Server) -> None:
    for path in ("/ui/", "/api/v1/docs", "/api/v1/experiments", "/static/app.js",
                 "/api/v1/no-such-route", "/api/v1/experiments/1%00"):
        r = httpx.get(f"{server.url}{path}")
        csp = r.headers.get("content-security-policy", "")
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
        assert r.headers["x-frame-options"] == "DENY", path
        assert r.headers["x-content-type-options"] == "nosniff", path
        assert r.headers["referrer-policy"] == "same-origin", path


def test_pages_load_nothing_from_another_host(server: Server) -> None:
    docs = httpx.get(f"{server.url}/api/v1/docs")
    assert docs.status_code == 200
    for page in (docs.text, httpx.get(f"{server.url}/ui/").text):
        assert "http:" not in page and "https:" not in page and "//" not in page
        assert "<script>" not in page  # every script is a file: the CSP allows no inline one
    for name in ("swagger-ui/swagger-ui-bundle.js", "swagger-ui/swagger-ui.css", "docs.js"):
        assert httpx.get(f"{server.url}/static/{name}").status_code == 200, name
    for f in (REPO / "api" / "static").iterdir():
        if f.is_file() and f.suffix in (".html", ".js", ".css"):
            assert "cdn" not in f.read_text().lower(), f


def test_the_pages_work_under_the_csp_in_a_browser(browser, server: Server,  # noqa: F811
                                                  tmp_path: Path) -> None:
    """In headless Chromium: the docs page draws every operation from det's own files, the
    WebUI logs in and lists experiments (its fetches carry the CSRF header), and neither
    page makes the browser report a Content-Security-Policy violation."""
    from selenium.webdriver.common.by import By

    browser.get(f"{server.url}/api/v1/docs")
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".opblock")) >= 30, 30,
             "Swagger UI to draw the operations")
    browser.save_screenshot(str(tmp_path / "docs.png"))
    browser.get(f"{server.url}/ui/#/login")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#login"), 20, "the login form")
    browser.find_element(By.NAME, "username").send_keys(server.user)
    browser.find_element(By.NAME, "password").send_keys(server.password)
    click(browser, "#login button")
    wait_for(lambda: server.user in text(browser, "#user"), 20, "the logged-in user")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#exps"), 20, "the list")
    click(browser, "#logout")  # a cookie-authenticated POST: it must pass the CSRF check
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#login"), 20, "logged out")
    log = [e["message"] for e in browser.get_log("browser")]
    # "status of 403", not "403": the server's port may hold those digits (…:50403/favicon.ico)
    assert not [m for m in log if "Content Security Policy" in m or "status of 403" in m], log


# --- TLS ------------------------------------------------------------------------------------


def test_serve_over_tls_sets_a_secure_cookie(det_env: dict[str, str], tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "det.cli.main", "serve", "--port", str(port),
             "--certfile", str(cert), "--keyfile", str(key)],
            cwd=REPO, env=det_env, stdout=out, stderr=subprocess.STDOUT)
    tls = ssl.create_default_context(cafile=str(cert))
    try:
        url = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"{url}/api/v1/openapi.json", verify=tls, timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        assert r.status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/api/v1/openapi.json", timeout=5)
        # the login's cookie is Secure: a browser sends it back over TLS only
        r = httpx.post(f"{url}/api/v1/auth/login", verify=tls,
                       json={"username": "nobody", "password": "wrong password"})
        assert r.status_code == 401
        with psycopg.connect(det_env["DET_DB_URL"], autocommit=True) as c:
            c.execute("SELECT det_user.user_create('tls', %s, false)",
                      (password_verifier(c, "tls", "tls password"),))
        r = httpx.post(f"{url}/api/v1/auth/login", verify=tls,
                       json={"username": "tls", "password": "tls password"})
        assert r.status_code == 200, r.text
        cookie = r.headers["set-cookie"].lower()
        assert "det_token=" in cookie and "; secure" in cookie, cookie
    finally:
        proc.terminate()
        proc.wait(20)


def test_serve_needs_both_certfile_and_keyfile(det_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("")
    r = subprocess.run([sys.executable, "-m", "det.cli.main", "serve", "--certfile",
                        str(tmp_path / "c.pem")], cwd=REPO, env=det_env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "--certfile and --keyfile: give both or neither" in r.stderr, r.stderr


# --- schemathesis ---------------------------------------------------------------------------


def probe(server: Server, op, mode: GenerationMode, exp: int, failures: list[str]) -> int:
    """Call ``op`` with EXAMPLES generated cases of ``mode``, each anonymous and logged in;
    every 5xx is added to ``failures`` (with the curl command that reproduces it). Returns
    the number of calls."""
    callers = {"anonymous": {}, "logged in": {"Authorization": f"Bearer {server.token}"}}
    calls = 0

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case) -> None:
        nonlocal calls
        if "exp_id" in (case.path_parameters or {}) and calls % 4 == 0:
            case.path_parameters["exp_id"] = exp  # some ids name a real experiment
        for who, headers in callers.items():
            r = case.call(base_url=server.url, headers=headers, timeout=30)
            calls += 1
            if r.status_code >= 500:
                failures.append(f"{who} {op.method.upper()} {op.path}: {r.status_code} "
                                f"{r.text[:200]} <- {case.as_curl_command()[:300]}")

    try:
        run()
    except Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE  # an operation without input has no bad input
    return calls


def test_no_operation_answers_5xx(server: Server, ctx: Path) -> None:
    """Every operation of /api/v1/openapi.json, with data that fits its schema and data that
    does not, anonymous and logged in: no answer is a 5xx (the issue found 202 of 8,180)."""
    exp = create(server.client, ctx)
    schema = schemathesis.openapi.from_url(f"{server.url}/api/v1/openapi.json")
    schema.config.max_stream_events = 1  # an event stream never ends: its first event will do
    # The auth routes last: logging out ends the token the other operations use.
    ops = sorted((r.ok() for r in schema.get_all_operations()),
                 key=lambda op: (op.path.startswith("/api/v1/auth"), op.path, op.method))
    assert len(ops) >= 30
    failures: list[str] = []
    calls = sum(probe(server, op, mode, exp, failures)
                for op in ops for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE))
    assert calls > 300
    assert not failures, "\n".join(failures)
