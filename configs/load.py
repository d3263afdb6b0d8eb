"""Reading experiment configs: YAML text or dicts -> ``ExperimentConfig``, with one-line errors.

Every failure is a ``det.errors.ConfigError`` whose message is
``<source>: <dotted.path>: <what was expected>``, built from the FIRST pydantic error.
"""

from collections.abc import Mapping
from difflib import get_close_matches
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from det.configs.compat import strip_unused
from det.configs.experiment import ExperimentConfig
from det.configs.limits import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_NODES,
    json_value_problem,
)
from det.errors import ConfigError


class _LimitError(yaml.YAMLError):
    """A document beyond det's bounds (``det.configs.limits``); ``mark`` locates it, if known."""

    def __init__(self, message: str, mark: yaml.Mark | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicate keys, nesting deeper than ``MAX_CONFIG_DEPTH`` and
    documents whose aliases would expand past ``MAX_CONFIG_NODES`` values, ``MAX_CONFIG_BYTES``
    of text or ``MAX_CONFIG_DEPTH`` levels (checked on the composed graph, before anything is
    expanded)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        # PyYAML's composer recurses once per level: refuse before Python's stack runs out.
        event = self.peek_event()
        if not isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            return super().compose_node(parent, index)
        if self._depth >= MAX_CONFIG_DEPTH:
            raise _LimitError(f"nested deeper than {MAX_CONFIG_DEPTH} levels", event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


def _check_expansion(root: yaml.Node) -> None:
    """Raise ``_LimitError`` if ``root``, with every alias expanded, holds more than
    ``MAX_CONFIG_NODES`` values or ``MAX_CONFIG_BYTES`` characters of scalars, nests deeper than
    ``MAX_CONFIG_DEPTH`` collections, or contains itself.

    An alias is the same node object as its anchor, so the composed document is a graph; each
    node's expanded size is computed once (memoised), in time linear in the graph, however
    large the expansion would be.
    """
    sizes: dict[int, tuple[int, int, int]] = {}  # id -> (values, characters, nesting)
    visiting: set[int] = set()

    def visit(node: yaml.Node, depth: int) -> tuple[int, int, int]:
        known = sizes.get(id(node))
        if known is None:
            if id(node) in visiting:
                raise _LimitError("recursive alias: the value anchored here contains itself",
                                  node.start_mark)
            if isinstance(node, yaml.ScalarNode):
                known = (1, len(node.value), 0)
            else:
                if depth >= MAX_CONFIG_DEPTH:
                    raise _LimitError(f"nested deeper than {MAX_CONFIG_DEPTH} levels once its "
                                      "aliases are expanded", node.start_mark)
                visiting.add(id(node))
                children = (node.value if isinstance(node, yaml.SequenceNode)
                            else [n for pair in node.value for n in pair])
                values, chars, nesting = 1, 0, 0
                for child in children:
                    v, c, n = visit(child, depth + 1)
                    values, chars, nesting = values + v, chars + c, max(nesting, n)
                    if values > MAX_CONFIG_NODES:
                        raise _LimitError(f"more than {MAX_CONFIG_NODES} values once its "
                                          f"aliases are expanded; a config may hold at most "
                                          f"{MAX_CONFIG_NODES}")
                    if chars > MAX_CONFIG_BYTES:
                        raise _LimitError("more than 1 MiB of text once its aliases are "
                                          "expanded; a config may hold at most 1 MiB")
                visiting.discard(id(node))
                known = (values, chars, nesting + 1)
            sizes[id(node)] = known
        if depth + known[2] > MAX_CONFIG_DEPTH:  # an alias of a deep value, placed deep
            raise _LimitError(f"nested deeper than {MAX_CONFIG_DEPTH} levels once its aliases "
                              "are expanded", node.start_mark)
        return known

    visit(root, 0)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:  # ``<<: *base``: merged keys may be overridden
            continue
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
    "finite_number": "expected a finite number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "string_unicode": "expected valid Unicode text",
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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config models a field's type holds (itself, a list's items, a union's members)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> set[str]:
    """The keys the config models at ``loc`` (below ``model``) accept. A part of ``loc`` that
    names no field (a list index, a union's tag that pydantic inserts, a hyperparameter's
    name) stays at the models reached so far."""
    models = [model]
    for part in loc:
        fields = [m.model_fields[part] for m in models
                  if isinstance(part, str) and part in m.model_fields]
        if fields:
            models = [sub for f in fields for sub in _models_in(f.annotation)]
    return {key for m in models for key in m.model_fields}


def _message(error: ErrorDetails, model: type[BaseModel] | None = None) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "required key missing"
    if kind == "extra_forbidden":
        key = str(error["loc"][-1])
        known = _keys_at(model, error["loc"][:-1]) if model is not None else set()
        close = get_close_matches(key, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown key {key!r}{hint}"
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
    if kind in ("string_too_long", "too_long", "string_too_short", "too_short"):
        text = isinstance(error["input"], str)
        unit = "characters" if text else "items"
        if kind.endswith("too_long"):
            return f"expected at most {ctx['max_length']} {unit}, got {len(error['input'])}"
        if ctx["min_length"] == 1:
            return f"expected a non-empty {'string' if text else 'list'}"
        return f"expected at least {ctx['min_length']} {unit}, got {len(error['input'])}"
    if kind in _EXPECTED:
        return f"{_EXPECTED[kind]}, got {_describe(error['input'])}"
    return error["msg"]


def config_error(exc: ValidationError, data: Any, source: str | None = None,
                 error: ErrorDetails | None = None,
                 model: type[BaseModel] | None = None) -> ConfigError:
    """Turn ``error`` (default: the first error of ``exc``, raised validating ``data``) into a
    ``ConfigError``. With ``model`` (what validated ``data``), an unknown key is told the
    closest key it accepts there ("did you mean 'max_length'?")."""
    error = error if error is not None else exc.errors()[0]
    ctx = error.get("ctx") or {}
    if "dotted_path" in ctx:  # a cross-field check names the field itself
        path = str(ctx["dotted_path"])
    elif "field" in ctx:  # a model's cross-field check names one of its own fields
        path = _path(error["loc"], data, False)
        path = f"{path}.{ctx['field']}" if path else str(ctx["field"])
    else:
        keep_last = error["type"] in ("missing", "extra_forbidden")
        path = _path(error["loc"], data, keep_last)
        if error["type"].startswith(_UNION_TAG):
            key = error["type"].removeprefix(_UNION_TAG)
            path = f"{path}.{key}" if path else key
        elif error["type"] == "extra_forbidden":
            path = path.rpartition(".")[0] if "." in path else ""
    return ConfigError(path, _message(error, model), source)


def parse_value(adapter: TypeAdapter[Any], value: Any, path: str) -> Any:
    """``value`` validated by ``adapter`` (a ``TypeAdapter`` of one of these models' field
    types); ``ConfigError`` naming ``path`` and what was expected if it does not fit."""
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise ConfigError(path, _message(exc.errors()[0])) from None


def parse_experiment_config(data: Any, source: str | None = None,
                            warnings: list[str] | None = None) -> ExperimentConfig:
    """Validate a config dict (user input or a stored expanded config); ``ConfigError`` if bad.

    Determined 0.38 keys det accepts but does not use are dropped first
    (``det.configs.compat``); with ``warnings`` given, one line naming each is appended to it.
    """
    if not isinstance(data, Mapping):
        raise ConfigError("", f"expected a mapping at the top level, got {_describe(data)}", source)
    data, unused = strip_unused(data, source)
    if warnings is not None:
        warnings += [f"{source}: {w}" if source else w for w in unused]
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, data, source, model=ExperimentConfig) from None


def read_config_file(path: Path) -> str:
    """The text of the config file at ``path``, read as UTF-8 (a BOM is allowed).

    Raises ``ConfigError`` naming the file when it cannot be read, is larger than
    ``MAX_CONFIG_BYTES`` (only that much is read) or is not UTF-8 text.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError("", f"cannot read config file: {e.strerror}", str(path)) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"config file is larger than the limit of 1 MiB "
                          f"({MAX_CONFIG_BYTES} bytes)", str(path))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError("", f"not UTF-8 text (byte {e.start})", str(path)) from None


def parse_yaml(text: str, source: str | None = None) -> Any:
    """Parse YAML ``text`` into JSON-storable data (``det.configs.limits``).

    Raises ``ConfigError`` naming ``source``: a syntax error or duplicate key (with the line and
    column), text over ``MAX_CONFIG_BYTES``, nesting or alias expansion past the limits, or a
    value JSON cannot store (NaN, infinities, NUL characters, lone surrogates, dates, bytes),
    named by its dotted path.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigError("", f"config is {size} bytes; the limit is 1 MiB "
                          f"({MAX_CONFIG_BYTES} bytes)", source)
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except _LimitError as exc:
        where = f"line {exc.mark.line + 1}, column {exc.mark.column + 1}: " if exc.mark else ""
        raise ConfigError("", f"{where}{exc.message}", source) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(
            "", f"{where}invalid YAML: {exc.problem or exc.context}", source
        ) from None
    except yaml.reader.ReaderError as exc:  # a character YAML forbids (NUL, most controls)
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ConfigError("", f"invalid YAML: character {exc.position + 1} is U+{char:04X}, "
                          f"which YAML does not allow", source) from None
    except yaml.YAMLError as exc:
        raise ConfigError("", f"invalid YAML: {' '.join(str(exc).split())}", source) from None
    problem = json_value_problem(data)
    if problem is not None:
        raise ConfigError(*problem, source)
    return data


def load_experiment_config(text: str, source: str | None = None,
                           warnings: list[str] | None = None) -> ExperimentConfig:
    """Parse experiment-config YAML ``text``; ``source`` (a file name) prefixes error messages.

    Raises ``ConfigError``: on a YAML syntax error (naming the line and column), an unknown
    key (``unknown key 'foo'``) or any invalid value (``searcher.max_length: expected
    {batches|records|epochs: int}``).
    """
    return parse_experiment_config(parse_yaml(text, source), source, warnings)


def experiment_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the experiment config, generated from the model.

    It describes what users may write (validation mode); det validates with pydantic, which
    gives the one-line messages, and publishes this schema for editors and other clients.
    """
    return ExperimentConfig.model_json_schema(mode="validation")
