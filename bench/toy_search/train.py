"""A toy objective under the Core API: no torch, no data; each step costs almost nothing, so
the search's time is det's own (task start, reports, the searcher's hops)."""

import math

from det.harness import core

with core.init() as ctx:
    hp = ctx.info.hparams
    step = 0
    for op in ctx.searcher.operations():
        while step < op.length:
            step += 1
            loss = (hp["x"] - 0.3) ** 2 + 1.0 / math.sqrt(step) + 0.1 * hp["y"] ** 2
            ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
        ctx.train.report_validation_metrics(steps_completed=step, metrics={"loss": loss})
        op.report_completed(loss)
