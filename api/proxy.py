"""``/proxy/<job id>/...``: det serve's proxy to the web server inside an interactive task
(JupyterLab, TensorBoard), HTTP and WebSockets.

Every request, and every WebSocket before it is accepted, is authenticated like the API (the
WebUI's cookie or ``Authorization: Bearer``, :mod:`det.api.session`) and authorised by
``det_user.task_open(job)`` run as the user, so row-level security decides exactly as for psql:
no login 401, a task the user cannot see 404, one they see but may not open 403 (a notebook,
shell or command runs code as its owner: Editor; a TensorBoard: Viewer). ``det_user.task_open``
also touches the task's last_activity: proxied traffic counts as use for idle termination.
Its answer for one login token and task is reused for that token's requests to that task
during :data:`GRANT_TTL_S` (:class:`Grants`): JupyterLab loads a hundred files at once, and
one transaction each would cost more than the whole proxying.

The request goes to ``allocations.address`` of the task's run with its path unchanged (the
servers run under the prefix ``/proxy/<job id>/``). On the way:

* the user's det credentials (``Authorization``, the ``det_token`` cookie) are never sent to
  the task; Jupyter's per-task token goes instead (``Authorization: token ...``), so Jupyter
  authenticates every request by token (and so skips its own XSRF and origin checks, which
  det serve's perimeter has already made);
* Jupyter's token never reaches the browser: JupyterLab writes it into its page's config,
  so HTML answers are scrubbed of it (:func:`scrubbed`), and cookies the task sets are
  dropped but Jupyter's ``_xsrf`` (its login cookie would be a credential, and a task must
  not set det's cookie);
* bodies stream both ways (httpx); WebSocket frames, text and binary, are relayed both ways
  with their close codes (the ``websockets`` client upstream, Starlette's WebSocket here).

A task that is not running (waiting, starting, ended) answers an HTML page naming its state
and why it ended, not a bare 502. A WebSocket from another origin than det serve's own is
refused (browsers send ``Origin`` on every WebSocket; det serve's perimeter checks the
other requests, :mod:`det.api.perimeter`).
"""

import asyncio
import contextlib
import hashlib
import html
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio.to_thread
import httpx
import psycopg
import websockets
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection

from det.api.errors import error_response
from det.api.params import BigId
from det.api.session import COOKIE, act_as, request_token
from det.db.sqlstate import translate
from det.errors import DetError, NotFoundError, PermissionDeniedError
from det.sql import named

Q = named("api")

router = APIRouter(tags=["proxy"])

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"})
"""Headers of one connection, not of the message (RFC 9110 7.6.1): never relayed."""

NOT_FORWARDED = HOP_BY_HOP | {"host", "authorization", "cookie", "accept-encoding", "expect"}
"""Request headers the proxy sets itself (host: the task's; authorization: Jupyter's token
instead of the user's det token; cookie: without det's; accept-encoding: see
:func:`_request_headers`) or answers itself (expect: uvicorn sent the 100 Continue)."""

NOT_RETURNED = HOP_BY_HOP | {"set-cookie", "date", "server", "content-length"}
"""Response headers not relayed as they are (uvicorn writes its own date, server and length
or chunking; set-cookie: see :func:`_response_headers`)."""

TASK_COOKIES = frozenset({"_xsrf"})
"""Cookies a task may set in the browser: Jupyter's XSRF cookie, which JupyterLab echoes as a
header. Nothing else (Jupyter's login cookie would open the server without det)."""

WEB_KINDS = frozenset({"NOTEBOOK", "TENSORBOARD"})
"""Kinds of task with a web server to proxy (a shell's address is its sshd's; a command has
none)."""

ENDED = frozenset({"TERMINATING", "TERMINATED"})
"""Run states of a task that has ended or is ending (allocations.state)."""

RECHECK_S = 30.0
"""Seconds between re-authorisations of an open WebSocket while the user sends on it: a
revoked login or role closes it (code 1008) within this, and its traffic counts as use."""

GRANT_TTL_S = 1.0
"""Seconds det_user.task_open's answer is reused for the same login token and task: a logout, a
password changed, a role taken away or a task ended reaches the proxy within this. 1 s keeps
the proxy's overhead per request within the issue's 2 ms (bench/proxy.py: a transaction to
authorise costs 2 to 3 ms on a busy machine) and JupyterLab's page load to a few
transactions."""

UPSTREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=10.0)
"""Connect within 10 s; no read limit (a long download, or a slow cell's save, is the user's
business; a client that leaves ends the request)."""


@dataclass(frozen=True)
class Target:
    """What ``det_user.task_open`` said about a task the user may open."""

    job_id: int
    kind: str  # NOTEBOOK, TENSORBOARD, SHELL, COMMAND
    state: str  # the run's allocations.state
    address: str | None  # host:port once its server answers
    jupyter_token: str
    end_reason: str | None


def upstream_client() -> httpx.AsyncClient:
    """The one HTTP client of a det serve process towards tasks (its pool of connections);
    environment proxies are ignored: tasks are reached directly."""
    return httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT, trust_env=False, follow_redirects=False,
                             limits=httpx.Limits(max_connections=None,
                                                 max_keepalive_connections=64))


def open_task(pool, token: str, job_id: int) -> Target:
    """``det_user.task_open(job_id)`` as the token's user, in a transaction of its own (blocking:
    run it in a thread).

    Raises:
        AuthError: no valid login (401).
        NotFoundError: no such task, or one the user cannot see, or one without a web server
            (404).
        PermissionDeniedError: one the user sees but may not open (403).
    """
    try:
        with pool.connection() as conn, conn.transaction():
            act_as(conn, token)
            row = conn.execute(Q.task_open, (job_id,)).fetchone()
    except psycopg.Error as e:
        raise translate(e) from e
    if row["type"] not in WEB_KINDS:
        noun = row["type"].lower()
        raise NotFoundError(f"{noun} {job_id} has no web server to open (only notebooks and "
                            f"TensorBoards have one)")
    return Target(job_id, row["type"], row["state"], row["address"], row["jupyter_token"],
                  row["end_reason"])


class Grants:
    """det_user.task_open's recent answers by (digest of the login token, task), each good for
    :data:`GRANT_TTL_S`. Only grants are kept: a refusal is asked again every time."""

    MAX = 10_000
    """Entries kept at most; past it the expired ones are dropped (then all, if none is)."""

    def __init__(self) -> None:
        self._grants: dict[tuple[bytes, int], tuple[float, Target]] = {}

    @staticmethod
    def _key(token: str, job_id: int) -> tuple[bytes, int]:
        return hashlib.sha256(token.encode()).digest(), job_id

    def get(self, token: str, job_id: int) -> Target | None:
        entry = self._grants.get(self._key(token, job_id))
        return entry[1] if entry is not None and entry[0] > time.monotonic() else None

    def put(self, token: str, job_id: int, target: Target) -> None:
        now = time.monotonic()
        if len(self._grants) >= self.MAX:
            self._grants = {k: v for k, v in self._grants.items() if v[0] > now}
            if len(self._grants) >= self.MAX:
                self._grants.clear()
        self._grants[self._key(token, job_id)] = (now + GRANT_TTL_S, target)

    def drop(self, token: str, job_id: int) -> None:
        self._grants.pop(self._key(token, job_id), None)


GRANTS = Grants()
"""This det serve process's grants (tokens are random: no two servers' collide)."""


async def _authorise(conn: Request | WebSocket, job_id: int, fresh: bool = False) -> Target:
    """The task the request's login may open (a recent grant unless ``fresh``); raises as
    :func:`open_task`."""
    token = request_token(conn)  # type: ignore[arg-type]  (reads headers and cookies only)
    target = None if fresh else GRANTS.get(token, job_id)
    if target is None:
        GRANTS.drop(token, job_id)
        target = await anyio.to_thread.run_sync(open_task, conn.app.state.pool, token, job_id)
        GRANTS.put(token, job_id, target)
    return target


def unavailable_page(t: Target, problem: str | None = None) -> HTMLResponse:
    """The page of a task whose server cannot answer: 503 (reloading every 2 s) while it waits
    or starts, 410 once it ended, 502 when it runs but its server does not answer
    (``problem``)."""
    noun = t.kind.capitalize() if t.kind != "TENSORBOARD" else "TensorBoard"
    title = f"{noun} {t.job_id} is {t.state}"
    lines = []
    if t.state in ENDED:
        status, refresh = 410, ""
        lines.append(f"It ended: {t.end_reason or 'its server exited'}.")
    elif problem is not None:
        status, refresh = 502, ""
        lines.append(f"Its server at {t.address} does not answer: {problem}.")
    else:
        status, refresh = 503, '<meta http-equiv="refresh" content="2">'
        lines.append("Its server is not answering yet; this page reloads until it does.")
    body = "".join(f"<p>{html.escape(line)}</p>" for line in lines)
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'>{refresh}"
        f"<title>{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1>"
        f"{body}<p><a href='/ui/#/tasks'>Tasks</a></p></body></html>",
        status_code=status, headers={"Cache-Control": "no-store"})


def _upstream_cookie(header: bytes | None) -> bytes | None:
    """The browser's Cookie header without det's login cookie (a task never sees it)."""
    if not header:
        return None
    kept = [part.strip() for part in header.split(b";")
            if part.strip() and part.split(b"=", 1)[0].strip() != COOKIE.encode()]
    return b"; ".join(kept) or None


def _header(scope_headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for k, v in scope_headers if k == name), None)


def _request_headers(request: Request, t: Target) -> list[tuple[bytes, bytes]]:
    """The request's headers as sent to the task, as bytes (what the browser sent, whatever
    its encoding): see :data:`NOT_FORWARDED`. The browser's ``Accept-Encoding`` is sent on
    (``identity`` when it has none, else httpx would ask for gzip on its behalf): bodies are
    relayed as the task encoded them, but HTML, which is decoded to scrub the token."""
    raw = request.scope["headers"]
    out = [(k, v) for k, v in raw if k.decode("latin-1") not in NOT_FORWARDED]
    out.append((b"accept-encoding", _header(raw, b"accept-encoding") or b"identity"))
    out.append((b"authorization", f"token {t.jupyter_token}".encode()))
    cookie = _upstream_cookie(_header(raw, b"cookie"))
    if cookie is not None:
        out.append((b"cookie", cookie))
    return out


def _response_headers(upstream: httpx.Response, scrub: bool) -> list[tuple[bytes, bytes]]:
    """The task's answer's headers as sent to the browser, as bytes: see :data:`NOT_RETURNED`
    and :data:`TASK_COOKIES`; a scrubbed body is sent decoded, so without its encoding."""
    drop = NOT_RETURNED | ({"content-encoding"} if scrub else frozenset())
    out = []
    for key, value in upstream.headers.raw:
        name = key.lower()
        if name == b"set-cookie":
            if value.split(b"=", 1)[0].strip().decode("latin-1") in TASK_COOKIES:
                out.append((name, value))
        elif name.decode("latin-1") not in drop:
            out.append((name, value))
    if not scrub and "content-length" in upstream.headers:
        out.append((b"content-length", upstream.headers["content-length"].encode()))
    return out


async def scrubbed(chunks: AsyncIterator[bytes], secret: bytes) -> AsyncIterator[bytes]:
    """``chunks`` without any occurrence of ``secret``, even one split across chunks (the
    last ``len(secret) - 1`` bytes wait for the next chunk)."""
    keep = len(secret) - 1
    tail = b""
    async for chunk in chunks:
        data = (tail + chunk).replace(secret, b"")
        if len(data) > keep:
            tail = data[len(data) - keep:] if keep else b""
            yield data[:len(data) - keep]
        else:
            tail = data
    if tail:
        yield tail


@router.api_route("/proxy/{job_id}", methods=METHODS, include_in_schema=False)
async def proxy_root(job_id: BigId) -> RedirectResponse:
    # The servers live under /proxy/<id>/: relative links need the slash.
    return RedirectResponse(f"/proxy/{job_id}/", status_code=307)


@router.api_route("/proxy/{job_id}/{path:path}", methods=METHODS, include_in_schema=False)
async def proxy_http(request: Request, job_id: BigId, path: str) -> Response:
    """Relay one HTTP request to the task's server (module docstring)."""
    t = await _authorise(request, job_id)
    if t.state != "RUNNING" or t.address is None:
        return unavailable_page(t)
    client: httpx.AsyncClient = request.app.state.proxy_client
    raw = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    url = httpx.URL(f"http://{t.address}").copy_with(
        raw_path=raw + (b"?" + query if query else b""))
    has_body = request.method not in ("GET", "HEAD", "OPTIONS") or \
        "content-length" in request.headers or "transfer-encoding" in request.headers
    upstream_request = client.build_request(
        request.method, url, headers=_request_headers(request, t),
        content=request.stream() if has_body else None)
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.TransportError as e:
        # The grant may be older than the task's end: the page says what the task is now.
        t = await _authorise(request, job_id, fresh=True)
        if t.state != "RUNNING":
            return unavailable_page(t)
        return unavailable_page(t, f"{type(e).__name__} {e}".strip())
    scrub = upstream.headers.get("content-type", "").startswith("text/html")
    body = (scrubbed(upstream.aiter_bytes(), t.jupyter_token.encode()) if scrub
            else upstream.aiter_raw())
    response = StreamingResponse(body, status_code=upstream.status_code,
                                 background=BackgroundTask(upstream.aclose))
    response.raw_headers = _response_headers(upstream, scrub)
    return response


def origin_problem(ws: WebSocket) -> str | None:
    """Why a WebSocket may not be opened from where it comes (an ``Origin`` that is not this
    server: another site's page using the user's cookie), or None. A client without
    ``Origin`` is no browser (a script with its own token) and passes."""
    origin = ws.headers.get("origin")
    if origin is None:
        return None
    host = (ws.headers.get("host") or "").lower()
    if origin == "null" or urlsplit(origin).netloc.lower() != host:
        return f"cross-site WebSocket refused: Origin {origin!r} is not this server ({host!r})"
    return None


def sendable(code: int | None) -> int:
    """A close code that may be sent in a close frame (RFC 6455 7.4): 1005 (none given) and
    1006 (no close frame: the peer vanished) are only ever reported, never sent."""
    if code is None or code == 1005:
        return 1000
    if code == 1006 or not (1000 <= code <= 4999) or code in (1004, 1015):
        return 1011
    return code


async def _deny(ws: WebSocket, response: Response) -> None:
    """Refuse the WebSocket before accepting it with ``response`` (status and body) where the
    server can send one (the ASGI denial-response extension; uvicorn can), else 403."""
    try:
        await ws.send_denial_response(response)
    except RuntimeError:
        await ws.close(code=1008)


@router.websocket("/proxy/{job_id}/{path:path}")
async def proxy_ws(ws: WebSocket, job_id: BigId, path: str) -> None:
    """Relay one WebSocket to the task's server (module docstring): refused (HTTP status, as
    the same request over HTTP would get) before it is accepted, unless the login opens the
    task, it is running, and the task's server accepts it too; accepted with the subprotocol
    the task's server chose."""
    problem = origin_problem(ws)
    if problem is not None:
        await _deny(ws, error_response(PermissionDeniedError(problem)))
        return
    try:
        t = await _authorise(ws, job_id)
    except DetError as e:
        await _deny(ws, error_response(e))
        return
    if t.state != "RUNNING" or t.address is None:
        await _deny(ws, unavailable_page(t))
        return
    raw = ws.scope.get("raw_path") or ws.url.path.encode()
    query = ws.scope.get("query_string", b"")
    uri = f"ws://{t.address}{raw.decode('latin-1')}" + (f"?{query.decode('latin-1')}"
                                                          if query else "")
    headers = [("Authorization", f"token {t.jupyter_token}")]
    cookie = _upstream_cookie(_header(ws.scope["headers"], b"cookie"))
    if cookie is not None:
        headers.append(("Cookie", cookie.decode("latin-1")))
    try:
        upstream = await websockets.connect(
            uri, additional_headers=headers, subprotocols=ws.scope.get("subprotocols") or None,
            max_size=None, proxy=None, compression=None, open_timeout=10)
    except websockets.InvalidStatus as e:
        await _deny(ws, Response(e.response.body or b"", status_code=e.response.status_code))
        return
    except (OSError, TimeoutError, websockets.InvalidHandshake) as e:
        await _deny(ws, unavailable_page(t, f"{type(e).__name__} {e}".strip()))
        return
    async with upstream:
        await ws.accept(subprotocol=upstream.subprotocol)
        await _relay(ws, upstream, job_id)


async def _relay(ws: WebSocket, upstream: ClientConnection, job_id: int) -> None:
    """Frames both ways until either side closes; the other then gets its close code."""

    async def from_client() -> None:
        checked = time.monotonic()
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(sendable(message.get("code")), message.get("reason") or "")
                return
            if message.get("text") is not None:
                await upstream.send(message["text"])
            elif message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            if time.monotonic() - checked > RECHECK_S:
                checked = time.monotonic()
                try:
                    await _authorise(ws, job_id, fresh=True)
                except DetError as e:
                    await upstream.close(1008, "login or permission revoked")
                    await ws.close(1008, str(e)[:120])
                    return

    async def from_task() -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for message in upstream:
                if isinstance(message, str):
                    await ws.send_text(message)
                else:
                    await ws.send_bytes(message)
        # The task's server closed (or vanished): the browser gets its code and reason.
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await ws.close(sendable(upstream.close_code), upstream.close_reason or None)

    tasks = [asyncio.create_task(from_client()), asyncio.create_task(from_task())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect,
                                     websockets.ConnectionClosed, RuntimeError):
                await task
