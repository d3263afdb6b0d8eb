"""Step 3: a hyperparameter search. Each trial reads its hyperparameters from the cluster info
and reports a validation metric the searcher compares; `batches` is the time metric."""

import logging

import determined as det

STEPS = 40


def train(core_context: det.core.Context, rate: float) -> None:
    loss = 10.0
    for step in range(1, STEPS + 1):
        loss = loss * (1 - rate)
        if step % 10 == 0:
            core_context.train.report_training_metrics(steps_completed=step,
                                                       metrics={"loss": loss})
            core_context.train.report_validation_metrics(
                steps_completed=step, metrics={"loss": loss, "batches": step})
            if core_context.preempt.should_preempt():
                return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info is not None else {"rate": 0.1}
    with det.core.init() as core_context:
        train(core_context, float(hparams["rate"]))
