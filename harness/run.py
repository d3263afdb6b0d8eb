"""Task entrypoint for trial classes: ``python -m det.harness.run module:Class``.

Run by the agent in the unpacked context directory (the cwd, put on ``sys.path``) with
``DET_DB_URL``, ``DET_ALLOCATION_ID`` and ``DET_ALLOCATION_TOKEN`` set. Exits 0 when the
searcher wants nothing more, when preempted (after a checkpoint), on a stop request and on
``InvalidHP``. After each validation it checkpoints as the config's ``checkpoint_policy``
says (``best``, the default: when the searcher metric is the best so far; ``all``; ``none``).
SIGTERM (the agent stopping the task) is treated like a preemption request:
checkpoint at the next batch, exit 0; except in a worker among several, started by
``det.launch.torch_distributed``, where it ends the worker. A checkpoint storage error
(``CheckpointStorageError``) exits 1 after its one line (printed and reported where it was
raised); on any other exception it prints the traceback to stderr and exits 1 (the agent
reports the exit code).
"""

import os
import pathlib
import signal
import sys
import traceback

from det.harness import core, logs
from det.harness.entrypoint import load_trial_class
from det.harness.errors import CheckpointStorageError
from det.harness.trainer import Trainer
from det.harness.transport import DbTransport


def main(argv: list[str] | None = None) -> int:
    """Run the trial named by ``argv[0]`` (``module:Class``); returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m det.harness.run module:Class", file=sys.stderr)
        return 2
    try:
        trial_class = load_trial_class(args[0], pathlib.Path.cwd())
        transport = DbTransport.from_env()
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            # Under the launcher SIGTERM comes from torchrun stopping the workers because one
            # failed: the default (exit) is right, a checkpoint could not complete.
            signal.signal(signal.SIGTERM, lambda signum, frame: transport.request_preemption())
        with core.init(transport=transport) as ctx:
            # The config's checkpoint_policy, as Determined's legacy harness reads it.
            trainer = Trainer(trial_class, ctx)
            outcome = trainer.fit(checkpoint_policy=ctx.task_info.config.get("checkpoint_policy"))
    except CheckpointStorageError:
        return 1  # its one line says it all (det.harness.core.CheckpointContext)
    except Exception:
        traceback.print_exc()
        return 1
    logs.finished(outcome, trainer.end_reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
