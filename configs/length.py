"""Training lengths: ``{batches: N}``, ``{records: N}`` or ``{epochs: N}``.

Used by ``searcher.max_length``, ``min_validation_period`` and ``min_checkpoint_period``
(reference-facts §1.1, §3.2). det accepts only the unit form with an integer >= 1; the
reference's bare "unitless" integer is not accepted. Values are at most 2**63 - 1: lengths are
stored as PostgreSQL ``bigint``.
"""

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from det.configs.limits import INT64_MAX

Unit = Literal["batches", "records", "epochs"]
UNITS: tuple[Unit, ...] = ("batches", "records", "epochs")

LENGTH_EXPECTED = "expected {batches|records|epochs: int}"


@dataclass(frozen=True)
class Length:
    """A length in one unit; YAML/JSON form ``{unit: value}``, ``value`` >= 1."""

    unit: Unit
    value: int

    def to_json(self) -> dict[str, int]:
        """The config form, ``{"batches": 500}``."""
        return {self.unit: self.value}

    @classmethod
    def parse(cls, data: Any) -> "Length":
        """Accept a ``Length`` or a one-key mapping ``{batches|records|epochs: int}``, the int
        from 1 to 2**63 - 1.

        Raises ``PydanticCustomError`` ("expected {batches|records|epochs: int}") otherwise, so
        the error carries the field's location when used inside a model.
        """
        if isinstance(data, Length):
            return data
        if isinstance(data, dict) and len(data) == 1:
            ((unit, value),) = data.items()
            if (
                unit in UNITS
                and isinstance(value, int)
                and not isinstance(value, bool)
                and 1 <= value <= INT64_MAX
            ):
                return cls(unit, value)
        raise PydanticCustomError("length", LENGTH_EXPECTED)

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
        return {
            "type": "object",
            "description": "exactly one of batches, records, epochs",
            "properties": {unit: {"type": "integer", "minimum": 1, "maximum": INT64_MAX}
                           for unit in UNITS},
            "additionalProperties": False,
            "minProperties": 1,
            "maxProperties": 1,
        }
