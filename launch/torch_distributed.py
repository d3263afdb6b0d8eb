"""``python -m det.launch.torch_distributed [TORCHRUN_OVERRIDES... --] SCRIPT_OR_MODULE ARGS``

Starts one worker per slot this agent holds for the trial, through PyTorch's torchrun
(:func:`torch.distributed.run.main`): det supplies ``--nnodes``, ``--nproc-per-node``,
``--node-rank`` and the rendezvous endpoint (``--master-addr`` / ``--master-port``: the
chief's address and a free port there, which the chief's launcher records in the database
and the other agents' launchers read; see :mod:`det.launch.gang`). torchrun does the rest:
it sets ``RANK``, ``WORLD_SIZE``, ... for each worker and, as ``--max-restarts 0`` asks,
stops every worker as soon as one fails, then exits non-zero, which ends the allocation
(the trial restarts from its checkpoint). Spec: system-architecture.rst, "Distributed
Training"; the form is Determined's ``determined.launch.torch_distributed``.

SCRIPT_OR_MODULE is
* ``module:Class`` (or ``--trial module:Class``): a ``PyTorchTrial``, run by det's harness;
* ``script.py ARGS``: a Python script, under this interpreter;
* ``-m module ARGS``: a Python module, under this interpreter;
* any other command, run as is (``python3 train.py --epochs 3``).
Arguments before ``--`` go to torchrun as overrides (``--monitor-interval 1``).

Each worker runs under :mod:`det.launch.wrap_rank` (output tagged ``[rank=N]``, dies with
its launcher). Workers wait at most ``DET_RENDEZVOUS_TIMEOUT`` seconds (default 300) for one
another, then fail naming the ranks and agents missing.
"""

import os
import re
import signal
import sys
from typing import Any

from det.errors import DetError
from det.launch.gang import GangPlan, plan_gang

USAGE = ("usage: python -m det.launch.torch_distributed [TORCHRUN_OVERRIDES... --] "
         "(--trial module:Class | module:Class | script.py ARGS | -m module ARGS | COMMAND ARGS)")

TRIAL_CLASS = re.compile(r"^[a-zA-Z0-9_.]+:[a-zA-Z0-9_]+$")


def worker_command(args: list[str]) -> list[str]:
    """The command each worker runs for SCRIPT_OR_MODULE ``args`` (see the module doc).

    Raises ``DetError`` for ``--trial`` or ``-m`` without their argument.
    """
    python = sys.executable
    head, rest = args[0], args[1:]
    if head == "--trial":
        if len(rest) != 1:
            raise DetError("--trial: expected one module:Class")
        return [python, "-m", "det.harness.run", rest[0]]
    if TRIAL_CLASS.match(head):
        return [python, "-m", "det.harness.run", head, *rest]
    if head == "-m":
        if not rest:
            raise DetError("-m: expected a module name")
        return [python, "-m", *rest]
    if head.endswith(".py"):
        return [python, *args]
    return list(args)


def torchrun_args(plan: GangPlan, overrides: list[str], command: list[str]) -> list[str]:
    """torchrun's command line for ``plan``; ``overrides`` come after det's own flags, so
    they win."""
    return [
        "--nnodes", str(plan.nnodes),
        "--nproc-per-node", str(plan.nproc_per_node),
        "--node-rank", str(plan.node_rank),
        "--master-addr", plan.master_addr,
        "--master-port", str(plan.master_port),
        "--rdzv-conf", f"timeout={int(plan.timeout)}",
        "--max-restarts", "0",
        *overrides,
        "--no-python",
        sys.executable, "-m", "det.launch.wrap_rank", *command,
    ]


def describe_failures(failures: dict[int, Any]) -> str:
    """``rank R exited with CODE`` for each failed worker (``failures``: torchrun's, by global
    rank), leaving out those that only died of the SIGTERM torchrun sent to stop them."""
    causes = {r: f for r, f in failures.items() if f.exitcode != -signal.SIGTERM} or failures
    return "; ".join(f"rank {r} exited with {_code(f.exitcode)}" for r, f in sorted(causes.items()))


def _code(code: int) -> str:
    return f"{code} ({signal.Signals(-code).name})" if code < 0 else str(code)


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(torchrun overrides, SCRIPT_OR_MODULE ARGS): overrides are what comes before the
    first ``--``; without one, everything is the script."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return [], argv


def main(argv: list[str] | None = None) -> int:
    """Launch the workers as above and wait for them; returns the exit code (0 when every
    worker succeeded, 1 when one failed or the gang could not meet, 2 for a bad command
    line, with the usage)."""
    args = sys.argv[1:] if argv is None else argv
    overrides, script = split_args(args)
    if not script or script[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0 if script else 2
    try:
        command = worker_command(script)
        plan = plan_gang(os.environ)
    except DetError as e:
        print(f"det.launch: {e}", file=sys.stderr)
        print(USAGE, file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    os.environ.update(plan.worker_env(os.environ))
    print(f"det.launch: node {plan.node_rank} of {plan.nnodes} "
          f"({plan.nproc_per_node} worker(s) here), chief at "
          f"{plan.master_addr}:{plan.master_port}", file=sys.stderr, flush=True)
    try:
        torchrun(torchrun_args(plan, overrides, command))
    except ChildFailedError as e:
        print(f"det.launch: worker failed: {describe_failures(e.failures)}; the other "
              "workers were stopped", file=sys.stderr)
        return 1
    except Exception as e:  # torchrun's rendezvous errors: name the agents that never came
        print(f"det.launch: {plan.describe_failure(e)}", file=sys.stderr)
        return 1
    finally:
        plan.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
