"""User-facing errors raised by the harness (all are ``det.errors.DetError`` subclasses)."""

from det.errors import DetError


class EntrypointError(DetError):
    """The entrypoint ``module:Class`` cannot be loaded or is not a ``PyTorchTrial`` subclass."""


class MissingSearcherMetricError(DetError):
    """Validation metrics lack the config's ``searcher.metric`` (or, ``key="time_metric"``,
    adaptive ASHA's ``searcher.time_metric``, which must be a number).

    The message names the missing key and lists the keys that were reported.
    """

    def __init__(self, metric: str, reported: list[str], key: str = "metric") -> None:
        self.metric = metric
        self.reported = reported
        what = "searcher" if key == "metric" else "time"
        super().__init__(
            f"validation metrics lack the {what} metric {metric!r} (searcher.{key}); "
            f"reported keys: {', '.join(sorted(reported)) or '(none)'}"
        )


class TrialCodeError(DetError):
    """User training code raised while the harness ran it (local runs wrap the cause)."""


class StorageError(DetError):
    """Checkpoint storage is misconfigured or a checkpoint cannot be found."""


class CheckpointStorageError(StorageError):
    """A checkpoint could not be written for a reason of its storage that waiting or
    restarting does not cure (no space, quota, read-only, I/O error: see
    ``det.harness.storage.STORAGE_ERRNOS``). The message is one line naming the storage path
    and the OS error, e.g. ``checkpoint storage /mnt/ckpt: [Errno 28] No space left on
    device``; the task reports it as its run's exit reason (``det_task.report_storage_error``)."""


class TaskEnvironmentError(DetError):
    """A task environment variable (``DET_DB_URL``, ``DET_ALLOCATION_ID``, ...) is missing."""


class InvalidHP(Exception):
    """Raise from the trial (``__init__`` or ``train_batch``) when its hyperparameters cannot
    work; the trainer reports an early exit ``invalid_hp`` and the task exits 0. Defined here,
    apart from torch, so that ``import determined`` (which exports it) loads no torch."""
