"""Determined 0.38 config keys det knows but does not act on (Determined 0.38's ``experiment.json``
schema).

A config written for Determined carries keys that steer parts det does not have (profiling,
Kubernetes pod specs, Horovod tuning, proxied ports...). They are accepted so that such a
config runs as written, and never silently: ``strip_unused`` removes them before validation
and returns one warning line naming each. A key neither det nor 0.38 knows is still an error
(the models forbid extra keys).
"""

from collections.abc import Mapping
from typing import Any

from det.errors import ConfigError

# path (``*`` = every entry of a list) -> what the value must be (type check only: det keeps
# nothing of it, but a value of the wrong shape is still a mistake worth naming).
UNUSED: dict[tuple[str, ...], type] = {
    ("profiling",): dict,
    ("optimizations",): dict,
    ("log_policies",): list,
    ("retention_policy",): dict,
    ("integrations",): dict,
    ("security",): dict,
    ("tensorboard_storage",): dict,
    ("slurm",): dict,
    ("pbs",): dict,
    ("data_layer",): dict,
    ("internal",): dict,
    ("environment", "proxy_ports"): list,
    ("environment", "ports"): dict,
    ("environment", "add_capabilities"): list,
    ("environment", "drop_capabilities"): list,
    ("environment", "pod_spec"): dict,
    ("environment", "image", "rocm"): str,
    ("environment", "environment_variables", "rocm"): list,
    ("resources", "agent_label"): str,
    ("resources", "native_parallel"): bool,
    ("resources", "devices"): list,
    ("resources", "is_single_node"): bool,
    ("checkpoint_storage", "propagation"): str,
    ("checkpoint_storage", "container_path"): str,  # shared_fs's legacy key only, see below
    ("checkpoint_storage", "checkpoint_path"): str,
    ("checkpoint_storage", "tensorboard_path"): str,
    ("bind_mounts", "*", "propagation"): str,
}

_TYPE_NAMES = {dict: "a mapping", list: "a list", str: "a string", bool: "true or false"}


def _dotted(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else ("." if i else "") + p
                   for i, p in enumerate(path))


def _remove(node: Any, pattern: tuple[str, ...], at: tuple[str | int, ...],
            found: list[tuple[str | int, ...]]) -> Any:
    """``node`` without the keys ``pattern`` names below it; their paths go to ``found``."""
    head, rest = pattern[0], pattern[1:]
    if head == "*":
        if not isinstance(node, list):
            return node
        return [_remove(v, rest, (*at, i), found) for i, v in enumerate(node)]
    if not isinstance(node, Mapping) or node.get(head) is None:
        return node
    if not rest:
        found.append((*at, head))
        return {k: v for k, v in node.items() if k != head}
    return {**node, head: _remove(node[head], rest, (*at, head), found)}


def strip_unused(data: Any, source: str | None = None) -> tuple[Any, list[str]]:
    """``(data without the known-but-unused keys, one warning line per key removed)``.

    ``data`` is a raw config (a mapping; anything else is returned as is for the model to
    refuse).
    ``checkpoint_storage.container_path`` is only shared_fs's legacy key: for ``type:
    directory`` it is det's own. Null values are left alone ("not present", §3.1). A value
    of the wrong type raises ``ConfigError`` naming it (and ``source``, the file).
    """
    if not isinstance(data, Mapping):
        return data, []
    warnings: list[str] = []
    for pattern, kind in UNUSED.items():
        if (pattern == ("checkpoint_storage", "container_path")
                and (data.get("checkpoint_storage") or {}).get("type") == "directory"):
            continue
        found: list[tuple[str | int, ...]] = []
        stripped = _remove(data, pattern, (), found)
        for path in found:
            value = _lookup(data, path)
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                _refuse(path, kind, source)
        data = stripped
        warnings += [f"warning: {_dotted(p)}: accepted for Determined compatibility, but det "
                     "does not use it" for p in found]
    return data, warnings


def _lookup(data: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def _refuse(path: tuple[str | int, ...], kind: type, source: str | None) -> None:
    name = _TYPE_NAMES.get(kind, kind.__name__)
    raise ConfigError(_dotted(path), f"expected {name}", source)
