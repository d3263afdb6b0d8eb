"""The ASGI application: REST routers, error handlers, the event hub, the WebUI's files."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from psycopg.rows import dict_row

from det.api import errors, proxy
from det.api.events import Hub
from det.api.perimeter import Perimeter
from det.api.routes import (
    auth,
    cluster,
    events,
    experiments,
    forks,
    models,
    queue,
    tasks,
    trials,
    usage,
    workspaces,
)
from det.api.session import DEFAULT_TOKEN_TTL
from det.db import connect
from det.db.migrate import ensure_current
from det.db.reconnect import open_pool

POOL_SIZE = 16
"""Most database connections one server process holds for requests (plus one listening)."""

STATIC = resources.files("det.api") / "static"

SWAGGER_UI = resources.files("fastapi_offline") / "static"
"""Swagger UI's files (swagger-ui-bundle.js, swagger-ui.css, favicon.png) as the fastapi-offline
package ships them, served at /static/swagger-ui: the docs page loads nothing from elsewhere."""


def create_app(url: str, token_ttl: float = DEFAULT_TOKEN_TTL) -> FastAPI:
    """The server for the database at ``url``; ``token_ttl``: seconds a login lasts.

    On start it checks the schema is current (bringing it up to date if it may), opens its
    connection pool and starts the event hub's listening connection. Every request passes
    det.api.perimeter first (body caps, NUL, cross-site requests, security headers).
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with connect(url) as conn:
            ensure_current(conn)
        # checked: a connection the server dropped (a restart) or that a frozen server leaves
        # unanswered is replaced before a request gets it, so requests ride out both.
        pool = open_pool(url, min_size=2, max_size=POOL_SIZE, row_factory=dict_row)
        hub = Hub(url)
        app.state.pool, app.state.hub, app.state.token_ttl = pool, hub, token_ttl
        app.state.url = url
        app.state.proxy_client = proxy.upstream_client()
        listener = asyncio.create_task(hub.run())
        try:
            yield
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await app.state.proxy_client.aclose()
            pool.close()

    app = FastAPI(title="det", version="0.1.0", lifespan=lifespan,
                  description="det's REST API: experiments, trials, the job queue, agents and "
                              "pools, over det's PostgreSQL control plane. Log in with "
                              "POST /api/v1/auth/login and send the token as "
                              "'Authorization: Bearer TOKEN'.",
                  openapi_url="/api/v1/openapi.json", docs_url=None, redoc_url=None)
    errors.install(app)
    app.add_middleware(ServerTiming)
    app.add_middleware(Perimeter)  # outermost: limits and refusals before anything else runs
    # The proxy first: a JupyterLab page load is a hundred requests, and each is matched
    # against the routes in order (behind some 40 others, matching showed in its profile).
    for r in (proxy, auth, forks, experiments, models, trials, queue, cluster, events, tasks,
              usage, workspaces):
        app.include_router(r.router)
    # Before /static, which would otherwise take its paths.
    app.mount("/static/swagger-ui", StaticFiles(directory=str(SWAGGER_UI)), name="swagger-ui")
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/api/v1/docs", include_in_schema=False)
    def docs() -> FileResponse:
        # FastAPI's own page loads Swagger UI from a CDN and starts it with an inline script.
        return FileResponse(str(STATIC / "docs.html"), headers={"Cache-Control": "no-cache"})

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/ui/{path:path}", include_in_schema=False)
    def ui(path: str) -> FileResponse:
        # One page; its script routes by the URL's hash.
        return FileResponse(str(STATIC / "index.html"), headers={"Cache-Control": "no-cache"})

    return app


class ServerTiming:
    """Adds ``Server-Timing: app;dur=MS`` to every answer: the milliseconds from the request's
    arrival to its answer's headers (bench/api.py reads it: server time, without the
    client's)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed_send(message) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - start) * 1000
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"server-timing", f"app;dur={ms:.2f}".encode())]}
            await send(message)

        await self.app(scope, receive, timed_send)
