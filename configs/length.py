"""Training lengths: ``{batches: N}``, ``{records: N}`` or ``{epochs: N}``.

Used by ``searcher.max_length`` (:class:`Length`) and ``min_validation_period`` /
``min_checkpoint_period`` (:class:`Period`) (Determined 0.38's searcher config defaults). A
length's value is
an integer >= 1, a period's >= 0, as Determined 0.38.1's schemas have them (``max_length`` is a
``check-positive-length.json``, the periods a ``length.json`` with ``minimum: 0`` and default
``{batches: 0}``: 0 means no periodic validation or checkpoint). A bare integer (the
reference's 0.38 "unitless" length, which its trainer counts in batches) means batches. Values
are at most 2**63 - 1: lengths are stored as PostgreSQL ``bigint``.
"""

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from det.configs.limits import INT64_MAX

Unit = Literal["batches", "records", "epochs"]
UNITS: tuple[Unit, ...] = ("batches", "records", "epochs")

LENGTH_EXPECTED = "expected {batches|records|epochs: int} or an int (batches)"
PERIOD_EXPECTED = "expected {batches|records|epochs: int >= 0} or an int (batches)"

UNBOUNDED = INT64_MAX
"""The length of a searcher op when the config sets no ``searcher.max_length``: the trial's
code decides how long it trains (``Trainer.fit(max_length=)`` or its own loop) and its clean
exit ends the trial."""


@dataclass(frozen=True)
class Length:
    """A length in one unit; YAML/JSON form ``{unit: value}``, ``value`` >= ``MINIMUM``."""

    MINIMUM = 1
    EXPECTED = LENGTH_EXPECTED

    unit: Unit
    value: int

    def to_json(self) -> dict[str, int]:
        """The config form, ``{"batches": 500}``."""
        return {self.unit: self.value}

    @classmethod
    def parse(cls, data: Any) -> "Length":
        """Accept a ``Length``, a one-key mapping ``{batches|records|epochs: int}`` or a bare
        int (batches), the int from ``MINIMUM`` to 2**63 - 1.

        Raises ``PydanticCustomError`` (``EXPECTED``) otherwise, so the error carries
        the field's location when used inside a model.
        """
        if isinstance(data, cls):
            return data
        if isinstance(data, int) and not isinstance(data, bool):
            data = {"batches": data}
        if isinstance(data, dict) and len(data) == 1:
            ((unit, value),) = data.items()
            if (
                unit in UNITS
                and isinstance(value, int)
                and not isinstance(value, bool)
                and cls.MINIMUM <= value <= INT64_MAX
            ):
                return cls(unit, value)
        raise PydanticCustomError("length", cls.EXPECTED)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse,
            serialization=core_schema.plain_serializer_function_ser_schema(cls.to_json),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"anyOf": [
            {
                "type": "object",
                "description": "exactly one of batches, records, epochs",
                "properties": {unit: {"type": "integer", "minimum": cls.MINIMUM,
                                      "maximum": INT64_MAX} for unit in UNITS},
                "additionalProperties": False,
                "minProperties": 1,
                "maxProperties": 1,
            },
            {"type": "integer", "minimum": cls.MINIMUM, "maximum": INT64_MAX,
             "description": "batches (Determined 0.38's unitless length)"},
        ]}


@dataclass(frozen=True)
class Period(Length):
    """``min_validation_period`` / ``min_checkpoint_period``: a length that may be 0, meaning
    no periodic validation or checkpoint (0.38.1's ``length.json``, ``minimum: 0``)."""

    MINIMUM = 0
    EXPECTED = PERIOD_EXPECTED
