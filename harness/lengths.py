"""Training lengths in the units of the experiment config, converted to batches.

Config lengths (``searcher.max_length``, ``min_validation_period``, ``min_checkpoint_period``)
are one-key maps ``{batches|records|epochs: N}`` (Determined 0.38's searcher config defaults). The
trainer
works in batches of ``hyperparameters.global_batch_size`` records; an epoch is
``records_per_epoch`` records. Conversions to batches round up so that a length is never cut
short.
"""

import abc
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from det.errors import ConfigError

UNITS = ("batches", "records", "epochs")


@dataclass(frozen=True)
class TrainUnit(abc.ABC):
    """A length given in code (``Trainer.fit(max_length=Batch(100))``, 0.38's
    ``pytorch.Batch`` / ``pytorch.Epoch``): ``value`` >= 1 of a unit."""

    value: int

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 1:
            raise ValueError(f"{type(self).__name__}: expected an int >= 1, got {self.value!r}")

    @abc.abstractmethod
    def to_batches(self, batches_per_epoch: int) -> int:
        """This length in batches, an epoch being ``batches_per_epoch`` batches."""


@dataclass(frozen=True)
class Batch(TrainUnit):
    """``value`` batches."""

    def to_batches(self, batches_per_epoch: int) -> int:
        return self.value


@dataclass(frozen=True)
class Epoch(TrainUnit):
    """``value`` passes over the training data loader."""

    def to_batches(self, batches_per_epoch: int) -> int:
        return self.value * batches_per_epoch


@dataclass(frozen=True)
class UnitConverter:
    """Converts between batches and one config unit.

    ``global_batch_size`` (records per batch) and ``records_per_epoch`` may be ``None`` when
    unknown; they are only required by the conversions that need them, which raise
    ``det.errors.ConfigError`` naming the missing key.
    """

    global_batch_size: int | None
    records_per_epoch: int | None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], hparams: Mapping[str, Any]) -> "UnitConverter":
        """Read ``hparams["global_batch_size"]`` and ``config["records_per_epoch"]`` (0 = unset)."""
        gbs = hparams.get("global_batch_size")
        rpe = config.get("records_per_epoch") or None
        return cls(int(gbs) if gbs is not None else None, int(rpe) if rpe is not None else None)

    def _gbs(self, unit: str) -> int:
        if not self.global_batch_size or self.global_batch_size < 1:
            raise ConfigError(
                "hyperparameters.global_batch_size",
                f"a positive int is required to convert a length in {unit} to batches",
            )
        return self.global_batch_size

    def _rpe(self) -> int:
        if not self.records_per_epoch or self.records_per_epoch < 1:
            raise ConfigError(
                "records_per_epoch", "a positive int is required for lengths in epochs"
            )
        return self.records_per_epoch

    def to_batches(self, value: float, unit: str) -> int:
        """``value`` in ``unit`` -> whole batches (rounded up).

        records: ``ceil(records / global_batch_size)``;
        epochs: ``ceil(epochs * records_per_epoch / global_batch_size)``.
        Raises ``ConfigError`` for an unknown unit or a missing size.
        """
        if unit == "batches":
            return math.ceil(value)
        if unit == "records":
            return math.ceil(value / self._gbs(unit))
        if unit == "epochs":
            return math.ceil(value * self._rpe() / self._gbs(unit))
        raise ConfigError("searcher.max_length", f"unknown unit {unit!r}; expected one of {UNITS}")

    def from_batches(self, batches: int, unit: str) -> float:
        """Whole batches -> a (possibly fractional) amount of ``unit`` (inverse of to_batches)."""
        if unit == "batches":
            return float(batches)
        if unit == "records":
            return float(batches * self._gbs(unit))
        if unit == "epochs":
            return batches * self._gbs(unit) / self._rpe()
        raise ConfigError("searcher.max_length", f"unknown unit {unit!r}; expected one of {UNITS}")

    def length_to_batches(self, length: Mapping[str, Any] | None, path: str) -> int | None:
        """A config length map ``{unit: N}`` -> batches; ``None``/empty or N == 0 -> ``None``.

        ``path`` names the config key in the ``ConfigError`` raised for a malformed length.
        """
        if not length:
            return None
        unit, value = parse_length(length, path)
        return self.to_batches(value, unit) or None


def parse_length(length: Any, path: str) -> tuple[str, int]:
    """``{unit: N}`` -> ``(unit, N)``; raises ``ConfigError`` at ``path`` if malformed."""
    if isinstance(length, Mapping) and len(length) == 1:
        ((unit, value),) = length.items()
        if unit in UNITS and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return unit, value
    raise ConfigError(path, f"expected {{batches|records|epochs: int}}, got {length!r}")
