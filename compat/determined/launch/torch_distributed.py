"""``python3 -m determined.launch.torch_distributed [--trial module:Class | [--] CMD ...]``.

det's launcher (``det.launch.torch_distributed``, issue 12) starts one worker per slot through
torchrun and does the rendezvous; this module is that launcher under Determined's name. Where
det was installed without it, a task runs one process: ``--trial module:Class`` runs the trial
with det's harness (``det.harness.run``), any other command runs as given.
"""

import importlib
import subprocess
import sys


def main(argv: list[str]) -> int:
    """Launch ``argv`` (the arguments after the module name); returns the exit code."""
    try:
        launcher = importlib.import_module("det.launch.torch_distributed")
    except ModuleNotFoundError as e:
        if e.name not in ("det.launch", "det.launch.torch_distributed"):
            raise
        launcher = None
    if launcher is not None:
        return int(launcher.main(argv))
    args = argv[1:] if argv[:1] == ["--"] else argv
    if len(args) == 2 and args[0] == "--trial":
        from det.harness import run

        return run.main([args[1]])
    if not args:
        print("usage: python3 -m determined.launch.torch_distributed "
              "[--trial module:Class | [--] CMD ...]", file=sys.stderr)
        return 2
    return subprocess.call(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
