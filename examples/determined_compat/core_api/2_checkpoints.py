"""Step 2: checkpoints. Resume from the latest one, save one every 10 steps, and stop
(after a checkpoint) when the platform asks, so that a paused trial resumes where it was."""

import json
import logging
import pathlib
import time

import determined as det

STEPS = 50


def save(path: pathlib.Path, total: float, step: int) -> None:
    (path / "state.json").write_text(json.dumps({"total": total, "step": step}))


def load(path: pathlib.Path) -> tuple[float, int]:
    state = json.loads((path / "state.json").read_text())
    return state["total"], state["step"]


def train(core_context: det.core.Context, latest_checkpoint: str | None, pause: float) -> None:
    total, start = 0.0, 0
    if latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            total, start = load(path)
        logging.info(f"resumed from {latest_checkpoint} at step {start}")
    for step in range(start + 1, STEPS + 1):
        total += 0.5
        time.sleep(pause)
        if step % 10 == 0:
            core_context.train.report_training_metrics(steps_completed=step,
                                                       metrics={"total": total})
            with core_context.checkpoint.store_path({"steps_completed": step}) as (path, uuid):
                save(path, total, step)
            if core_context.preempt.should_preempt():
                logging.info(f"preempted at step {step}")
                return
    core_context.train.report_validation_metrics(steps_completed=STEPS, metrics={"total": total})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    latest = info.latest_checkpoint if info is not None else None
    pause = float(info.trial.hparams.get("pause", 0)) if info is not None else 0.0
    with det.core.init() as core_context:
        train(core_context, latest, pause)
