"""``determined.launch``: the launchers Determined's entrypoints name
(``python3 -m determined.launch.torch_distributed ...``, ``determined.launch.wrap_rank``), and
``deepspeed`` / ``horovod`` / ``tensorflow``, which run where their framework is installed."""
