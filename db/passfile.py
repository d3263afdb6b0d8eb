"""det's password file: libpq's passfile format (``host:port:database:user:password``, one
entry a line, ``\\`` and ``:`` escaped with a backslash), mode 0600, at ``<det home>/pgpass``.

It holds the passwords of the embedded server's roles (its superuser, ``det_agent``,
``det_task``, ``det_web``, the cluster admin's det account: host, port and database ``*``) and
those ``det user login`` stored (host and port of the server logged into). det never reads a
password back to send it itself: the URLs it builds carry ``passfile=`` and libpq looks the
password up, as ``psql`` does with ``~/.pgpass``. The one exception is a task's URL, which
carries det_task's password (a container sees no file of det's home; see det.db.roles).
"""

import os
import secrets
from pathlib import Path

FILE = "pgpass"


def path(home: Path) -> Path:
    """The password file of det home ``home``."""
    return home / FILE


def new_password() -> str:
    """A random password (32 URL-safe characters: about 190 bits)."""
    return secrets.token_urlsafe(24)


def _escape(field: str) -> str:
    return field.replace("\\", "\\\\").replace(":", "\\:")


def _split(line: str) -> list[str]:
    """The fields of a passfile line, unescaped."""
    fields, cur, esc = [], "", False
    for ch in line:
        if esc:
            cur, esc = cur + ch, False
        elif ch == "\\":
            esc = True
        elif ch == ":":
            fields.append(cur)
            cur = ""
        else:
            cur += ch
    return [*fields, cur]


def _entries(file: Path) -> list[list[str]]:
    try:
        lines = file.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [f for line in lines if line and not line.startswith("#")
            and len(f := _split(line)) == 5]


def lookup(file: Path, user: str, host: str = "*", port: str = "*") -> str | None:
    """The password stored for ``user`` at exactly ``host``/``port`` (``*``: the embedded
    server's entries), else None."""
    for h, p, _db, u, pw in _entries(file):
        if (h, p, u) == (host, port, user):
            return pw
    return None


def store(file: Path, user: str, password: str, host: str = "*", port: str = "*") -> None:
    """Record ``user``'s password at ``host``/``port`` (replacing an earlier one), first in
    the file so libpq finds it before a wildcard entry. The file is written whole, mode 0600
    from its creation (never readable by others, not even for an instant)."""
    kept = [e for e in _entries(file) if (e[0], e[1], e[3]) != (host, port, user)]
    _write(file, [[host, port, "*", user, password], *kept])


def forget(file: Path, user: str, host: str = "*", port: str = "*") -> bool:
    """Remove ``user``'s entry at ``host``/``port``; returns whether there was one."""
    entries = _entries(file)
    kept = [e for e in entries if (e[0], e[1], e[3]) != (host, port, user)]
    if len(kept) != len(entries):
        _write(file, kept)
    return len(kept) != len(entries)


def _write(file: Path, entries: list[list[str]]) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(":".join(_escape(x) for x in e) + "\n" for e in entries)
    os.replace(tmp, file)
