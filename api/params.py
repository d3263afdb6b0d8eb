"""Integer parameters of the REST API, bounded by the PostgreSQL type of the column or
function argument they reach: a number past it is a 400 naming the parameter
(det.api.errors), not a database error. An int past ``integer`` passed to a det function
finds none of that signature; one past ``bigint`` overflows."""

from typing import Annotated

from fastapi import Path

INT_MAX = 2**31 - 1
"""PostgreSQL ``integer``: the serial ids (experiments, trials, projects) and slot ids."""

BIGINT_MAX = 2**63 - 1
"""PostgreSQL ``bigint``: the bigserial ids (jobs), offsets and row ids."""

IntId = Annotated[int, Path(ge=-INT_MAX - 1, le=INT_MAX)]
"""A path id of an ``integer`` column."""

BigId = Annotated[int, Path(ge=-BIGINT_MAX - 1, le=BIGINT_MAX)]
"""A path id of a ``bigint`` column."""
