"""Step 4: train to the searcher's lengths (its operations), with the distributed context's
collectives, as scripts written for one or many workers do."""

import logging

import determined as det


def train(core_context: det.core.Context) -> None:
    step, total = 0, 0
    for op in core_context.searcher.operations():
        while step < op.length:
            total += sum(core_context.distributed.allgather(1))
            step += 1
            if step % 5 == 0 and core_context.distributed.rank == 0:
                core_context.train.report_training_metrics(steps_completed=step,
                                                           metrics={"total": total})
                op.report_progress(step)
        if core_context.distributed.rank == 0:
            core_context.train.report_validation_metrics(steps_completed=step,
                                                         metrics={"total": total})
            op.report_completed(total)
    if core_context.distributed.rank == 0:
        with core_context.checkpoint.store_path({"steps_completed": step}) as (path, _):
            (path / "total").write_text(str(total))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        train(core_context)
