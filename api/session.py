"""Who is asking, and the request's transaction.

Auth (issue 15): ``POST /api/v1/auth/login`` checks the user and password and mints a random
token that the database stores only hashed, with an expiry (``det_web_login``); every other
request carries it as ``Authorization: Bearer TOKEN`` or in the WebUI's cookie, and runs as
one transaction that begins with ``det_web_auth`` (SQLSTATE 28000 -> 401). Until det has users
(the identity issue), the one user is the embedded default's: the server's ``DET_USER`` (else
its login name) with the password ``DET_PASSWORD`` (empty unless set, like Determined's default
``admin``). Per-user roles come later as ``SET LOCAL ROLE`` right after ``det_web_auth``, in
:func:`_session`, so row-level security applies to the API as to psql.
"""

import hmac
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from fastapi import Depends, Request

from det.cli.session import user as cluster_user
from det.errors import AuthError

COOKIE = "det_token"
"""The WebUI's cookie holding the login token (HttpOnly, SameSite=Strict)."""

DEFAULT_TOKEN_TTL = 7 * 86400.0
"""Seconds a login token lives (7 days) unless ``det serve --token-ttl`` says otherwise."""


@dataclass
class Session:
    """One request's database connection (inside its transaction) and user."""

    conn: psycopg.Connection
    user: str


def check_password(username: str, password: str) -> str:
    """The user ``username`` if ``password`` is theirs.

    Raises:
        AuthError: any other user or password (one message for both, so neither leaks).
    """
    expected_user = cluster_user()
    expected_password = os.environ.get("DET_PASSWORD", "")
    ok_user = hmac.compare_digest(username.encode(), expected_user.encode())
    ok_password = hmac.compare_digest(password.encode(), expected_password.encode())
    if not (ok_user and ok_password):
        raise AuthError("invalid username or password")
    return expected_user


def mint_token() -> str:
    """A new login token: 256 random bits, URL-safe text."""
    return secrets.token_urlsafe(32)


def request_token(request: Request) -> str:
    """The token the request carries (Bearer header first, then the cookie).

    Raises:
        AuthError: none, or a malformed Authorization header.
    """
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("Authorization: expected 'Bearer TOKEN'")
        return token.strip()
    token = request.cookies.get(COOKIE)
    if not token:
        raise AuthError("not logged in: POST /api/v1/auth/login, then send the token as "
                        "'Authorization: Bearer TOKEN'")
    return token


def _session(request: Request) -> Iterator[Session]:
    """The request's transaction, as its authenticated user. Committed when the endpoint
    returns (before the answer is sent), rolled back if it raises.

    Raises:
        AuthError: no token, or one that is unknown or expired.
    """
    token = request_token(request)
    with request.app.state.pool.connection() as conn, conn.transaction():
        user = conn.execute("SELECT det_web_auth(%s) AS u", (token,)).fetchone()["u"]
        yield Session(conn, user)


session = Depends(_session, scope="function")
"""The request's :class:`Session` as an endpoint parameter (``s: Session = session``): its
transaction ends with the endpoint, before the answer is sent, so a client that reads right
after a write sees it."""
