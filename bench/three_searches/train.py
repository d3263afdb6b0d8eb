"""A Core API trial for bench/three_searches.py and tests/test_preemption_waste.py: no torch.
Hyperparameters: ``start_time`` seconds slept before the first batch (a real trial's imports
and data loading: a preemption then costs them again), ``step_time`` seconds per batch, a
checkpoint every ``checkpoint_every`` batches. Asked to stop (a preemption), it checkpoints
what it trained since its last checkpoint and exits 0, before its next batch; a later run
resumes at its latest checkpoint's batch."""

import time

from det.harness import core

with core.init() as ctx:
    hp = ctx.info.hparams
    pause, every = float(hp["step_time"]), int(hp["checkpoint_every"])
    step = saved = ctx.info.steps_completed or 0
    time.sleep(float(hp["start_time"]))

    def checkpoint() -> None:
        global saved
        with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
            (path / "step").write_text(str(step))
        saved = step

    for op in ctx.searcher.operations():
        while step < op.length:
            if ctx.preempt.should_preempt():
                if step > saved:
                    checkpoint()
                raise SystemExit(0)
            time.sleep(pause)
            step += 1
            if step % 5 == 0:
                ctx.train.report_training_metrics(steps_completed=step,
                                                  metrics={"loss": hp["x"] ** 2 + 1 / step})
            if step % every == 0:
                checkpoint()
        loss = hp["x"] ** 2 + 1 / step
        ctx.train.report_validation_metrics(steps_completed=step, metrics={"loss": loss})
        op.report_completed(loss)
