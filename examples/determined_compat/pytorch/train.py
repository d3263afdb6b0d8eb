"""Train SineTrial with the Trainer API: `python3 train.py` off-cluster, or as an experiment's
entrypoint on a cluster."""

import logging

from model_def import SineTrial

import determined as det
from determined import pytorch

HPARAMS = {"global_batch_size": 32, "hidden": 16, "lr": 0.02}

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    latest = info.latest_checkpoint if info is not None else None
    hparams = None if info is not None else HPARAMS
    with pytorch.init(hparams=hparams) as train_context:
        trial = SineTrial(train_context)
        trainer = pytorch.Trainer(trial, train_context)
        trainer.fit(max_length=pytorch.Epoch(3), validation_period=pytorch.Batch(16),
                    latest_checkpoint=latest)
