"""The vocabulary of why a trial ended early: one enum, shared by SQL and Python.

The task reports it (``det_task.report_early_exit``, Core API ``report_early_exit``), the trial
records it (``trials.exit_reason``) and the searcher is told it (``TrialExitedEarly``). The
database holds the same labels as the enum type ``early_exit_reason`` (``schema.sql``); a test
keeps the two equal. Names follow Determined's Core API ``EarlyExitReason``.
"""

from enum import StrEnum


class EarlyExitReason(StrEnum):
    """``errored``: the trial failed past its restarts (a searcher failure); ``invalid_hp``: the
    user's code rejected its hyperparameters (searchers may replace the trial);
    ``user_requested_stop``: the user's code ended the trial on purpose."""

    ERRORED = "errored"
    INVALID_HP = "invalid_hp"
    USER_REQUESTED_STOP = "user_requested_stop"
