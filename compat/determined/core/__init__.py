"""``determined.core``: Determined 0.38's Core API, which is det's (``det.harness.core``):
one implementation, re-exported here under 0.38's module name."""

from det.harness.core import (
    CheckpointContext,
    Context,
    DistributedContext,
    DownloadMode,
    DummyDistributedContext,
    EarlyExitReason,
    PreemptContext,
    PreemptMode,
    ProfilerContext,
    SearcherContext,
    SearcherMode,
    SearcherOperation,
    TensorboardMode,
    TrainContext,
    Unit,
    default_storage_path,
    init,
)

__all__ = [
    "CheckpointContext",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "DummyDistributedContext",
    "EarlyExitReason",
    "PreemptContext",
    "PreemptMode",
    "ProfilerContext",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TensorboardMode",
    "TrainContext",
    "Unit",
    "default_storage_path",
    "init",
]
