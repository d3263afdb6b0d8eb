"""``determined.common.util``: 0.38.1's YAML helpers and the small utilities user code calls
(names and behaviour from upstream's ``determined/common/util.py``)."""

import io
import os
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any, TypeVar

from ruamel import yaml

from determined.common.api import get_default_master_url

__all__ = ["chunks", "debug_mode", "get_default_master_address", "get_default_master_url",
           "safe_load_yaml_with_exceptions", "sizeof_fmt", "strtobool", "yaml_safe_dump",
           "yaml_safe_load"]

T = TypeVar("T")

_yamls: dict[bool | None, yaml.YAML] = {}  # one YAML object per default_flow_style, as upstream


def _get_yaml(default_flow_style: bool | None = None) -> yaml.YAML:
    y = _yamls.get(default_flow_style)
    if y is None:
        y = yaml.YAML(typ="safe", pure=True)
        if default_flow_style is not None:
            y.default_flow_style = default_flow_style
        _yamls[default_flow_style] = y
    return y


def yaml_safe_load(f: IO[Any] | str) -> Any:
    """The YAML document in ``f`` (a stream or a string), safe-loaded (ruamel.yaml's
    pre-0.18 ``safe_load``). Raises ruamel.yaml's errors for malformed YAML."""
    return _get_yaml().load(f)


def yaml_safe_dump(data: Any, stream: IO[Any] | None = None,
                   default_flow_style: bool | None = None) -> Any:
    """``data`` as YAML: written to ``stream`` if given (returns None), else returned as a
    string (ruamel.yaml's pre-0.18 ``safe_dump``)."""
    y = _get_yaml(default_flow_style)
    if stream is not None:
        return y.dump(data, stream=stream)
    out = io.StringIO()
    y.dump(data, stream=out)
    return out.getvalue()


def safe_load_yaml_with_exceptions(yaml_file: IO[Any] | str) -> Any:
    """Like :func:`yaml_safe_load`, but malformed YAML (a duplicate key, a bad indent) prints
    ``Error: invalid experiment config file.`` with the problem and its line, and exits 1
    (``SystemExit``), as upstream's CLI helper does, instead of a ruamel traceback."""
    try:
        return _get_yaml().load(yaml_file)
    except (yaml.error.MarkedYAMLWarning, yaml.error.MarkedYAMLError,
            yaml.error.MarkedYAMLFutureWarning) as e:
        print(f"Error: invalid experiment config file.\n"
              f"{e.__class__.__name__}: {e.problem}\n{e.problem_mark}")
        sys.exit(1)


def get_default_master_address() -> str:
    """The master address from ``DET_MASTER`` (else ``DET_MASTER_ADDR``, else
    ``localhost:8080``): 0.38's older name of ``api.get_default_master_url``."""
    return get_default_master_url()


def chunks(lst: Sequence[T], chunk_size: int) -> Iterator[Sequence[T]]:
    """Successive slices of ``lst`` of ``chunk_size`` items (the last may be shorter)."""
    for i in range(0, len(lst), chunk_size):
        yield lst[i:i + chunk_size]


def sizeof_fmt(val: int | float) -> str:
    """A byte count as upstream prints it: ``'1.5KB'``, ``'3.0MB'``, ... (powers of 1024)."""
    val = float(val)
    for unit in ("", "K", "M", "G", "T", "P", "E", "Z"):
        if abs(val) < 1024.0:
            return f"{val:3.1f}{unit}B"
        val /= 1024.0
    return f"{val:.1f}YB"


def debug_mode() -> bool:
    """Whether ``DET_DEBUG`` is set to a true value (:func:`strtobool`)."""
    return strtobool(os.getenv("DET_DEBUG", "false"))


def strtobool(val: str) -> bool:
    """Upstream's port of ``distutils.util.strtobool``: false for empty, n, no, f, false, off
    and 0 (any case), true for any other string."""
    return bool(val and val.lower() not in ("n", "no", "f", "false", "off", "0"))
