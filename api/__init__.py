"""``det serve``: the REST API under ``/api/v1`` and the WebUI, one stateless process over
det's database (docs/architecture.md, "The HTTP server").

Every request is one transaction of the same SQL functions and named queries
(``det.queries``) the CLI uses; live pages are fed by server-sent events from one LISTEN
connection per process (:mod:`det.api.events`). Many servers behind a load balancer behave
as one. Exports :func:`create_app`.
"""

from det.api.app import create_app

__all__ = ["create_app"]
