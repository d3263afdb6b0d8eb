"""``determined.common.api.errors``: 0.38.1's exception classes under their names, so user code
catching them (``except api.errors.NotFoundException``) imports. Each carries ``message``;
``APIException`` also ``status_code`` (None when not from an HTTP response)."""

from typing import Any

__all__ = ["APIException", "BadRequestException", "BadResponseException",
           "ForbiddenException", "MasterNotFoundException", "NotFoundException",
           "UnauthenticatedException"]


class BadRequestException(Exception):
    """A request could not be made or was refused."""

    def __init__(self, message: str, *args: Any) -> None:
        super().__init__(message, *args)
        self.message = message

    def __str__(self) -> str:
        return self.message


class BadResponseException(Exception):
    """A response could not be understood."""

    def __init__(self, message: str, *args: Any) -> None:
        super().__init__(message, *args)
        self.message = message

    def __str__(self) -> str:
        return self.message


class MasterNotFoundException(BadRequestException):
    """The master (for det: where det is) cannot be reached."""


class APIException(BadRequestException):
    """An API operation failed; ``status_code`` is its HTTP status, if it had one."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class NotFoundException(APIException):
    """What was asked for does not exist (HTTP 404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 404)


class ForbiddenException(BadRequestException):
    """The user may not do this (HTTP 403)."""


class UnauthenticatedException(BadRequestException):
    """The user is not logged in (HTTP 401)."""
