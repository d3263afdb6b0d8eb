"""Shell commands an agent can run without a shell of their own.

An entrypoint string is a shell command (``["sh", "-c", CMD]``, :mod:`det.configs.entrypoint`).
When CMD is plain words, a shell would run exactly those words as one command, so the agent
may run them directly: the zygote forks a Python one warm, and a cold start skips one shell.
"""

import shlex

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
