"""Values of a change to a queued job: ``det job update``, ``det job update-batch``,
``det experiment set`` (spec: run-training-code, Modify the Job Queue).

Each value is checked as the experiment config checks the same setting (``resources.priority``,
``resources.weight``), so the CLI refuses what the config refuses, naming the field, before any
transaction starts. ``det_user.job_update`` in ``schema.sql`` applies the scheduler-dependent rules
(priority only under the priority scheduler, ...) and checks the values again.
"""

from typing import Annotated, Any

from pydantic import AfterValidator, Field, TypeAdapter

from det.configs.experiment import Priority, Weight
from det.configs.limits import INT64_MAX, Name, check_text
from det.configs.load import parse_value
from det.errors import ConfigError

JOB_FIELDS = ("priority", "weight", "resource-pool", "ahead-of", "behind-of")
"""The fields ``det_user.job_update`` changes, as the CLI spells them."""

_JobId = Annotated[int, Field(ge=1, le=INT64_MAX)]
_PoolName = Annotated[Name, Field(min_length=1), AfterValidator(check_text)]

_JOB_ID: TypeAdapter[int] = TypeAdapter(_JobId)
_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "priority": TypeAdapter(Priority),
    "weight": TypeAdapter(Weight),
    "resource-pool": TypeAdapter(_PoolName),
    "ahead-of": _JOB_ID,
    "behind-of": _JOB_ID,
}


def parse_job_id(value: int | str, path: str = "JOB_ID") -> int:
    """``value`` as a job id (1 to 2**63 - 1, the ``jobs.id`` bigint); ``ConfigError`` naming
    ``path`` otherwise."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ConfigError(path, f"expected a job id, got {value!r}")
    return int(parse_value(_JOB_ID, value, path))


def job_change(field: str, value: str, path: str | None = None) -> str:
    """The text ``det_user.job_update`` receives for setting ``field`` to ``value``.

    ``priority``: an integer 1-99; ``weight``: a finite number > 0, at most 1e6;
    ``resource-pool``: a pool name (1-255 characters of valid text); ``ahead-of`` /
    ``behind-of``: a job id.

    Raises:
        ConfigError: an unknown field, or a value that does not fit, naming ``path`` (default:
            the field) and what was expected.
    """
    where = path or field
    adapter = _ADAPTERS.get(field)
    if adapter is None:
        raise ConfigError(where, f"unknown job field {field!r}; expected one of "
                          f"{', '.join(JOB_FIELDS)}")
    return str(parse_value(adapter, value, where))
