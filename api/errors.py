"""det's errors as HTTP answers: JSON ``{"error": "<the CLI's one-line message>"}`` with the
status that fits (400 bad input naming the field, 401 bad or missing login, 403 not
permitted, 404 missing object, 409 illegal transition, 502 checkpoint storage failing, 503
database unavailable)."""

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from det.db.sqlstate import translate
from det.errors import (
    AuthError,
    DatabaseError,
    DetError,
    NotFoundError,
    PermissionDeniedError,
    StateError,
)
from det.harness.errors import StorageError

STATUS: list[tuple[type[DetError], int]] = [
    (AuthError, 401),
    (PermissionDeniedError, 403),
    (NotFoundError, 404),
    (StateError, 409),
    (DatabaseError, 503),
    (StorageError, 502),
    (DetError, 400),
]
"""HTTP status per det error type (first match wins: subclasses first)."""


def status_of(error: DetError) -> int:
    return next(code for kind, code in STATUS if isinstance(error, kind))


def error_response(error: DetError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(error, AuthError) else None
    return JSONResponse({"error": str(error)}, status_code=status_of(error), headers=headers)


def _validation_message(e: RequestValidationError) -> str:
    """The first problem of a request FastAPI refused, as one line naming the field
    (``limit: Input should be a valid integer``); where the request is not JSON at all,
    ``body: ...``."""
    err = e.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
    where = ".".join(loc) or "body"
    return f"{where}: {err.get('msg', 'invalid value')}"


def install(app: FastAPI) -> None:
    """Register the handlers that turn det's and the database's errors into JSON answers."""

    @app.exception_handler(DetError)
    async def _det(_: Request, e: DetError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(psycopg.Error)
    async def _db(_: Request, e: psycopg.Error) -> JSONResponse:
        return error_response(translate(e))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(DetError(_validation_message(e)))
