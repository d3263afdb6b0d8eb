"""What the pass decides about a live interactive task: whether det ends it now, and why.

Pure functions over one run's row (:class:`TaskRun`); the pass reads the rows and writes the
ends (:func:`det.reconciler.passes._tasks`). The rules (the spec's "Notebooks" and
"TensorBoards"; docs/architecture.md, "The servers inside interactive tasks"):

* a notebook, shell or TensorBoard whose server has not answered (no ``allocations.address``)
  ``start_timeout`` seconds after its run was reported RUNNING is ended: "the task's server did
  not answer within 2m0s";
* once it answered, one idle for its ``idle_timeout`` (seconds since ``tasks.last_activity``,
  which the task's own server reports and det serve's proxy touches) is ended: "idle for
  10m0s". A TensorBoard's timeout is the cluster's ``tensorboard_timeout`` (seed: 5 minutes
  without proxied traffic), or its own ``idle_timeout`` where that is shorter;
* a command is never ended by det on its own: it has no server, and nothing reports its use.

Durations in reasons are written as Go's ``time.Duration`` prints them, as Determined does.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

SERVER_KINDS = frozenset({"NOTEBOOK", "SHELL", "TENSORBOARD"})
"""Task kinds whose run serves a port (``tasks.type``): the ones idleness and the start
timeout apply to."""


@dataclass(frozen=True)
class TaskRun:
    """A live task's run as the pass reads it: ``kind`` (``tasks.type``), ``idle_timeout``
    (seconds, None: never idle; the expanded config's), ``last_activity`` (``tasks``),
    ``running_at`` (when the agent reported it RUNNING; None: not yet) and ``address`` (its
    server's host:port; None: not answering yet)."""

    kind: str
    idle_timeout: float | None
    last_activity: datetime
    running_at: datetime | None
    address: str | None


def go_duration(seconds: float) -> str:
    """``seconds`` as Go's ``time.Duration.String`` writes it: ``"10m0s"``, ``"2m0s"``,
    ``"1h0m0s"``, ``"20s"``, ``"1.5s"``, ``"500ms"``, ``"0s"`` (rounded to the nanosecond).

    Raises:
        ValueError: ``seconds`` is negative, infinite or NaN.
    """
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"a duration is a finite number of seconds >= 0, not {seconds}")
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:  # below a second Go picks the largest unit under it
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return _fraction(ns, size) + unit
    hours, ns = divmod(ns, 3_600_000_000_000)
    minutes, ns = divmod(ns, 60_000_000_000)
    out = _fraction(ns, 1_000_000_000) + "s"
    if hours or minutes:
        out = f"{minutes}m" + out
    if hours:
        out = f"{hours}h" + out
    return out


def _fraction(value: int, unit: int) -> str:
    """``value / unit`` in decimal, without trailing zeros (exact: integers only)."""
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{rest:0{digits}d}".rstrip("0")


def idle_reason(now: datetime, last_activity: datetime, idle_timeout: float | None) -> str | None:
    """``"idle for <idle_timeout>"`` once ``now`` is ``idle_timeout`` seconds or more past
    ``last_activity``, else None (also when ``idle_timeout`` is None: never idle)."""
    if idle_timeout is None or now - last_activity < timedelta(seconds=idle_timeout):
        return None
    return f"idle for {go_duration(idle_timeout)}"


def unanswered_reason(now: datetime, running_at: datetime | None, address: str | None,
                      start_timeout: float) -> str | None:
    """Why a server that has not answered ``start_timeout`` seconds after its run started
    running is ended, else None (it answered, or is not running yet, or has time left)."""
    if address is not None or running_at is None:
        return None
    if now - running_at < timedelta(seconds=start_timeout):
        return None
    return f"the task's server did not answer within {go_duration(start_timeout)}"


def end_reason(run: TaskRun, now: datetime, *, tensorboard_timeout: float,
               start_timeout: float) -> str | None:
    """Why det ends ``run`` now (see the module rules), or None to leave it running.
    ``tensorboard_timeout`` and ``start_timeout`` are seconds."""
    if run.kind not in SERVER_KINDS:
        return None
    if run.address is None:
        return unanswered_reason(now, run.running_at, run.address, start_timeout)
    timeout = run.idle_timeout
    if run.kind == "TENSORBOARD":
        timeout = tensorboard_timeout if timeout is None else min(timeout, tensorboard_timeout)
    return idle_reason(now, run.last_activity, timeout)
