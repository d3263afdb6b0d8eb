"""The ``environment`` and ``bind_mounts`` sections (Determined 0.38's ``environment.json`` schema).

``environment_variables`` and ``image`` accept a single value for every device type or a map
``{cpu, cuda}``; both are expanded to the map form.
"""

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)
from pydantic_core import PydanticCustomError

from det.errors import ConfigError

DeviceType = Literal["cpu", "cuda"]


def split_env_entry(entry: str) -> tuple[str, str] | None:
    """``"KEY=VALUE"`` -> ``(KEY, VALUE)`` (split at the first ``=``); None if malformed."""
    key, sep, value = entry.partition("=")
    if not sep or not key:
        return None
    return key, value


def _check_env_entry(entry: str) -> str:
    if split_env_entry(entry) is None:
        raise PydanticCustomError(
            "env_entry", "expected KEY=VALUE, got '{entry}'", {"entry": entry}
        )
    return entry


EnvEntry = Annotated[str, AfterValidator(_check_env_entry)]


class EnvironmentVariables(BaseModel):
    """Per-device-type lists of ``KEY=VALUE``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cpu: list[EnvEntry] = Field(default_factory=list)
    cuda: list[EnvEntry] = Field(default_factory=list)


class Images(BaseModel):
    """Per-device-type container image; None leaves the choice to the agent's runtime.
    ``gpu`` is the reference's legacy name of ``cuda`` (§3.5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cpu: str | None = None
    cuda: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _gpu_is_cuda(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("gpu") is None:
            return data
        if data.get("cuda") not in (None, data["gpu"]):
            raise PydanticCustomError("image_gpu", "give cuda or its legacy name gpu, not both",
                                      {"dotted_path": "environment.image.gpu"})
        return {**{k: v for k, v in data.items() if k != "gpu"}, "cuda": data["gpu"]}


def _every_device(value: Any) -> Any:
    """A list (env vars) or a string (image) applies to every device type."""
    if isinstance(value, (list, str)):
        return {"cpu": value, "cuda": value}
    return value


class EnvironmentConfig(BaseModel):
    """``environment``: variables, image, pull policy and registry credentials."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    environment_variables: Annotated[
        EnvironmentVariables,
        BeforeValidator(_every_device, json_schema_input_type=list[str] | EnvironmentVariables),
    ] = Field(default_factory=EnvironmentVariables)
    image: Annotated[
        Images, BeforeValidator(_every_device, json_schema_input_type=str | Images)
    ] = Field(default_factory=Images)
    force_pull_image: bool = False
    registry_auth: dict[str, Any] | None = None


def _absolute(path: str) -> str:
    if not PurePosixPath(path).is_absolute():
        raise PydanticCustomError(
            "absolute_path", "expected an absolute path, got '{value}'", {"value": path}
        )
    return path


def _not_dot(path: str) -> str:
    if not path or PurePosixPath(path) == PurePosixPath("."):
        raise PydanticCustomError("container_path", "expected a path other than '.'")
    return path


AbsolutePath = Annotated[str, AfterValidator(_absolute)]


class BindMount(BaseModel):
    """One ``bind_mounts`` entry; a relative ``container_path`` is under the working dir."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host_path: AbsolutePath
    container_path: Annotated[str, AfterValidator(_not_dot)]
    read_only: bool = False


def env_for_device(
    environment: EnvironmentConfig | Mapping[str, Any], device_type: DeviceType
) -> dict[str, str]:
    """The environment variables a task on ``device_type`` gets, as a dict.

    ``environment`` is the model or its (expanded or raw) dict form. Later entries override
    earlier ones (template entries come first, §3.9). A malformed entry raises ``ConfigError``
    naming it (``environment.environment_variables.cpu[1]``).
    """
    if isinstance(environment, EnvironmentConfig):
        raw: Any = environment.environment_variables.model_dump()
    else:
        raw = _every_device(environment.get("environment_variables") or {})
    entries = raw.get(device_type) or []
    result: dict[str, str] = {}
    for i, entry in enumerate(entries):
        pair = split_env_entry(entry) if isinstance(entry, str) else None
        if pair is None:
            raise ConfigError(
                f"environment.environment_variables.{device_type}[{i}]",
                f"expected KEY=VALUE, got {entry!r}",
            )
        result[pair[0]] = pair[1]
    return result
