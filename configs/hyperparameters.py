"""Hyperparameter definitions (Determined 0.38's ``hyperparameters.go``).

The ``hyperparameters`` map of an experiment config holds, per name, one of:

* a bare scalar or list: an implicit constant (expanded to ``{type: const, val: ...}``);
* ``{type: const, val}``;
* ``{type: int, minval, maxval, count?}`` (ints; sampled inclusive of ``maxval``);
* ``{type: double, minval, maxval, count?}``;
* ``{type: log, minval, maxval, base, count?}`` (values are ``base ** x``; ``base`` required);
* ``{type: categorical, vals: [...]}``;
* a map without a ``type`` key: nested hyperparameters, to any depth.

``count`` (>= 1) is the number of grid points; the grid searcher requires it on every
int/double/log hyperparameter (checked in ``det.configs.experiment``).
"""

import math
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    Tag,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from det.configs.limits import Int64


def _check_maxval(maxval: float, info: ValidationInfo) -> float:
    minval = info.data.get("minval")
    if minval is not None and maxval < minval:
        raise PydanticCustomError(
            "hp_range",
            "expected maxval >= minval ({minval}), got {maxval}",
            {"minval": minval, "maxval": maxval},
        )
    return maxval


def _finite_range(maxval: float, info: ValidationInfo) -> float:
    """Samples are ``minval + (maxval - minval) * u``: the span must be a finite number."""
    minval = info.data.get("minval")
    if minval is not None and not math.isfinite(maxval - minval):
        raise PydanticCustomError(
            "hp_range", "maxval - minval is not a finite number ({maxval} - {minval})",
            {"minval": minval, "maxval": maxval},
        )
    return maxval


class ConstHP(BaseModel):
    """``{type: const, val}``; a bare non-map value is read as this."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["const"] = "const"
    val: Any

    @model_validator(mode="before")
    @classmethod
    def _implicit(cls, data: Any) -> Any:
        return data if isinstance(data, Mapping) else {"type": "const", "val": data}


class IntHP(BaseModel):
    """``{type: int, minval, maxval, count?}``; ``minval <= maxval``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["int"]
    minval: Int64
    maxval: Int64
    count: Annotated[int, Field(ge=1)] | None = None

    _maxval = field_validator("maxval")(_check_maxval)


class DoubleHP(BaseModel):
    """``{type: double, minval, maxval, count?}``; ``minval <= maxval``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["double"]
    minval: float
    maxval: float
    count: Annotated[int, Field(ge=1)] | None = None

    _maxval = field_validator("maxval")(_check_maxval)
    _span = field_validator("maxval")(_finite_range)


class LogHP(BaseModel):
    """``{type: log, minval, maxval, base, count?}``: values ``base ** x``, x in the range.

    ``base`` is > 0 and not 1 (every value would be 1); ``base ** minval`` and
    ``base ** maxval`` must be finite numbers (the values lie between them).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["log"]
    minval: float
    maxval: float
    base: Annotated[float, Field(gt=0)]
    count: Annotated[int, Field(ge=1)] | None = None

    _maxval = field_validator("maxval")(_check_maxval)
    _span = field_validator("maxval")(_finite_range)

    @field_validator("base")
    @classmethod
    def _not_one(cls, base: float) -> float:
        if base == 1:
            raise PydanticCustomError("log_base", "expected a number > 0 other than 1, got 1")
        return base

    @model_validator(mode="after")
    def _finite_values(self) -> "LogHP":
        for key in ("minval", "maxval"):
            exponent = getattr(self, key)
            try:
                value = self.base**exponent
            except OverflowError:
                value = math.inf
            if not math.isfinite(value):
                raise PydanticCustomError(
                    "log_range", "{base} ** {exponent} is not a finite number",
                    {"base": self.base, "exponent": exponent, "field": key})
        return self


class CategoricalHP(BaseModel):
    """``{type: categorical, vals: [...]}`` with at least one value."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["categorical"]
    vals: Annotated[list[Any], Field(min_length=1)]


def _hp_kind(value: Any) -> str:
    """The union tag of a raw or parsed hyperparameter: its ``type``, ``nested`` or ``const``."""
    if isinstance(value, Mapping):
        if "type" not in value:
            return "nested"
        return str(value["type"])
    if isinstance(value, NestedHP):
        return "nested"
    if isinstance(value, BaseModel):
        return str(value.type)  # type: ignore[attr-defined]
    return "const"


# A constant may be written bare (any non-map value) or as ``{type: const, val}``.
_CONST_JSON_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": ["number", "string", "boolean", "null", "array"]},
        {
            "type": "object",
            "properties": {"type": {"const": "const"}, "val": {}},
            "required": ["type", "val"],
            "additionalProperties": False,
        },
    ]
}

Hyperparameter = Annotated[
    Annotated[ConstHP, Tag("const"), WithJsonSchema(_CONST_JSON_SCHEMA)]
    | Annotated[IntHP, Tag("int")]
    | Annotated[DoubleHP, Tag("double")]
    | Annotated[LogHP, Tag("log")]
    | Annotated[CategoricalHP, Tag("categorical")]
    | Annotated["NestedHP", Tag("nested")],
    Discriminator(
        _hp_kind,
        custom_error_type="bad_union_tag:type",
        custom_error_message="expected one of const|int|double|log|categorical",
    ),
]
"""One hyperparameter definition; see the module docstring."""


class NestedHP(RootModel[dict[str, Hyperparameter]]):
    """A map of hyperparameters (a map without a ``type`` key)."""

    model_config = ConfigDict(frozen=True, json_schema_extra={"not": {"required": ["type"]}})


NestedHP.model_rebuild()

Hyperparameters = NestedHP
"""The ``hyperparameters`` section: a map name -> definition (``.root`` is the dict)."""

Leaf = ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP


def grid_axis_size(hp: Leaf | None) -> int:
    """The number of values of ``hp``'s grid axis (Determined 0.38's ``grid.go``): int
    ``min(count, maxval - minval + 1)``, double and log ``count``, categorical its values, a
    constant or an empty nested map 1. ``count`` must be set on int/double/log."""
    if isinstance(hp, IntHP):
        return min(hp.count or 1, hp.maxval - hp.minval + 1)
    if isinstance(hp, (DoubleHP, LogHP)):
        return hp.count or 1
    if isinstance(hp, CategoricalHP):
        return len(hp.vals)
    return 1


def iter_leaves(
    hparams: NestedHP | Mapping[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Leaf | None]]:
    """Yield ``(route, definition)`` for every leaf, names sorted at each level.

    ``route`` is the key path (``("optimizer", "lr")``). An empty nested map yields itself
    once with definition ``None`` (the grid gives it the single value ``{}``, §1.5).
    """
    if isinstance(hparams, NestedHP):
        hparams = hparams.root
    for name in sorted(hparams):
        hp = hparams[name]
        route = (*prefix, name)
        if isinstance(hp, NestedHP):
            if hp.root:
                yield from iter_leaves(hp.root, route)
            else:
                yield route, None
        else:
            yield route, hp
