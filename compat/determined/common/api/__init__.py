"""``determined.common.api``: 0.38.1's master-address helpers, its API errors (``errors``) and
the state enums of ``bindings`` that scripts compare against. Upstream's generated REST
bindings and sessions are not here: det's SDK (``determined.experimental.client``) talks to
det directly."""

import os
from urllib import parse

from determined.common.api import bindings, errors

__all__ = ["bindings", "canonicalize_master_url", "errors", "get_default_master_url"]


def get_default_master_url() -> str:
    """``DET_MASTER``, else ``DET_MASTER_ADDR``, else ``localhost:8080``, not canonicalized
    (upstream's ``api.get_default_master_url``)."""
    return os.environ.get("DET_MASTER", os.environ.get("DET_MASTER_ADDR", "localhost:8080"))


def canonicalize_master_url(url: str) -> str:
    """``url`` as ``scheme://host:port[/path]``, as upstream canonicalizes it: ``http`` and
    port 8080 when no scheme is given, else the scheme's port (80 / 443).

    Raises ValueError naming the url when it has no host, or has a user, password, query or
    fragment.
    """
    if url.startswith("https://"):
        default_port = 443
    elif url.startswith("http://"):
        default_port = 80
    else:
        url, default_port = f"http://{url}", 8080
    parsed = parse.urlparse(url)
    if not parsed.hostname:
        raise ValueError(f"invalid master url {url}; master url must contain a nonempty hostname")
    if parsed.username or parsed.password or parsed.query or parsed.fragment:
        raise ValueError(f"invalid master url {url}; master url must not contain username, "
                         "password, query, or fragment")
    netloc = f"{parsed.hostname}:{parsed.port or default_port}"
    return parse.urlunparse((parsed.scheme, netloc, parsed.path, "", "", "")).rstrip("/")
