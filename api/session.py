"""Who is asking, and the request's transaction.

Auth: ``POST /api/v1/auth/login`` has PostgreSQL check the user's
password (det serve opens one connection as that user: det never sees a stored password),
then mints a random token that the database stores only hashed, with an expiry
(``det_web.login``). Every other request carries it as ``Authorization: Bearer TOKEN`` or in
the WebUI's cookie, and runs as one transaction that begins with :func:`act_as`:
``det_web.auth`` (SQLSTATE 28000 -> 401) makes the token's user the transaction's caller, and
``SET LOCAL ROLE`` makes every query of the request run as that user's role, so row-level
security applies to the API exactly as to the user's own psql. det serve's own role
(det_web) may do nothing else.

A token is good only under the password it was minted under: ``det_web.login``
stamps it with a digest of the role's password verifier, and ``det_web.auth`` refuses it
(401), ends the user's other such logins and audits the change once the password differs,
whether det changed it or the user ran ``ALTER ROLE ... PASSWORD`` in psql. Logins are
throttled per user name and per client address in the database (``det_web.login_begin``), before
PostgreSQL checks a password.
"""

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from fastapi import Depends, Request
from psycopg import sql

from det.errors import AuthError
from det.sql import named

Q = named("api")

COOKIE = "det_token"
"""The WebUI's cookie holding the login token (HttpOnly, SameSite=Strict)."""

DEFAULT_TOKEN_TTL = 7 * 86400.0
"""Seconds a login token lives (7 days) unless ``det serve --token-ttl`` says otherwise."""


@dataclass
class Session:
    """One request's database connection (inside its transaction) and user."""

    conn: psycopg.Connection
    user: str


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
        AuthError: no token, or one that is unknown or expired, or minted under a password
            that is no longer its user's (PasswordChanged).
    """
    token = request_token(request)
    with request.app.state.pool.connection() as conn, conn.transaction():
        user = _become(conn, token)
        if user is not None:
            yield Session(conn, user)
    # else the transaction committed det_web.auth's end of the user's logins and its audit
    # row: now the refusal
    if user is None:
        raise PasswordChanged(PASSWORD_CHANGED)


class PasswordChanged(AuthError):
    """The token was minted under a password that is no longer its user's (changed through
    det, or by the user's own ALTER ROLE ... PASSWORD): 401."""


PASSWORD_CHANGED = "the password changed since this login: log in again"


def _become(conn: psycopg.Connection, token: str) -> str | None:
    """:func:`act_as`, but None (nothing raised, so the caller may commit det_web.auth's
    writes) where the user's password changed since ``token`` was minted."""
    user = conn.execute(Q.web_auth, (token,)).fetchone()["u"]
    if user is not None:
        conn.execute(sql.SQL(Q.set_local_role).format(sql.Identifier(user)))
    return user


def act_as(conn: psycopg.Connection, token: str) -> str:
    """In ``conn``'s open transaction, become the user ``token`` belongs to (det_web.auth, then
    SET LOCAL ROLE); returns the user's name.

    Raises:
        psycopg.Error: SQLSTATE 28000 for an unknown or expired token, or a user no longer
            active.
        PasswordChanged: the user's password changed since the token was minted (the
            request's own transaction rolls back det_web.auth's audit row; the next request
            through :func:`_session`, or the next login, writes it).
    """
    user = _become(conn, token)
    if user is None:
        raise PasswordChanged(PASSWORD_CHANGED)
    return user


session = Depends(_session, scope="function")
"""The request's :class:`Session` as an endpoint parameter (``s: Session = session``): its
transaction ends with the endpoint, before the answer is sent, so a client that reads right
after a write sees it."""
