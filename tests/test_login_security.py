"""Issue 32, sessions: a password change (an admin's reset, the user's own through det, the
user's own ALTER ROLE in psql) ends the user's det serve logins and is audited; det refuses a
password shorter than 8 characters unless a ClusterAdmin passes --weak-ok; logins are audited
and throttled per user name and per client address, in the database, before any password is
checked."""

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from test_api import Server, error

from det.db import roles

PASSWORD = "ann's first password"


@pytest.fixture
def server(det_env: dict[str, str], tmp_path: Path, det) -> Iterator[Server]:
    """det serve, its admin 'tester' logged in, and a user 'ann' (no ClusterAdmin)."""
    s = Server(det_env, tmp_path)
    det("user", "create", "ann", "--password", PASSWORD)
    yield s
    s.stop()


def login(server: Server, user: str, password: str, address: str = "127.0.0.1"
          ) -> httpx.Response:
    """POST /api/v1/auth/login from client address ``address`` (a loopback address: the
    server sees it as the client's)."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=address)) as c:
        return c.post(f"{server.url}/api/v1/auth/login",
                      json={"username": user, "password": password})


def me(server: Server, token: str) -> httpx.Response:
    return httpx.get(f"{server.url}/api/v1/me", headers={"Authorization": f"Bearer {token}"})


def audit(conn: psycopg.Connection, action: str, user: str) -> list[dict]:
    return conn.execute("SELECT actor, detail FROM audit_log WHERE action = %s "
                        "AND object_type = 'user' AND object_id = %s ORDER BY id",
                        (action, user)).fetchall()


def as_user(det_env: dict[str, str], user: str, password: str) -> dict[str, str]:
    """``det`` commands' environment for connecting as ``user``."""
    return {"DET_DB_URL": make_conninfo(det_env["DET_DB_URL"], user=user, password=password)}


def test_an_admin_reset_ends_the_users_logins_and_is_audited(server: Server, det, conn
                                                             ) -> None:
    token = login(server, "ann", PASSWORD).json()["token"]
    assert me(server, token).status_code == 200
    det("user", "change-password", "ann", "--password", "ann's new password")
    assert error(me(server, token), 401) == "invalid or expired token: log in again"
    assert me(server, server.token).status_code == 200  # the admin's own login goes on
    assert [r["detail"]["logins_ended"] for r in audit(conn, "change_password", "ann")] == [1]
    assert login(server, "ann", "ann's new password").status_code == 200


def test_a_users_own_change_asks_the_current_password_and_ends_their_logins(
        server: Server, det, det_env, conn) -> None:
    token = login(server, "ann", PASSWORD).json()["token"]
    env = as_user(det_env, "ann", PASSWORD)
    r = det("user", "change-password", "--current-password", "not it",
            "--password", "ann's new password", check=False, **env)
    assert r.returncode == 1 and "the current password is wrong" in r.stderr
    assert me(server, token).status_code == 200
    det("user", "change-password", "--password", "ann's new password",
        input=f"{PASSWORD}\n", **env)
    assert me(server, token).status_code == 401
    rows = audit(conn, "change_password", "ann")
    assert [(r["actor"], r["detail"]["logins_ended"]) for r in rows] == [("ann", 1)]


def test_an_own_alter_role_in_psql_ends_the_users_logins_and_is_audited(
        server: Server, db_url, conn) -> None:
    tokens = [login(server, "ann", PASSWORD).json()["token"] for _ in range(2)]
    with psycopg.connect(make_conninfo(db_url, user="ann", password=PASSWORD),
                         autocommit=True) as ann:
        # PostgreSQL lets every role set its own password, and no trigger sees it
        ann.execute(sql.SQL("ALTER ROLE ann PASSWORD {}").format(
            sql.Literal(roles.verifier(ann, "ann", "set in psql"))))
    assert error(me(server, tokens[0]), 401) == \
        "the password changed since this login: log in again"
    assert me(server, tokens[1]).status_code == 401
    assert me(server, server.token).status_code == 200
    rows = audit(conn, "change_password", "ann")
    assert [r["detail"] for r in rows] == [{"outside_det": True, "logins_ended": 2}]
    assert login(server, "ann", "set in psql").status_code == 200


def test_a_short_password_takes_a_cluster_admin_and_weak_ok(server: Server, det, det_env,
                                                            conn) -> None:
    r = det("user", "create", "bob", "--password", "x", check=False)
    assert r.returncode == 1
    assert "password: expected at least 8 characters, got 1" in r.stderr
    det("user", "create", "bob", "--password", "x", "--weak-ok")
    env = as_user(det_env, "ann", PASSWORD)
    r = det("user", "change-password", "--current-password", PASSWORD, "--password", "short",
            check=False, **env)
    assert r.returncode == 1 and "at least 8 characters, got 5" in r.stderr
    r = det("user", "change-password", "--current-password", PASSWORD, "--password", "short",
            "--weak-ok", check=False, **env)
    assert r.returncode == 1 and "needs ClusterAdmin on the cluster" in r.stderr
    assert login(server, "ann", PASSWORD).status_code == 200  # unchanged
    # a det user's own SQL must state the length: det cannot read it off a verifier
    with psycopg.connect(make_conninfo(conn.info.dsn, user="ann", password=PASSWORD),
                         autocommit=True) as ann, \
            pytest.raises(psycopg.errors.InvalidParameterValue, match="password length"):
        ann.execute("SELECT det_user.user_set_password('ann', %s)",
                    (roles.verifier(ann, "ann", "x"),))
    assert [r["detail"]["weak_ok"] for r in audit(conn, "create", "bob")] == [True]


def test_logins_are_audited_without_the_password(server: Server, conn) -> None:
    assert login(server, "ann", PASSWORD, "127.0.0.2").status_code == 200
    assert login(server, "ann", "a wrong guess", "127.0.0.3").status_code == 401
    assert login(server, "nobody", "a wrong guess").status_code == 401
    rows = audit(conn, "login", "ann")
    assert [r["detail"] for r in rows] == [{"outcome": "success", "address": "127.0.0.2"},
                                           {"outcome": "failure", "address": "127.0.0.3"}]
    # a success is the user's act; a failure is reported by det serve (its connection's role)
    assert rows[0]["actor"] == "ann" and rows[1]["actor"] != "ann"
    assert [r["detail"]["outcome"] for r in audit(conn, "login", "nobody")] == ["failure"]
    assert conn.execute("SELECT count(*) AS n FROM audit_log WHERE detail::text LIKE "
                        "'%wrong guess%'").fetchone()["n"] == 0
    assert error(login(server, "a\x00b", "a wrong guess"), 400) == \
        "username: Value error, NUL bytes are not allowed"


def test_a_forwarded_for_header_does_not_choose_the_client_address(server: Server,
                                                                   conn) -> None:
    """det serve takes the address from the connection, not from X-Forwarded-For, which any
    local process could set to dodge the per-address throttle (uvicorn trusts it from
    127.0.0.1 by default)."""
    r = httpx.post(f"{server.url}/api/v1/auth/login", headers={"X-Forwarded-For": "10.1.2.3"},
                   json={"username": "ann", "password": "a wrong guess"})
    assert r.status_code == 401
    assert [r["detail"]["address"] for r in audit(conn, "login", "ann")] == ["127.0.0.1"]


def test_five_failures_lock_a_user_from_every_address_a_right_password_included(
        server: Server, conn) -> None:
    # a success resets the user's count
    for _ in range(4):
        assert login(server, "ann", "a wrong guess").status_code == 401
    assert login(server, "ann", PASSWORD).status_code == 200
    for i in range(5):
        assert login(server, "ann", "a wrong guess", f"127.0.0.{i + 2}").status_code == 401
    r = login(server, "ann", PASSWORD, "127.0.0.9")
    assert r.status_code == 429 and 25 <= int(r.headers["Retry-After"]) <= 30, r.text
    assert "too many failed logins" in r.json()["error"]
    assert login(server, "tester", server.password).status_code == 200  # another user
    assert audit(conn, "login", "ann")[-1]["detail"]["outcome"] == "throttled"
    # the lock ends (as if 30 s went by): a right password works, and the next lock is longer
    conn.execute("UPDATE login_throttle SET locked_until = now() WHERE key = 'ann'")
    assert login(server, "ann", "a wrong guess").status_code == 401
    assert 50 <= int(login(server, "ann", PASSWORD).headers["Retry-After"]) <= 60
    conn.execute("UPDATE login_throttle SET locked_until = now() WHERE key = 'ann'")
    assert login(server, "ann", PASSWORD).status_code == 200


def test_twenty_failures_lock_an_address_for_every_user(server: Server) -> None:
    for i in range(20):
        assert login(server, f"guess{i}", "a wrong guess", "127.0.0.5").status_code == 401
    r = login(server, "tester", server.password, "127.0.0.5")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
    assert login(server, "tester", server.password, "127.0.0.6").status_code == 200


def test_parallel_guesses_cannot_pass_the_lock(server: Server) -> None:
    """Each attempt is counted when it begins, so guesses sent at once are not all let through
    before the first failure is recorded (the counters are rows, shared by every det serve
    process)."""
    codes: list[int] = []

    def guess() -> None:
        codes.append(login(server, "ann", "a wrong guess").status_code)

    threads = [threading.Thread(target=guess) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(set(codes)) == [401, 429] and codes.count(401) == 5


def test_the_throttle_is_only_det_serves(conn, db_url) -> None:
    """A det user cannot reset or read the counters, nor call det serve's login functions."""
    conn.execute("SELECT det_user.user_create('carl', %s, false, 20)",
                 (roles.verifier(conn, "carl", PASSWORD),))
    with psycopg.connect(make_conninfo(db_url, user="carl", password=PASSWORD),
                         row_factory=dict_row, autocommit=True) as carl:
        for stmt in ("SELECT * FROM login_throttle", "DELETE FROM login_throttle",
                     "SELECT det_web.login_begin('carl', 'x')",
                     "SELECT det_web.login(repeat('t', 40), 'carl', 60, 'x')",
                     "SELECT det_internal.password_stamp('carl')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                carl.execute(stmt)
