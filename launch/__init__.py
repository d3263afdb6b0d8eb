"""det.launch: launchers that start a trial's workers on the slots det gave it.

``python -m det.launch.torch_distributed [TORCHRUN_OVERRIDES... --] SCRIPT_OR_MODULE ARGS``
starts one worker per slot through PyTorch's own torchrun (:mod:`torch.distributed.run`);
:mod:`det.launch.wrap_rank` runs each worker, tagging its output lines with its rank.
"""
