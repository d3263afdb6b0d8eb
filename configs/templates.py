"""Configuration templates: checking a template, and merging one under an experiment config.

A template is a partial experiment config stored by name (``det template set``). ``det
experiment create --template NAME`` merges it under the user's config with :func:`merge`, then
validates and expands the result, which is what the experiment stores (spec:
introduction-and-features, Configuration Templates: later changes to a template change no
experiment; a config uses at most one template, and a template uses none).

The merge is Determined's (``master/pkg/schemas/merge.go``), on the
configs as written (before defaults):

* the config's own values win; a value the config leaves out (or sets to ``null``, which det
  reads as "not given") comes from the template;
* mappings (``data``, ``resources``, ``environment``, ...) merge key by key, recursively;
* a list is the config's list when it has one, else the template's: lists are not
  concatenated (Determined's documentation says they are, but its code concatenates only the
  list kinds below, and det follows what Determined does);
* ``bind_mounts``: the config's mounts, then the template's whose ``container_path`` the config
  does not use;
* ``environment.environment_variables``: per device type, the template's entries first, then
  the config's (a later entry for the same variable wins, so the config's do);
* ``environment.image``: per device type (a single image stands for every device type);
* ``searcher`` and ``checkpoint_storage`` are unions on ``name`` / ``type``: when the config
  picks another member than the template, only the template's keys common to every member
  (``metric``, ``smaller_is_better``, ...; ``save_trial_best``, ...) carry over;
* ``hyperparameters``: two nested hyperparameters merge key by key; any other hyperparameter
  of the config is taken whole (``null`` included: it is a constant).
"""

import copy
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError, create_model

from det.configs.experiment import ExperimentConfig, _StorageBase
from det.configs.load import config_error, parse_yaml
from det.configs.searcher import _SearcherBase
from det.errors import ConfigError

_DEVICES = ("cpu", "cuda")


def merge(config: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (an experiment config as parsed from YAML) merged over ``template`` (a
    template's mapping), by the rules above. Neither argument is modified; the result shares
    no mutable value with them."""
    return _merge_map(config, template, ())


def _merge(obj: Any, src: Any, path: tuple[str, ...]) -> Any:
    if obj is None:
        return copy.deepcopy(src)
    if src is None:
        return copy.deepcopy(obj)
    special = _SPECIAL.get(path)
    if special is not None:
        return special(obj, src, path)
    if isinstance(obj, Mapping) and isinstance(src, Mapping):
        return _merge_map(obj, src, path)
    return copy.deepcopy(obj)


def _merge_map(obj: Mapping[str, Any], src: Mapping[str, Any],
               path: tuple[str, ...]) -> dict[str, Any]:
    out = {key: _merge(value, src.get(key), (*path, str(key))) for key, value in obj.items()}
    for key, value in src.items():
        if key not in out:
            out[key] = copy.deepcopy(value)
    return out


def _bind_mounts(obj: Any, src: Any, path: tuple[str, ...]) -> Any:
    if not isinstance(obj, list) or not isinstance(src, list):
        return copy.deepcopy(obj)
    used = {m.get("container_path") for m in obj if isinstance(m, Mapping)}
    extra = [m for m in src if not (isinstance(m, Mapping) and m.get("container_path") in used)]
    return copy.deepcopy(obj + extra)


def _per_device(value: Any, kind: type) -> Any:
    """A single value (a list of variables, an image name) stands for every device type."""
    return {d: value for d in _DEVICES} if isinstance(value, kind) else value


def _environment_variables(obj: Any, src: Any, path: tuple[str, ...]) -> Any:
    obj, src = _per_device(obj, list), _per_device(src, list)
    if not isinstance(obj, Mapping) or not isinstance(src, Mapping):
        return copy.deepcopy(obj)
    out = _merge_map(obj, src, path)
    for device in _DEVICES:
        mine, theirs = obj.get(device), src.get(device)
        if isinstance(mine, list) and isinstance(theirs, list):
            out[device] = copy.deepcopy(theirs + mine)
    return out


def _image(obj: Any, src: Any, path: tuple[str, ...]) -> Any:
    obj, src = _per_device(obj, str), _per_device(src, str)
    if isinstance(obj, Mapping) and isinstance(src, Mapping):
        return _merge_map(obj, src, path)
    return copy.deepcopy(obj)


def _union(tag: str, common: frozenset[str]) -> Callable[[Any, Any, tuple[str, ...]], Any]:
    def merge_union(obj: Any, src: Any, path: tuple[str, ...]) -> Any:
        if not isinstance(obj, Mapping) or not isinstance(src, Mapping):
            return copy.deepcopy(obj)
        if obj.get(tag) is not None and obj.get(tag) != src.get(tag):
            src = {key: value for key, value in src.items() if key in common}
        return _merge_map(obj, src, path)

    return merge_union


def _is_nested_hp(value: Any) -> bool:
    return isinstance(value, Mapping) and "type" not in value


def _hyperparameters(obj: Any, src: Any, path: tuple[str, ...]) -> Any:
    if not (_is_nested_hp(obj) and _is_nested_hp(src)):
        return copy.deepcopy(obj)
    out = {key: (_hyperparameters(value, src[key], path) if key in src else copy.deepcopy(value))
           for key, value in obj.items()}
    for key, value in src.items():
        if key not in out:
            out[key] = copy.deepcopy(value)
    return out


_SPECIAL: dict[tuple[str, ...], Callable[[Any, Any, tuple[str, ...]], Any]] = {
    ("bind_mounts",): _bind_mounts,
    ("environment", "environment_variables"): _environment_variables,
    ("environment", "image"): _image,
    ("searcher",): _union("name", frozenset(_SearcherBase.model_fields)),
    ("checkpoint_storage",): _union("type", frozenset(_StorageBase.model_fields)),
    ("hyperparameters",): _hyperparameters,
}


def _is_absent(error: Any) -> bool:
    """A pydantic error that only says something is missing: a template may leave out any
    key, a union's tag (``searcher.name``, ``checkpoint_storage.type``) included."""
    kind = error["type"]
    if kind == "missing":
        return True
    if kind.startswith("bad_union_tag:"):
        given = error["input"]
        return not isinstance(given, Mapping) or given.get(kind.split(":", 1)[1]) is None
    return False


# The keys every member of a union section has, checked when a template leaves out the
# section's tag (``searcher: {metric: loss}``): its other keys depend on the member.
_UNION_BASES: dict[str, tuple[str, type[BaseModel]]] = {
    "searcher": ("name", _SearcherBase),
    "checkpoint_storage": ("type", _StorageBase),
}
_UntaggedUnions = create_model(
    "_UntaggedUnions", **{key: (base | None, None) for key, (_, base) in _UNION_BASES.items()})


def _check(model: type[BaseModel], data: dict[str, Any], source: str | None) -> None:
    """Validate ``data`` with ``model``, ignoring only what is missing (``_is_absent``)."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        errors = [e for e in exc.errors() if not _is_absent(e)]
        if errors:
            raise config_error(exc, data, source, errors[0], model) from None


def load_template(text: str, source: str | None = None) -> dict[str, Any]:
    """Parse and check the YAML ``text`` of a template; returns its mapping.

    A template is a partial experiment config: a mapping whose keys and values must be valid
    where they appear (unknown keys, wrong types and bad values are refused), though any key
    may be missing. A ``searcher`` or ``checkpoint_storage`` without its ``name`` / ``type``
    has its common keys checked (``metric``, ``save_trial_best``, ...); its others are checked
    once merged.

    Raises:
        ConfigError: naming ``source`` and the key (``max_restarts: expected an integer``), or
            saying the document is not a mapping.
    """
    data = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError("", f"a template must be a mapping of config keys, got "
                          f"{type(data).__name__ if data is not None else 'an empty document'}",
                          source)
    _check(ExperimentConfig, data, source)
    untagged = {key: {k: v for k, v in data[key].items() if k in base.model_fields}
                for key, (tag, base) in _UNION_BASES.items()
                if isinstance(data.get(key), dict) and data[key].get(tag) is None}
    _check(_UntaggedUnions, untagged, source)
    return data
