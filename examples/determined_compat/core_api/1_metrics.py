"""Step 1: report training and validation metrics through the Core API."""

import logging

import determined as det


def train(core_context: det.core.Context, steps: int) -> None:
    total = 0.0
    for step in range(1, steps + 1):
        total += 0.5
        if step % 10 == 0:
            core_context.train.report_training_metrics(steps_completed=step,
                                                       metrics={"total": total})
            core_context.train.report_progress(step / steps)
    core_context.train.report_validation_metrics(steps_completed=steps, metrics={"total": total})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        train(core_context, steps=50)
