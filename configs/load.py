"""Reading experiment configs: YAML text or dicts -> ``ExperimentConfig``, with one-line errors.

Every failure is a ``det.errors.ConfigError`` whose message is
``<source>: <dotted.path>: <what was expected>``, built from the FIRST pydantic error.
"""

from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from det.configs.experiment import ExperimentConfig
from det.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Messages in det's "expected ..." voice for the common pydantic error types; anything else
# keeps pydantic's own message.
_EXPECTED = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
}


# Tagged unions (searcher ``name``, hyperparameter and storage ``type``) report a bad or
# missing tag as the error type ``bad_union_tag:<key>``.
_UNION_TAG = "bad_union_tag:"


_BOUNDS = {
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}


def _path(loc: tuple[int | str, ...], data: Any, keep_last: bool) -> str:
    """The dotted path of a pydantic ``loc``, as the user wrote it.

    pydantic inserts union tags and member names (``searcher.random.max_trials``,
    ``entrypoint.list[str]``); the path keeps only the parts that index into the input.
    """
    parts: list[str] = []
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if (
            isinstance(data, Mapping)
            and part in data
            or isinstance(part, int)
            and isinstance(data, list)
            and 0 <= part < len(data)
        ):
            data = data[part]
        elif not (last and keep_last):
            continue
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + part)
    return "".join(parts)


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "required key missing"
    if kind == "extra_forbidden":
        return f"unknown key {error['loc'][-1]!r}"
    if kind.startswith(_UNION_TAG):
        key = kind.removeprefix(_UNION_TAG)
        given = error["input"].get(key) if isinstance(error["input"], Mapping) else None
        if given is None:
            return f"required key missing ({error['msg']})"
        return f"{error['msg']}, got {_describe(given)}"
    if kind == "literal_error":
        return f"expected one of {ctx['expected']}, got {_describe(error['input'])}"
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        return f"expected a value {op} {ctx[key]}, got {_describe(error['input'])}"
    if kind in _EXPECTED:
        return f"{_EXPECTED[kind]}, got {_describe(error['input'])}"
    return error["msg"]


def config_error(exc: ValidationError, data: Any, source: str | None = None) -> ConfigError:
    """Turn the first error of ``exc`` (raised validating ``data``) into a ``ConfigError``."""
    error = exc.errors()[0]
    ctx = error.get("ctx") or {}
    if "dotted_path" in ctx:  # a cross-field check names the field itself
        path = str(ctx["dotted_path"])
    else:
        keep_last = error["type"] in ("missing", "extra_forbidden")
        path = _path(error["loc"], data, keep_last)
        if error["type"].startswith(_UNION_TAG):
            key = error["type"].removeprefix(_UNION_TAG)
            path = f"{path}.{key}" if path else key
        elif error["type"] == "extra_forbidden":
            path = path.rpartition(".")[0] if "." in path else ""
    return ConfigError(path, _message(error), source)


def parse_experiment_config(data: Any, source: str | None = None) -> ExperimentConfig:
    """Validate a config dict (user input or a stored expanded config); ``ConfigError`` if bad."""
    if not isinstance(data, Mapping):
        raise ConfigError("", f"expected a mapping at the top level, got {_describe(data)}", source)
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, data, source) from None


def parse_yaml(text: str, source: str | None = None) -> Any:
    """Parse YAML ``text`` (duplicate keys refused); ``ConfigError`` naming the line and column
    of a syntax error."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(
            "", f"{where}invalid YAML: {exc.problem or exc.context}", source
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError("", f"invalid YAML: {exc}", source) from None


def load_experiment_config(text: str, source: str | None = None) -> ExperimentConfig:
    """Parse experiment-config YAML ``text``; ``source`` (a file name) prefixes error messages.

    Raises ``ConfigError``: on a YAML syntax error (naming the line and column), an unknown
    key (``unknown key 'foo'``) or any invalid value (``searcher.max_length: expected
    {batches|records|epochs: int}``).
    """
    return parse_experiment_config(parse_yaml(text, source), source)


def experiment_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the experiment config, generated from the model.

    It describes what users may write (validation mode); det validates with pydantic, which
    gives the one-line messages, and publishes this schema for editors and other clients.
    """
    return ExperimentConfig.model_json_schema(mode="validation")
