"""The state vocabulary Python shares: which experiment and trial states are terminal.

schema.sql's enums ``experiment_state`` and ``trial_state`` list the states; a terminal one
is final, and an experiment's or trial's ``end_time`` is set exactly when it enters one.
"""

_TERMINAL_ORDER = ("COMPLETED", "CANCELED", "ERROR")

TERMINAL: frozenset[str] = frozenset(_TERMINAL_ORDER)
"""The states an experiment or a trial ends in."""

TERMINAL_SQL = "(" + ", ".join(f"'{s}'" for s in _TERMINAL_ORDER) + ")"
""":data:`TERMINAL` as an SQL list for ``state IN`` / ``NOT IN``, written out as literals
so the planner sees constants, as it did when each statement spelled them."""
