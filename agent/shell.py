"""Shell commands an agent can run without a shell of their own.

An entrypoint string is a shell command (``["sh", "-c", CMD]``, :mod:`det.configs.entrypoint`).
When CMD is plain words, a shell would run exactly those words as one command, so the agent
may run them directly: the zygote forks a Python one warm, and a cold start execs the command
itself, with no shell at all (:func:`runs_as_is`).
"""

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

_SHELL_SYNTAX = frozenset("|&;<>()$`\\\"'*?[]#~=%{}\n")
"""Characters that make a shell command more than plain words (quotes, expansions,
redirections, globs, assignments, comments)."""

_RESERVED = frozenset({"!", "case", "do", "done", "elif", "else", "esac", "fi", "for",
                       "function", "if", "in", "select", "then", "until", "while", "{", "}"})
"""Words a shell parses as syntax where a command starts."""


def plain_words(argv: list[str]) -> list[str] | None:
    """The words of ``["sh", "-c", CMD]`` when CMD is plain words, with no shell syntax (a
    shell runs it as exactly that command), else None."""
    if len(argv) != 3 or argv[:2] != ["sh", "-c"] or _SHELL_SYNTAX & set(argv[2]):
        return None
    words = shlex.split(argv[2])
    return words if words and words[0] not in _RESERVED else None


_BUILTINS = frozenset({
    ".", ":", "alias", "bg", "break", "cd", "command", "continue", "eval", "exec", "exit",
    "export", "fc", "fg", "getopts", "hash", "jobs", "local", "read", "readonly", "return",
    "set", "shift", "source", "times", "trap", "type", "ulimit", "umask", "unalias", "unset",
    "wait"})
"""Shell builtins that act on the shell itself: a program of the same name (if any) would
not do what the shell does."""

_EXECUTABLE_MAGIC = (b"#!", b"\x7fELF")
"""How a file exec() runs starts; a shell runs any other executable file as a script."""


def runs_as_is(words: list[str], env: Mapping[str, str], workdir: Path) -> bool:
    """Whether exec() of ``words`` in ``workdir`` with ``env`` does what a shell given the
    same words would: ``words[0]`` is no builtin of :data:`_BUILTINS`, names an executable
    file (on the environment's ``PATH``, or relative to ``workdir`` when it holds a ``/``),
    and that file is a program or starts with ``#!``. Otherwise (a builtin, a missing
    command, a script without ``#!``) a shell runs it and says what a shell says."""
    name = words[0]
    if name in _BUILTINS:
        return False
    dirs = [""] if "/" in name else [d or "." for d in env.get("PATH", "").split(":")]
    for d in dirs:
        path = os.path.join(workdir, d, name)  # an absolute d or name stays as it is
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            head = os.read(fd, 4)
        except OSError:  # a directory
            continue
        finally:
            os.close(fd)
        if os.access(path, os.X_OK):
            return head.startswith(_EXECUTABLE_MAGIC)
    return False
