"""``/api/v1/auth``: log in (a token, stored hashed, expiring), log out, who am I."""

from datetime import datetime

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from det.api.session import COOKIE, Session, check_password, mint_token, request_token, session

router = APIRouter(prefix="/api/v1", tags=["auth"])


class Login(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(max_length=255)
    password: str = Field(default="", max_length=4096)


class LoginResponse(BaseModel):
    token: str
    username: str
    expires_at: datetime


@router.post("/auth/login", response_model=LoginResponse)
def login(body: Login, request: Request, response: Response) -> dict:
    """Check the user and password (PostgreSQL does); answer a token good until
    ``expires_at`` (also set as the WebUI's HttpOnly cookie). 401 for a wrong user or
    password, or a deactivated user."""
    user = check_password(request.app.state.url, body.username, body.password)
    token = mint_token()
    ttl = request.app.state.token_ttl
    with request.app.state.pool.connection() as conn:
        expires = conn.execute("SELECT det_web_login(%s, %s, %s) AS e",
                               (token, user, ttl)).fetchone()["e"]
    # Secure over TLS (det serve --certfile): the browser then never sends it in the clear.
    response.set_cookie(COOKIE, token, max_age=int(ttl), httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return {"token": token, "username": user, "expires_at": expires}


@router.post("/auth/logout", status_code=204)
def logout(request: Request, response: Response, s: Session = session) -> None:
    """End this login: its token is refused from now on."""
    s.conn.execute("SELECT det_web_logout(%s)", (request_token(request),))
    response.delete_cookie(COOKIE)


@router.get("/me")
def me(s: Session = session) -> dict:
    """The logged-in user."""
    return {"username": s.user}
