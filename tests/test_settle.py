"""What the end of a run means for its trial (det.reconciler.trials.settle)."""

import pytest

from det.reconciler.trials import RunEnd, Settlement, settle


@pytest.mark.parametrize(("run", "expected"), [
    # a clean exit after a stop request, or with its ops done, leaves the trial as it was
    (RunEnd("ACTIVE", 0, 5, 0, None), Settlement("ACTIVE", 0, False)),
    (RunEnd("PAUSED", 1, 5, 0, None, stop_requested=True, open_op=True),
     Settlement("PAUSED", 1, False)),
    (RunEnd("ACTIVE", 0, 5, 0, None, stop_requested=True, open_op=True),
     Settlement("ACTIVE", 0, False)),
    # a clean exit with work left and no stop request: the code ended its own training
    (RunEnd("ACTIVE", 0, 5, 0, None, open_op=True), Settlement("ACTIVE", 0, False, close=True)),
    # ... unless the task was told its work was over: the op came later (a promotion)
    (RunEnd("ACTIVE", 0, 5, 0, None, open_op=True, out_of_work=True),
     Settlement("ACTIVE", 0, False)),
    # failures restart while max_restarts allows another restart; `restarts` counts the
    # restarts made, so the failure that ends the trial does not add one
    (RunEnd("ACTIVE", 0, 5, 1, None), Settlement("ACTIVE", 1, True)),
    (RunEnd("ACTIVE", 4, 5, None, "agent lost"), Settlement("ACTIVE", 5, True)),
    (RunEnd("ACTIVE", 5, 5, 137, None), Settlement("ERROR", 5, True)),
    (RunEnd("ACTIVE", 0, 0, 1, None), Settlement("ERROR", 0, True)),
    # a stopping trial stays stopping whatever the exit code; the pass's finishing step
    # (det_user.stopped_state) ends it once no run is left
    (RunEnd("STOPPING_CANCELED", 0, 5, 0, None), Settlement("STOPPING_CANCELED", 0, False)),
    (RunEnd("STOPPING_KILLED", 0, 5, -9, None), Settlement("STOPPING_KILLED", 0, True)),
    (RunEnd("STOPPING_COMPLETED", 2, 5, 0, None), Settlement("STOPPING_COMPLETED", 2, False)),
    (RunEnd("STOPPING_ERROR", 0, 5, 1, None), Settlement("STOPPING_ERROR", 0, True)),
])
def test_settle(run: RunEnd, expected: Settlement) -> None:
    assert settle(run) == expected
