"""Bounds on what a config may hold, and the check that its values are storable JSON.

A config becomes a JSONB row that every reconciler pass reads back, so its size is bounded
where the text enters (``det.configs.load``) and every value must survive PostgreSQL's JSON:

* ``MAX_CONFIG_BYTES`` (1 MiB): a config file, and the text of all its values once YAML aliases
  are expanded. Configs are hand-written settings; the largest real ones (long categorical
  lists, a ``data`` section) are tens of KiB, so 1 MiB leaves ample room while keeping each
  parse (PyYAML's pure-Python parser: seconds for the densest 1 MiB), each stored copy and
  each read by a pass cheap.
* ``MAX_CONFIG_NODES`` (100,000): values (mappings, lists, scalars, keys) once aliases are
  expanded. The bound exists for alias expansion ("billion laughs"), which multiplies values
  without adding text; it is checked on the parsed graph, before anything is expanded. No
  real config holds that many values (a list of 100,000 numbers would be better data than
  settings); pydantic validates them in milliseconds.
* ``MAX_CONFIG_DEPTH`` (64): nesting of mappings and lists. det's own sections nest four deep;
  parsers and validators recurse once per level, and Python's stack ends near 1,000 (so det
  keeps PyYAML's pure-Python loader, whose composer it can stop: the C loader crashes the
  process on deep nesting).
* ``MAX_NAME_CHARS`` (255) for names, labels and metric names, shown in one table cell (and
  printable for the same reason); ``MAX_DESCRIPTION_CHARS`` (4,096) for the free-text
  description.
* ``INT32_MAX`` / ``INT64_MAX``: integers stored in PostgreSQL ``integer`` / ``bigint`` columns.
* ``MAX_TRIALS`` (10,000): trials one search may create (``max_trials``, grid points). The
  searcher creates up to this many rows in one pass and keeps a grid's remaining points in
  its state, rewritten at every decision.
"""

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_NODES = 100_000
MAX_CONFIG_DEPTH = 64
MAX_NAME_CHARS = 255
MAX_DESCRIPTION_CHARS = 4096
MAX_TRIALS = 10_000
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
"""A count stored in a PostgreSQL ``integer``: 0 to 2**31 - 1."""

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
"""An integer that fits a PostgreSQL ``bigint`` (and numpy's int64)."""


def _non_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("blank", "expected a non-blank string, got {text}",
                                  {"text": repr(text)})
    return text


def _printable(text: str) -> str:
    if not text.isprintable():
        raise PydanticCustomError(
            "printable", "expected printable text (no line breaks or control characters), "
            "got {text}", {"text": repr(text)})
    return text


Name = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(_printable)]
"""A name or label: printable text (it is shown in one table cell), at most ``MAX_NAME_CHARS``
characters."""

MetricName = Annotated[Name, AfterValidator(_non_blank)]
"""The name of a reported metric: non-blank, at most ``MAX_NAME_CHARS`` characters."""


def _text_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text`` (NUL, or a lone UTF-16 surrogate), or None."""
    if "\0" in text:
        return "expected text without NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"expected valid Unicode text, got a lone surrogate {text[e.start]!r}"
    return None


def check_text(text: str) -> str:
    """``text``, unless it holds a NUL character or a lone surrogate, which neither PostgreSQL
    text nor JSON can hold: then ``PydanticCustomError`` ("storable_text")."""
    problem = _text_problem(text)
    if problem is not None:
        raise PydanticCustomError("storable_text", problem)
    return text


def _kind(value: Any) -> str:
    return type(value).__name__


def _key(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def json_value_problem(value: Any) -> tuple[str, str] | None:
    """The first value in ``value`` that is not storable JSON, as ``(dotted path, message)``.

    Storable JSON is: a mapping, a list, a string, an integer, a finite float, a boolean or
    None; strings without NUL characters or lone surrogates; mapping keys are scalars of the
    same kinds (YAML 1.1 reads ``on:`` as the key true; JSON writes it as "true"). YAML also
    yields NaN and infinities (``.nan``, ``.inf``, ``1.0e+400``), dates, bytes (``!!binary``)
    and sets, which JSON cannot hold. The path reads like ``data.x[1]``; a bad key is reported
    at its mapping's path. The walk is iterative, so any depth is safe (``parse_yaml`` bounds
    the depth anyway).
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            for key in item:
                problem = _scalar_problem(key)
                if problem is not None:
                    return path, f"key {key!r}: {problem}"
            # Children go on the stack last-first, so the walk (and the error) follow the file.
            stack.extend((_key(path, key), item[key]) for key in reversed(item))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", item[i]) for i in reversed(range(len(item))))
        else:
            problem = _scalar_problem(item)
            if problem is not None:
                return path, problem
    return None


def _scalar_problem(value: Any) -> str | None:
    """Why ``value`` (not a list or mapping) is not storable JSON, or None."""
    if isinstance(value, str):
        return _text_problem(value)
    if isinstance(value, float):
        return None if math.isfinite(value) else f"expected a finite number, got {value}"
    if value is None or isinstance(value, int):  # bool is an int
        return None
    return f"expected a string, number, boolean, null, list or mapping, got {_kind(value)}"
