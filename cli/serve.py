"""``det serve``: the REST API and the WebUI (det.api) on uvicorn, over det's database."""

from pathlib import Path

import typer

from det.api.session import DEFAULT_TOKEN_TTL
from det.db import role_url, roles
from det.errors import DetError


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port to listen on."),
    token_ttl: float = typer.Option(DEFAULT_TOKEN_TTL, "--token-ttl", min=1.0,
                                    help="Seconds a login token lives."),
    certfile: Path | None = typer.Option(
        None, "--certfile", exists=True, dir_okay=False,
        help="Serve HTTPS with this certificate (PEM, the chain after it); with --keyfile."),
    keyfile: Path | None = typer.Option(
        None, "--keyfile", exists=True, dir_okay=False,
        help="The certificate's private key (PEM); with --certfile."),
) -> None:
    """Serve the REST API (/api/v1, docs at /api/v1/docs) and the WebUI (/). The server is
    stateless: run as many as you like against one database. Over HTTPS (--certfile and
    --keyfile, both or neither) the WebUI's login cookie is Secure; without them, serve on
    127.0.0.1 or behind a TLS proxy, since logins and tokens cross the network in the clear.
    """
    import uvicorn

    from det.api import create_app
    from det.host_user import SERVE_AS_ROOT, private_files, warn_if_root

    if (certfile is None) != (keyfile is None):
        raise DetError("--certfile and --keyfile: give both or neither")
    private_files()  # uploads it spools, files it writes: its user's alone
    warn_if_root("det serve", SERVE_AS_ROOT)
    app = create_app(role_url(roles.WEB), token_ttl=token_ttl)
    scheme = "https" if certfile else "http"
    typer.echo(f"det serve: {scheme}://{host}:{port}/ (API docs: /api/v1/docs)")
    # proxy_headers off: the client's address (the login throttle's key, the audit log's) is
    # the connection's, never an X-Forwarded-For that any local process could set.
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2,
                ssl_certfile=certfile, ssl_keyfile=keyfile, proxy_headers=False)
