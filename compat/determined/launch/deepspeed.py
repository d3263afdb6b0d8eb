"""``python3 -m determined.launch.deepspeed (--trial module:Class | SCRIPT ARGS)``: 0.38.1's
DeepSpeed launcher on det. Needs the ``deepspeed`` package (else one line naming it, exit 1).
det starts the workers through torchrun (:mod:`det.launch.torch_distributed`, one per slot,
the rendezvous det records), whose ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` environment
``deepspeed.init_distributed()`` reads, instead of DeepSpeed's ssh-based launcher; so
DeepSpeed launcher options (``[DEEPSPEED_ARGS...] --``) are refused, naming them."""

import sys

from det.launch.torch_distributed import main as torch_distributed_main
from det.launch.torch_distributed import split_args
from determined.launch._framework import fail, missing_package

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Launch as above; returns the exit code (1: deepspeed missing, launcher options given,
    or a worker failed)."""
    if (error := missing_package("deepspeed", "deepspeed")) is not None:
        return fail("deepspeed", error)
    overrides, script = split_args(argv)
    if overrides:
        return fail("deepspeed", f"DeepSpeed launcher options {' '.join(overrides)!r} are not "
                    "supported: det starts the workers through torchrun")
    return torch_distributed_main(script)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
