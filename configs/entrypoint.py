"""The experiment ``entrypoint`` and how it becomes a command line (Determined 0.38's
``exec/launch.py``).

* ``"module:Class"`` (matching ``TRIAL_CLASS_RE``) names a Trial class run by det's harness;
* any other string is a shell command, run with ``sh -c``;
* a list of strings is exec'd as is.
"""

import re
from typing import Annotated, Any

from pydantic import PlainValidator
from pydantic_core import PydanticCustomError

TRIAL_CLASS_RE = re.compile(r"^[a-zA-Z0-9_.]+:[a-zA-Z0-9_]+$")

ENTRYPOINT_EXPECTED = "expected a string ('module:Class' or a shell command) or a list of strings"


def _parse_entrypoint(value: Any) -> str | list[str]:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(part, str) for part in value):
        return list(value)
    raise PydanticCustomError("entrypoint", ENTRYPOINT_EXPECTED)


Entrypoint = Annotated[
    str | list[str], PlainValidator(_parse_entrypoint, json_schema_input_type=str | list[str])
]
"""A non-empty string or a non-empty list of strings."""


def is_trial_class(entrypoint: str | list[str]) -> bool:
    """True for a ``module:Class`` string (the legacy Trial-class form, §3.8)."""
    return isinstance(entrypoint, str) and TRIAL_CLASS_RE.match(entrypoint) is not None


def entrypoint_argv(entrypoint: str | list[str], python: str) -> list[str]:
    """The argv that runs ``entrypoint`` in the task's working directory.

    ``module:Class`` -> ``[python, "-m", "det.harness.run", "module:Class"]``; another string
    -> ``["sh", "-c", entrypoint]``; a list -> a copy of the list. ``python`` is the
    interpreter path to use inside the task (e.g. ``sys.executable`` or ``"python3"``).
    """
    if isinstance(entrypoint, list):
        return list(entrypoint)
    if is_trial_class(entrypoint):
        return [python, "-m", "det.harness.run", entrypoint]
    return ["sh", "-c", entrypoint]
