"""What every request to det serve passes before FastAPI parses it, as one pure
ASGI middleware, :class:`Perimeter`:

* **Body caps**, checked on ``Content-Length`` up front and on the bytes as they stream in
  (a chunked body has no length): :data:`MAX_BODY` for every route but the experiment upload,
  :data:`MAX_UPLOAD_BODY` for that one; more is 413 and is never read. An upload larger than
  :data:`MAX_BODY` must carry a live login token before its body is read (401 otherwise), so
  no one who is not logged in makes det serve parse more than a small body.
* **NUL** in the path or the query (raw or ``%00``) is 400: PostgreSQL text cannot hold it.
* **Cross-site requests** (CSRF): a state-changing request (POST, PUT, PATCH, DELETE, ...)
  authenticated by the WebUI's cookie must come from det's own page: an ``Origin`` (else
  ``Referer``) naming the request's own ``Host``, and the header ``X-Det-Request: 1`` that the
  WebUI's script adds to every fetch (a page of another site can add neither without a CORS
  preflight, which det serve never grants). A request carrying ``Authorization: Bearer``
  (the CLI, scripts) is not sent by a browser on its own, so it passes. Else 403.
* **Security headers** on every answer (:data:`SECURITY_HEADERS`): a Content-Security-Policy
  allowing det's own files only (no inline script, no framing), X-Frame-Options DENY,
  X-Content-Type-Options nosniff, Referrer-Policy same-origin.
* **Proxied tasks** (``/proxy/<job>/``, :mod:`det.api.proxy`): JupyterLab and
  TensorBoard are not det's pages. Their state-changing requests need the same-origin
  ``Origin`` (else ``Referer``) but not ``X-Det-Request`` (JupyterLab cannot add it); their
  bodies may be :data:`MAX_PROXY_BODY`; their answers get :data:`PROXY_SECURITY_HEADERS`
  (det's CSP would forbid their inline styles and same-origin frames).

Refusals are det's JSON errors (``{"error": "..."}``, :mod:`det.api.errors`).
"""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import psycopg
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from det.api.errors import error_response
from det.api.session import COOKIE, act_as, request_token
from det.db.sqlstate import translate
from det.errors import DetError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 8 * 2**20
"""Bytes of a request body, for every route but the upload (8 MiB): the largest other body is
a 1 MiB config (det.configs.limits.MAX_CONFIG_BYTES) in JSON, at worst 6 bytes a character
(``\\u0001``), with room for the other fields."""

MAX_UPLOAD_BODY = 136 * 2**20
"""Bytes of a request with a context (136 MiB, :data:`UPLOADS`): its context of up to 95 MiB
(det.context.MAX_CONTEXT_BYTES) is base64 in the JSON, 4/3 as long (126.7 MiB), beside a
config of up to 6 MiB as JSON (see :data:`MAX_BODY`) and a few short fields."""

MAX_PROXY_BODY = 24 * 2**20
"""Bytes of a request to a proxied task (24 MiB): JupyterLab uploads a file of up to 15 MiB in
one request, base64 in JSON (20 MiB), larger ones in 1 MiB chunks (its uploader's
LARGE_FILE_SIZE and CHUNK_SIZE)."""

PROXY_PREFIX = "/proxy/"
"""Paths of proxied tasks (det.api.proxy)."""

UPLOADS = {("POST", "/api/v1/experiments"), ("POST", "/api/v1/commands"),
           ("POST", "/api/v1/notebooks"), ("POST", "/api/v1/shells")}
"""(method, path) of the routes allowed :data:`MAX_UPLOAD_BODY`: those that take a context
(an experiment's, or an interactive task's ``-c/--context``)."""

CSRF_HEADER = "x-det-request"
"""The header det's WebUI sends on every fetch (value ``1``); see the module's docstring."""

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing; every other one is checked as a change."""

CSP = ("default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
"""det's pages load only det's own files: no inline or third-party script, no framing. Images
may be ``data:`` URLs (Swagger UI's stylesheet draws its icons so)."""

SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]

PROXY_SECURITY_HEADERS = [
    (b"content-security-policy", b"frame-ancestors 'self'"),
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
"""A proxied task's answers: no page of another site may frame them; JupyterLab's own frames
(same origin) work. The task's own CSP, if it sends one, applies too."""


class Perimeter:
    """The ASGI middleware of the module's docstring, around det serve's whole app."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        extra = PROXY_SECURITY_HEADERS if proxied(scope) else SECURITY_HEADERS

        async def secured_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        refusal = request_refusal(scope)
        if refusal is None:
            refusal = await length_refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, secured_send)
            return
        limit = BodyLimit(scope, receive, secured_send)
        await self.app(scope, limit.receive, limit.send)


async def length_refusal(scope: Scope) -> JSONResponse | None:
    """The refusal of a request whose ``Content-Length`` is over its route's cap (413), or over
    :data:`MAX_BODY` without a live token (401); None to go on."""
    length = header(scope, b"content-length")
    if length is None:
        return None
    n = int(length)  # uvicorn (h11, httptools) refuses a malformed one before the app
    cap = body_cap(scope)
    if n > cap:
        return too_large(cap)
    if n > MAX_BODY:
        return await token_refusal(scope)
    return None


class BodyLimit:
    """The app's ``receive`` and ``send`` for one request: counts the body's bytes as they
    arrive; past its route's cap it answers 413 itself and tells the app the client left
    (Starlette's ``ClientDisconnect``), so no more is read or parsed, and drops the app's own
    answer; past :data:`MAX_BODY` it first checks the token (:func:`token_refusal`)."""

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope, self._receive, self._send = scope, receive, send
        self.cap = body_cap(scope)
        self.seen = 0
        self.started = False  # the app has begun its answer
        self.refused = False  # this has answered instead

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] != "http.request":
            return message
        before, self.seen = self.seen, self.seen + len(message.get("body", b""))
        refusal = None
        if self.seen > self.cap:
            refusal = too_large(self.cap)
        elif self.seen > MAX_BODY >= before:
            refusal = await token_refusal(self.scope)
        if refusal is None:
            return message
        self.refused = True
        if not self.started:  # else the app answered before reading: it only loses the body
            await refusal(self.scope, self._receive, self._send)
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.refused and not self.started:
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)


def request_refusal(scope: Scope) -> JSONResponse | None:
    """The refusal of a request that NUL bytes (400) or the CSRF rule (403) refuse, from its
    path, query and headers alone; None to go on."""
    query = scope.get("query_string", b"")
    if "\x00" in scope["path"] or b"\x00" in scope.get("raw_path", b""):
        return _refuse(400, "path: NUL bytes are not allowed")
    if b"\x00" in query or b"%00" in query:
        return _refuse(400, "query: NUL bytes are not allowed")
    problem = csrf_problem(scope)
    if problem is not None:
        return _refuse(403, f"cross-site request refused: {problem}")
    return None


def csrf_problem(scope: Scope) -> str | None:
    """Why a cookie-authenticated state-changing request may not come from det's own page
    (the rule of the module's docstring), or None when it may pass."""
    if scope["method"] in SAFE_METHODS or header(scope, b"authorization") is not None:
        return None
    if COOKIE not in HTTPConnection(scope).cookies:
        return None  # no login to abuse; the route itself refuses an anonymous caller
    host = (header(scope, b"host") or "").lower()
    origin = header(scope, b"origin")
    if origin is None or origin == "null":
        referer = header(scope, b"referer")
        if referer is None:
            return "the WebUI's requests carry Origin or Referer; this one has neither"
        origin = referer
    if urlsplit(origin).netloc.lower() != host:
        return f"Origin {origin!r} is not this server ({host!r})"
    if header(scope, CSRF_HEADER.encode()) != "1" and not proxied(scope):
        return "the header 'X-Det-Request: 1' is missing"
    return None


async def token_refusal(scope: Scope) -> JSONResponse | None:
    """401 unless the request carries a live login token (det_web.auth, in a transaction of
    its own, before its large body is read); None when it does."""
    try:
        token = request_token(HTTPConnection(scope))  # type: ignore[arg-type]
        await anyio.to_thread.run_sync(_check_token, scope["app"].state.pool, token)
    except DetError as e:
        return error_response(e)
    except psycopg.Error as e:
        return error_response(translate(e))
    return None


def _check_token(pool, token: str) -> None:
    with pool.connection() as conn, conn.transaction():
        act_as(conn, token)


def body_cap(scope: Scope) -> int:
    if proxied(scope):
        return MAX_PROXY_BODY
    return MAX_UPLOAD_BODY if (scope["method"], scope["path"]) in UPLOADS else MAX_BODY


def proxied(scope: Scope) -> bool:
    """A request to a proxied task (det.api.proxy)."""
    return scope["path"].startswith(PROXY_PREFIX)


def too_large(cap: int) -> JSONResponse:
    return _refuse(413, f"request body: more than {cap} bytes ({cap // 2**20} MiB), the most "
                        f"this route accepts")


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), as Latin-1 text."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _refuse(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
