"""User-facing error types.

Each kind of failure a user can cause has its own type; the message names the field, file or
object and what was expected. The CLI prints ``str(error)`` as one line (``--debug`` shows the
traceback).
"""


def one_line(text: str) -> str:
    """``text`` with each character that is not printable (line breaks, other control
    characters, lone surrogates) escaped as Python writes it (``\\n``, ``\\x85``,
    ``\\ud800``), so that a message quoting user input stays one printable line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


class DetError(Exception):
    """Base of every error det reports to a user as one line: ``str(error)`` escapes what
    would break the line (``one_line``)."""

    def __str__(self) -> str:
        return one_line(super().__str__())


class ConfigError(DetError):
    """An experiment or cluster config is invalid.

    ``path`` is the dotted location of the bad value (``searcher.max_length``), ``source`` the
    file it came from, if any.
    """

    def __init__(self, path: str, message: str, source: str | None = None) -> None:
        self.path = path
        self.source = source
        where = f"{source}: " if source else ""
        at = f"{path}: " if path else ""
        super().__init__(f"{where}{at}{message}")


class ContextError(DetError):
    """The model-definition context directory cannot be used (missing, too large, unreadable)."""


class NotFoundError(DetError):
    """An object named by the user (experiment, trial, checkpoint, agent) does not exist."""


class StateError(DetError):
    """The requested action is not legal in the object's current state."""


class AuthError(DetError):
    """A login or token was refused: a wrong user or password, a bad or expired token."""


class PermissionDeniedError(DetError):
    """The caller's roles do not permit the action; the message names the role and scope
    needed (SQLSTATE 42501, raised by det_internal.require or by PostgreSQL's own privilege
    checks)."""


class DatabaseError(DetError):
    """The database cannot be reached or answered with an error a user should see."""


class ImageError(DetError):
    """The default task image cannot be built: no base image, no wheels, or a failed step."""
