"""Hyperparameter values: random samples and grid points (Determined 0.38's ``hyperparameters.go``,
``grid.go``)."""

import copy
import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from det.configs import (
    CategoricalHP,
    ConstHP,
    DoubleHP,
    Hyperparameter,
    IntHP,
    LogHP,
    NestedHP,
    iter_leaves,
)


def sample(
    hparams: NestedHP | Mapping[str, Hyperparameter], rng: np.random.RandomState
) -> dict[str, Any]:
    """Draw one value per hyperparameter, names in sorted order, nested maps recursively.

    int: ``randint(minval, maxval + 1)`` (maxval inclusive); double: ``uniform(minval, maxval)``;
    log: ``base ** uniform(minval, maxval)``; categorical: ``vals[randint(0, len(vals))]``.
    """
    definitions = hparams.root if isinstance(hparams, NestedHP) else hparams
    return {name: _sample_one(definitions[name], rng) for name in sorted(definitions)}


def _sample_one(hp: Hyperparameter, rng: np.random.RandomState) -> Any:
    if isinstance(hp, ConstHP):
        return copy.deepcopy(hp.val)
    if isinstance(hp, IntHP):
        return int(rng.randint(hp.minval, hp.maxval + 1))
    if isinstance(hp, DoubleHP):
        return float(rng.uniform(hp.minval, hp.maxval))
    if isinstance(hp, LogHP):
        return float(hp.base ** rng.uniform(hp.minval, hp.maxval))
    if isinstance(hp, CategoricalHP):
        return copy.deepcopy(hp.vals[int(rng.randint(0, len(hp.vals)))])
    return sample(hp, rng)


def round_half_away(x: float) -> int:
    """Go's ``int(math.Round(x))``: halves round away from zero (Python's ``round`` does not)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def grid_axis(hp: ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP | None) -> list[Any]:
    """The values of one grid axis (``count`` must be set on int/double/log).

    int: ``n = min(count, maxval - minval + 1)`` points ``minval + i*(maxval-minval)/(n-1)``
    rounded half away from zero (the midpoint if ``n == 1``); double: ``count`` evenly
    spaced points, endpoints included; log: ``base ** x`` over the same spacing of the
    exponents. ``None`` (an empty nested map) is the single value ``{}``.
    """
    if hp is None:
        return [{}]
    if isinstance(hp, ConstHP):
        return [hp.val]
    if isinstance(hp, CategoricalHP):
        return list(hp.vals)
    if hp.count is None:
        raise ValueError("grid hyperparameters need a count")
    if isinstance(hp, IntHP):
        count = min(hp.count, hp.maxval - hp.minval + 1)
        if count == 1:
            return [round_half_away((hp.minval + hp.maxval) / 2.0)]
        span = hp.maxval - hp.minval
        return [round_half_away(hp.minval + (i * span) / (count - 1)) for i in range(count)]
    exponents = _linspace(hp.minval, hp.maxval, hp.count)
    if isinstance(hp, DoubleHP):
        return exponents
    return [hp.base**x for x in exponents]


def _linspace(lo: float, hi: float, count: int) -> list[float]:
    if count == 1:
        return [(lo + hi) / 2.0]
    return [lo + i * (hi - lo) / (count - 1) for i in range(count)]


def grid_points(hparams: NestedHP) -> list[dict[str, Any]]:
    """Every grid point: the Cartesian product of the axes in sorted name order (nested keys
    sorted too), the first name the outer loop and the last axis varying fastest."""
    axes = list(iter_leaves(hparams))
    points = []
    for combo in itertools.product(*(grid_axis(hp) for _, hp in axes)):
        point: dict[str, Any] = {}
        for (route, _), value in zip(axes, combo, strict=True):
            node = point
            for key in route[:-1]:
                node = node.setdefault(key, {})
            node[route[-1]] = copy.deepcopy(value)
        points.append(point)
    return points
