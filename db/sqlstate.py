"""SQLSTATE -> det's error types: the one place a database error becomes a user-facing one.

det's SQL functions raise with chosen SQLSTATEs (``schema.sql``: ``no_data_found`` for a
missing object, ``invalid_parameter_value`` for a bad argument, ``check_violation`` for an
illegal state change, ...). The CLI (and any other front end) passes every ``psycopg.Error``
through :func:`translate` and shows the result as one line, never a raw driver message.
"""

import re

import psycopg

from det.errors import (
    AuthError,
    DatabaseError,
    DetError,
    NotFoundError,
    PermissionDeniedError,
    StateError,
)

# What a violated table constraint means to a user (constraints named by PostgreSQL's
# defaults: <table>_<column>_check, <table>_<column>_fkey). ``{key}`` stands for the value
# the error's detail names (``Key (uuid)=(...)``).
CONSTRAINTS = {
    "jobs_weight_check": "weight: expected a finite number > 0 and at most 1e6",
    "agents_id_check": ("agent id: expected 1 to 63 letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit"),
    "jobs_priority_check": "priority: expected a whole number from 1 to 99",
    # A registered checkpoint is pinned (schema.sql, model_versions).
    "model_versions_checkpoint_uuid_fkey": (
        "checkpoint {key} is registered in the model registry and cannot be deleted; "
        "delete its model versions first (det model delete-version)"),
    "models_name_lower": ("model name: a model of that name already exists (names are "
                          "compared regardless of case)"),
}

# Constraints whose violation is not what their SQLSTATE usually means: deleting a pinned
# checkpoint is an illegal action on an object that exists, not a missing one.
_CONSTRAINT_TYPES: dict[str, type[DetError]] = {
    "model_versions_checkpoint_uuid_fkey": StateError,
}

_KEY = re.compile(r"^Key \(.*?\)=\((.*)\)")

_BY_STATE: dict[str, type[DetError]] = {
    "P0002": NotFoundError,  # no_data_found: the named object does not exist
    "23503": NotFoundError,  # foreign_key_violation: it names a pool/agent that does not exist
    "22023": DetError,  # invalid_parameter_value: a bad argument, named in the message
    "23505": DetError,  # unique_violation: a name already taken, named in the message
    "23514": StateError,  # check_violation: an illegal state change or value
    "28000": AuthError,  # invalid_authorization_specification: a bad token
    "28P01": AuthError,  # invalid_password: PostgreSQL refused a login
    # insufficient_privilege: det_internal.require, or a table grant
    "42501": PermissionDeniedError,
    "2BP01": StateError,  # dependent_objects_still_exist: a workspace that still holds work
    # Values PostgreSQL cannot hold, sent by a client (the API answered 503):
    "22003": DetError,  # numeric_value_out_of_range: an id or offset past bigint
    "22P05": DetError,  # untranslatable_character: \u0000 in JSON text
    "22021": DetError,  # character_not_in_repertoire: bytes that are not UTF-8
}

_BAD_VALUE_PREFIX = {"22003", "22P05", "22021"}
"""SQLSTATEs whose message (``bigint out of range``) names no field: it gets a lead saying
that a value of the request was refused."""


def translate(e: psycopg.Error) -> DetError:
    """The det error a user should see for ``e``: its type from the SQLSTATE, its message the
    function's own (which names the field or object), or a readable one for a known table
    constraint; a value the database cannot hold (a number past bigint, a NUL byte, text
    that is not UTF-8) is bad input (DetError: 400 in the API); a lost connection says the
    database is unavailable."""
    from det.db.retry import is_connection_lost

    if is_connection_lost(e):
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return DatabaseError(f"the database is unavailable: {first}")
    if isinstance(e, psycopg.DataError) and e.sqlstate is None:
        # psycopg refused to send it (text with a NUL byte, an int past numeric's range)
        return DetError(f"a value cannot be stored: {e}")
    diag = e.diag
    message = CONSTRAINTS.get(diag.constraint_name or "")
    if message is not None:
        key = _KEY.match(diag.message_detail or "")
        message = message.format(key=key.group(1) if key else "?")
    else:
        message = diag.message_primary or str(e)
    kind = (_CONSTRAINT_TYPES.get(diag.constraint_name or "")
            or _BY_STATE.get(e.sqlstate or "", DatabaseError))
    if e.sqlstate in _BAD_VALUE_PREFIX:
        message = f"a value cannot be stored: {message}"
    return kind(message)
