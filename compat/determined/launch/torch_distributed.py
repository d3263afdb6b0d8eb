"""``python3 -m determined.launch.torch_distributed [TORCHRUN_OVERRIDES... --] (--trial
module:Class | SCRIPT_OR_MODULE ARGS)``: det's launcher (``det.launch.torch_distributed``)
under Determined's name. It starts one worker per slot through torchrun, with the
rendezvous det recorded for the allocation."""

import sys

from det.launch.torch_distributed import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
