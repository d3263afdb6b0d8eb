"""``/api/v1/auth``: log in (a token, stored hashed, expiring; attempts audited and throttled
per user name and client address), log out, who am I."""

import math
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from det.api.session import COOKIE, Session, mint_token, request_token, session
from det.db.roles import check_password
from det.errors import AuthError
from det.sql import named

Q = named("api")

router = APIRouter(prefix="/api/v1", tags=["auth"])


class Login(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(max_length=255)
    password: str = Field(default="", max_length=4096)

    @field_validator("username", "password")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        # neither PostgreSQL text (the audit row, the throttle's key) nor libpq takes NUL
        if "\x00" in value:
            raise ValueError("NUL bytes are not allowed")
        return value


class LoginResponse(BaseModel):
    token: str
    username: str
    expires_at: datetime


@router.post("/auth/login", response_model=LoginResponse,
             responses={429: {"description": "Too many failed logins for this user or from "
                                             "this address: retry after Retry-After seconds"}})
def login(body: Login, request: Request, response: Response) -> Any:
    """Check the user and password (PostgreSQL does); answer a token good until
    ``expires_at`` (also set as the WebUI's HttpOnly cookie). 401 for a wrong user or
    password, or a deactivated user. 429 with ``Retry-After`` (seconds) while the user name or
    the client's address is locked after failed attempts (det_web.login_begin: 5 per name, 20 per
    address), asked before any password is checked, a right one included. Every attempt is
    audited with the name tried and the client's address, never the password."""
    address = request.client.host if request.client else None
    pool = request.app.state.pool
    with pool.connection() as conn:
        wait = conn.execute(Q.login_begin, (body.username, address)).fetchone()["w"]
    if wait > 0:
        seconds = math.ceil(wait)
        return JSONResponse({"error": f"too many failed logins for {body.username!r} or from "
                                      f"this address: try again in {seconds} s"},
                            status_code=429, headers={"Retry-After": str(seconds)})
    try:
        user = check_password(request.app.state.url, body.username, body.password)
    except AuthError:
        with pool.connection() as conn:
            conn.execute(Q.login_failed, (body.username, address))
        raise
    token = mint_token()
    ttl = request.app.state.token_ttl
    with pool.connection() as conn:
        expires = conn.execute(Q.web_login, (token, user, ttl, address)).fetchone()["e"]
    # Secure over TLS (det serve --certfile): the browser then never sends it in the clear.
    response.set_cookie(COOKIE, token, max_age=int(ttl), httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return {"token": token, "username": user, "expires_at": expires}


@router.post("/auth/logout", status_code=204)
def logout(request: Request, response: Response, s: Session = session) -> None:
    """End this login: its token is refused from now on."""
    s.conn.execute(Q.web_logout, (request_token(request),))
    response.delete_cookie(COOKIE)


@router.get("/me")
def me(s: Session = session) -> dict:
    """The logged-in user."""
    return {"username": s.user}
