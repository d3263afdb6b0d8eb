"""SQLSTATE -> det's error types: the one place a database error becomes a user-facing one.

det's SQL functions raise with chosen SQLSTATEs (``schema.sql``: ``no_data_found`` for a
missing object, ``invalid_parameter_value`` for a bad argument, ``check_violation`` for an
illegal state change, ...). The CLI (and any other front end) passes every ``psycopg.Error``
through :func:`translate` and shows the result as one line, never a raw driver message.
"""

import psycopg

from det.errors import DatabaseError, DetError, NotFoundError, StateError

# What a violated table constraint means to a user (constraints named by PostgreSQL's
# defaults: <table>_<column>_check).
CONSTRAINTS = {
    "jobs_weight_check": "weight: expected a finite number > 0 and at most 1e6",
    "agents_id_check": ("agent id: expected 1 to 63 letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit"),
    "jobs_priority_check": "priority: expected a whole number from 1 to 99",
}

_BY_STATE: dict[str, type[DetError]] = {
    "P0002": NotFoundError,  # no_data_found: the named object does not exist
    "23503": NotFoundError,  # foreign_key_violation: it names a pool/agent that does not exist
    "22023": DetError,  # invalid_parameter_value: a bad argument, named in the message
    "23514": StateError,  # check_violation: an illegal state change or value
    "28000": DetError,  # invalid_authorization_specification: a bad token
}


def translate(e: psycopg.Error) -> DetError:
    """The det error a user should see for ``e``: its type from the SQLSTATE, its message the
    function's own (which names the field or object), or a readable one for a known table
    constraint; a lost connection says the database is unavailable."""
    from det.db.retry import is_connection_lost

    if is_connection_lost(e):
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return DatabaseError(f"the database is unavailable: {first}")
    diag = e.diag
    message = CONSTRAINTS.get(diag.constraint_name or "") or diag.message_primary or str(e)
    return _BY_STATE.get(e.sqlstate or "", DatabaseError)(message)
