"""``python3 -m determined.launch.horovod [[HVD_OVERRIDES...] --] (--trial module:Class |
SCRIPT ARGS)``: 0.38.1's Horovod launcher on det. Needs the ``horovod`` package (else one line
naming it, exit 1). It runs ``horovodrun -np N -H localhost:N`` over this agent's N slots,
with the overrides before ``--``; a trial spanning agents is refused (det starts no sshd for
horovodrun to reach the others: use ``determined.launch.torch_distributed`` there)."""

import os
import subprocess
import sys

from det.errors import DetError
from det.launch.gang import plan_gang
from det.launch.torch_distributed import split_args, worker_command
from determined.launch._framework import fail, missing_package

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Launch as above and wait; returns horovodrun's exit code, or 1 (horovod missing, more
    than one agent, a malformed task environment)."""
    if (error := missing_package("horovod", "horovod")) is not None:
        return fail("horovod", error)
    overrides, script = split_args(argv)
    try:
        command = worker_command(script)
        plan = plan_gang(os.environ)
    except DetError as e:
        return fail("horovod", str(e))
    if plan.nnodes > 1:
        return fail("horovod", f"the trial spans {plan.nnodes} agents; det runs horovodrun on "
                    "one agent only (use determined.launch.torch_distributed)")
    n = plan.nproc_per_node
    return subprocess.call([sys.executable, "-m", "horovod.runner.launch", "-np", str(n),
                            "-H", f"localhost:{n}", *overrides, *command])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
