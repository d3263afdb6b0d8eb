"""User-facing error types.

Each kind of failure a user can cause has its own type; the message names the field, file or
object and what was expected. The CLI prints ``str(error)`` as one line (``--debug`` shows the
traceback).
"""


class DetError(Exception):
    """Base of every error det reports to a user as one line."""


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


class DatabaseError(DetError):
    """The database cannot be reached or answered with an error a user should see."""


class ImageError(DetError):
    """The default task image cannot be built: no base image, no wheels, or a failed step."""
