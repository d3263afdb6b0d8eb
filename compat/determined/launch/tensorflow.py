"""``python3 -m determined.launch.tensorflow SCRIPT ARGS``: 0.38.1's TensorFlow launcher on
det. Needs the ``tensorflow`` package (else one line naming it, exit 1). det runs the script
as the trial's one worker, in the task's process group; a trial of
more than one slot or agent is refused, naming its size: det sets no ``TF_CONFIG`` for
TensorFlow's multi-worker strategies."""

import os
import subprocess
import sys

from det.errors import DetError
from det.launch.gang import plan_gang
from det.launch.torch_distributed import worker_command
from determined.launch._framework import fail, missing_package

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run the script as above and wait; returns its exit code, or 1 (tensorflow missing,
    more than one worker, a malformed task environment), 2 with no script."""
    if (error := missing_package("tensorflow", "tensorflow")) is not None:
        return fail("tensorflow", error)
    if not argv:
        print("usage: python3 -m determined.launch.tensorflow SCRIPT ARGS", file=sys.stderr)
        return 2
    try:
        command = worker_command(argv)
        plan = plan_gang(os.environ)
    except DetError as e:
        return fail("tensorflow", str(e))
    if plan.nnodes * plan.nproc_per_node > 1:
        return fail("tensorflow", f"the trial has {plan.nnodes * plan.nproc_per_node} "
                    "workers; det runs TensorFlow as one worker (slots_per_trial: 1)")
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
