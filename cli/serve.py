"""``det serve``: the REST API and the WebUI (det.api) on uvicorn, over det's database."""

import typer

from det.api.session import DEFAULT_TOKEN_TTL
from det.db import role_url, roles


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port to listen on."),
    token_ttl: float = typer.Option(DEFAULT_TOKEN_TTL, "--token-ttl", min=1.0,
                                    help="Seconds a login token lives."),
) -> None:
    """Serve the REST API (/api/v1, docs at /api/v1/docs) and the WebUI (/). The server is
    stateless: run as many as you like against one database."""
    import uvicorn

    from det.api import create_app

    app = create_app(role_url(roles.WEB), token_ttl=token_ttl)
    typer.echo(f"det serve: http://{host}:{port}/ (API docs: /api/v1/docs)")
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
