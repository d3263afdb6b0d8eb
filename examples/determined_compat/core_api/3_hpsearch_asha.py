"""Step 3 under adaptive ASHA as Determined 0.38 runs it: the trial trains until its own
length, or until the searcher stops it, which it learns from `should_preempt()` (it never
reads searcher operations). Each validation carries `batches`, the searcher's time metric;
a stopped trial saves a checkpoint and exits."""

import json
import logging
import time

import determined as det

MAX_BATCHES = 32


def train(core_context: det.core.Context, rate: float, pause: float) -> None:
    loss = 10.0
    for batch in range(1, MAX_BATCHES + 1):
        loss = loss * (1 - rate)
        time.sleep(pause)
        if batch % 4 == 0:
            core_context.train.report_training_metrics(steps_completed=batch,
                                                       metrics={"loss": loss})
            core_context.train.report_validation_metrics(
                steps_completed=batch, metrics={"loss": loss, "batches": batch})
        if core_context.preempt.should_preempt():
            with core_context.checkpoint.store_path({"steps_completed": batch}) as (path, _):
                (path / "state.json").write_text(json.dumps({"loss": loss, "batch": batch}))
            logging.info(f"stopped by the searcher after batch {batch}")
            return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info is not None else {"rate": 0.1, "pause": 0}
    with det.core.init() as core_context:
        train(core_context, float(hparams["rate"]), float(hparams["pause"]))
