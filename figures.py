"""One formatting rule for every figure det shows a person: the CLI's tables
(det.cli.output), the harness's log lines (det.harness.logs) and, in JavaScript, the WebUI
(core.js's ``fmt``, ``size`` and ``span``, which tests/test_format.py checks against these;
tables used to show ``0.9747596085071564``, raw JSON, sizes in bytes and ``False``).
Standard library only, so a task's harness can use it without the CLI's dependencies:

- a number: an integral value below 10^15 as its digits; any other to 4 significant digits,
  in exponent form (``1.235e+5``, ``2e-5``) where its exponent is below -4 or above 3
  (printf's ``%g``), trailing zeros dropped; halves round away from zero, as JavaScript's
  ``toPrecision`` does, so that both sides print the same digits;
- a size in bytes: ``B``, ``KiB``, ``MiB``, ``GiB`` or ``TiB`` (powers of 1024), the figure
  by the number rule (``117.7 MiB``);
- a duration: its two largest units, the second padded (``45s``, ``1m 05s``, ``2h 03m``,
  ``2d 04h``);
- a boolean: ``yes`` or ``no``.
"""

import math
from collections.abc import Mapping
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any

# Below this an integral value is shown as its digits; JavaScript's numbers hold integers
# exactly only up to 2^53 (about 9.007e15), so the WebUI could not show more.
_WHOLE_BELOW = 10**15

_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")

PROGRESS_KEYS = frozenset({"batches", "epochs"})
"""Keys Determined 0.38 adds to every metrics report (det.harness.trainer, unless the trial
reports its own): a trial's progress, shown in its own column or words, not as one more
metric (charts.js has the same set)."""


def number(v: float | int | bool | None) -> str:
    """``v`` by the module's number rule (``""`` for None, ``yes``/``no`` for a boolean,
    ``nan``, ``inf`` and ``-inf`` as such)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v) if abs(v) < _WHOLE_BELOW else number(float(v))
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v.is_integer() and abs(v) < _WHOLE_BELOW:
        return str(int(v))
    # Decimal(v) is the float's exact binary value: rounding it half up is what JavaScript's
    # toExponential and toFixed do (Python's own format rounds half to even).
    with localcontext(rounding=ROUND_HALF_UP):
        mantissa, _, exp = format(Decimal(v), ".3e").partition("e")
        e = int(exp)
        if e < -4 or e > 3:
            return f"{_trim(mantissa)}e{e:+d}"
        return _trim(format(Decimal(v), f".{3 - e}f"))


def size(n: int | float | None) -> str:
    """A size given in bytes, in the largest unit of ``B``, ``KiB`` ... ``TiB`` it reaches
    (``""`` for None)."""
    if n is None:
        return ""
    unit = 0
    value = float(n)
    while abs(value) >= 1024 and unit < len(_SIZE_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{number(value)} {_SIZE_UNITS[unit]}"


def duration(span: timedelta | float) -> str:
    """A span (or seconds) as a person reads it: ``45s``, ``1m 05s``, ``2h 03m``, ``2d 04h``
    (whole seconds, rounded down; a negative span, from clocks that differ a little, is
    ``0s``)."""
    total = span.total_seconds() if isinstance(span, timedelta) else span
    seconds = max(0, math.floor(total))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


def flatten(values: Mapping | None, prefix: str = "") -> dict[str, Any]:
    """A nested mapping (hyperparameters, metrics) as one level, nested keys joined by dots:
    ``{"optimizer": {"lr": 0.1}}`` is ``{"optimizer.lr": 0.1}`` (as charts.js's
    ``flatHparams`` does for the WebUI's columns).
    Anything but a mapping (None; det_user.json_shown's note on a document too deep) is ``{}``."""
    out: dict[str, Any] = {}
    if not isinstance(values, Mapping):
        return out
    for k, v in values.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _trim(digits: str) -> str:
    """``1.500`` -> ``1.5``, ``2.000`` -> ``2``: trailing zeros after the point say nothing."""
    return digits.rstrip("0").rstrip(".") if "." in digits else digits
