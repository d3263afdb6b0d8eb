"""``determined.common.api.bindings``: the state enums of 0.38.1's generated bindings that
scripts compare against (``exp.wait() == bindings.experimentv1State.COMPLETED``). Values
are upstream's; ``str()`` drops the common ``STATE_`` prefix as upstream's ``DetEnum`` does."""

import enum
import os

__all__ = ["DetEnum", "checkpointv1State", "experimentv1State", "trialv1State"]


class DetEnum(enum.Enum):
    """An enum whose ``str()`` is its value without the prefix all its values share."""

    def __str__(self) -> str:
        return f"{self.value[len(self.prefix()):]}"

    @classmethod
    def prefix(cls) -> str:
        """The prefix (ending in ``_``) every value shares, or ``''``."""
        prefix: str = os.path.commonprefix([e.value for e in cls])
        return prefix if prefix.endswith("_") else ""


class checkpointv1State(DetEnum):  # noqa: N801 - upstream's name
    """A checkpoint's state."""

    UNSPECIFIED = "STATE_UNSPECIFIED"
    ACTIVE = "STATE_ACTIVE"
    COMPLETED = "STATE_COMPLETED"
    ERROR = "STATE_ERROR"
    DELETED = "STATE_DELETED"
    PARTIALLY_DELETED = "STATE_PARTIALLY_DELETED"


class experimentv1State(DetEnum):  # noqa: N801 - upstream's name
    """An experiment's state."""

    UNSPECIFIED = "STATE_UNSPECIFIED"
    ACTIVE = "STATE_ACTIVE"
    PAUSED = "STATE_PAUSED"
    STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
    STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
    STOPPING_ERROR = "STATE_STOPPING_ERROR"
    COMPLETED = "STATE_COMPLETED"
    CANCELED = "STATE_CANCELED"
    ERROR = "STATE_ERROR"
    DELETED = "STATE_DELETED"
    DELETING = "STATE_DELETING"
    DELETE_FAILED = "STATE_DELETE_FAILED"
    STOPPING_KILLED = "STATE_STOPPING_KILLED"
    QUEUED = "STATE_QUEUED"
    PULLING = "STATE_PULLING"
    STARTING = "STATE_STARTING"
    RUNNING = "STATE_RUNNING"


class trialv1State(DetEnum):  # noqa: N801 - upstream's name
    """A trial's state."""

    UNSPECIFIED = "STATE_UNSPECIFIED"
    ACTIVE = "STATE_ACTIVE"
    PAUSED = "STATE_PAUSED"
    STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
    STOPPING_KILLED = "STATE_STOPPING_KILLED"
    STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
    STOPPING_ERROR = "STATE_STOPPING_ERROR"
    CANCELED = "STATE_CANCELED"
    COMPLETED = "STATE_COMPLETED"
    ERROR = "STATE_ERROR"
    QUEUED = "STATE_QUEUED"
    PULLING = "STATE_PULLING"
    STARTING = "STATE_STARTING"
    RUNNING = "STATE_RUNNING"
