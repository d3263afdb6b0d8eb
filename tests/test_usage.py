"""Cluster historical usage (issue 34): slot-hours per UTC day by workspace, user, label and
pool, from reporting.slot_hours and det_user.cluster_usage; `det cluster usage` (table, --json,
--csv) and GET /api/v1/cluster/usage (JSON and the CSV download)."""

import csv
import io
import json
from datetime import date

import psycopg
import pytest
from psycopg.types.json import Jsonb
from test_api import Server

from det.queries.usage import period, usage

D1, D2 = date(2026, 1, 1), date(2026, 1, 2)


def _run(conn, ended, *, owner: str, labels: list[str], slots: int, since: str,
         until: str | None) -> int:
    """An ended experiment of ``owner`` with ``labels`` whose one run held ``slots`` slots
    from ``since`` to ``until`` (UTC; None: never assigned). Returns its allocation id."""
    eid, _ = ended.make([[]])
    conn.execute("UPDATE experiments SET config = jsonb_set(config, '{labels}', %s) "
                 "WHERE id = %s", (Jsonb(labels), eid))
    conn.execute("UPDATE jobs SET owner = %s FROM experiments e WHERE e.job_id = jobs.id "
                 "AND e.id = %s", (owner, eid))
    return conn.execute(
        "UPDATE allocations a SET slots_needed = %s, assigned_at = %s::timestamptz, "
        "ended_at = coalesce(%s::timestamptz, a.created_at) "
        "FROM trials t WHERE t.id = a.trial_id AND t.experiment_id = %s RETURNING a.id",
        (slots, since, until if since else None, eid)).fetchone()["id"]


@pytest.fixture
def runs(conn, ended) -> None:
    """alice: 2 slots across midnight (2 h on Jan 1, 1 h on Jan 2), labels vision and big;
    bob: 1 slot for 2.5 h on Jan 2, no label; carol: a run never assigned (held nothing)."""
    _run(conn, ended, owner="alice", labels=["vision", "big"], slots=2,
         since="2026-01-01 22:00Z", until="2026-01-02 01:00Z")
    _run(conn, ended, owner="bob", labels=[], slots=1,
         since="2026-01-02 10:00Z", until="2026-01-02 12:30Z")
    _run(conn, ended, owner="carol", labels=["x"], slots=4, since=None, until=None)


def _flat(rows) -> set[tuple]:
    return {(r["day"], r["group"], round(r["slot_hours"], 6)) for r in rows}


def test_slot_hours_are_cut_at_midnight_and_grouped(conn, runs) -> None:
    assert _flat(usage(conn, D1, D2, "user")) == {
        (D1, "alice", 4.0), (D2, "alice", 2.0), (D2, "bob", 2.5)}
    # a run counts in each of its labels; a run without one is in the group None
    assert _flat(usage(conn, D1, D2, "label")) == {
        (D1, "big", 4.0), (D1, "vision", 4.0), (D2, "big", 2.0), (D2, "vision", 2.0),
        (D2, None, 2.5)}
    assert _flat(usage(conn, D1, D2, "workspace")) == {
        (D1, "Uncategorized", 4.0), (D2, "Uncategorized", 4.5)}
    assert _flat(usage(conn, D2, D2, "pool")) == {(D2, "default", 4.5)}
    assert usage(conn, date(2026, 1, 3), date(2026, 1, 9), "user") == []


def test_a_running_run_counts_until_now(conn, ended) -> None:
    """A run that holds its slots still (ended_at NULL) counts up to now()."""
    eid, _ = ended.make([[]], ended=False)
    conn.execute("INSERT INTO agents (id, hostname, resource_pool, runtime) VALUES ('a1', "
                 "'h', 'default', 'process')")
    conn.execute(
        "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
        "state, agent_id, assigned_at) SELECT e.job_id, t.id, 2, 'default', 3, '{}', 'RUNNING', "
        "'a1', now() - interval '20 minutes' FROM experiments e JOIN trials t "
        "ON t.experiment_id = e.id WHERE e.id = %s", (eid,))
    today = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date AS d").fetchone()["d"]
    hours = sum(r["slot_hours"] for r in usage(conn, today - date.resolution, today, "user"))
    assert 0.99 <= hours <= 1.1  # 3 slots for 20 minutes (and the test's seconds)


def test_bad_arguments_are_named(conn) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="group_by: expected"):
        usage(conn, D1, D2, "team")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="end: 2026-01-01 is before"):
        usage(conn, D2, D1, "user")
    with pytest.raises(Exception, match="end: 2026-01-01 is before start 2026-01-02"):
        period(D2, D1, D2)
    assert period(None, None, D2) == (date(2025, 12, 20), D2)


def test_cli_table_json_and_csv(det, runs) -> None:
    span = ["--start", "2026-01-01", "--end", "2026-01-02"]
    out = det("cluster", "usage", *span, "--group-by", "label").stdout
    assert "Slot-hours from 2026-01-01 to 2026-01-02 (UTC) by label" in out
    assert "(none)" in out and "Total: big 6, vision 6, (none) 2.5" in out
    data = json.loads(det("cluster", "usage", *span, "--group-by", "user", "--json").stdout)
    assert data["totals"] == [{"group": "alice", "slot_hours": 6.0},
                              {"group": "bob", "slot_hours": 2.5}]
    lines = list(csv.reader(io.StringIO(det("cluster", "usage", *span, "--csv").stdout)))
    assert lines == [["day", "workspace", "slot_hours"], ["2026-01-01", "Uncategorized", "4.0"],
                     ["2026-01-02", "Uncategorized", "4.5"]]
    r = det("cluster", "usage", "--group-by", "team", check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "group_by: expected workspace, user, label or pool" in r.stderr
    r = det("cluster", "usage", "--json", "--csv", check=False)
    assert r.returncode == 1 and "--json and --csv: choose one" in r.stderr
    r = det("cluster", "usage", "--start", "2026-13-01", check=False)
    assert r.returncode != 0 and "--start" in r.stderr and "YYYY-MM-DD" in r.stderr


def test_api_json_and_csv_download(det_env, tmp_path, runs) -> None:
    server = Server(det_env, tmp_path)
    try:
        r = server.client.get("/api/v1/cluster/usage",
                              params={"start": "2026-01-01", "end": "2026-01-02",
                                      "group_by": "pool"})
        assert r.status_code == 200, r.text
        assert r.json()["usage"] == [
            {"day": "2026-01-01", "group": "default", "slot_hours": 4.0},
            {"day": "2026-01-02", "group": "default", "slot_hours": 4.5}]
        r = server.client.get("/api/v1/cluster/usage",
                              params={"start": "2026-01-01", "end": "2026-01-02",
                                      "format": "csv"})
        assert r.headers["content-type"].startswith("text/csv")
        assert 'filename="det-usage-workspace-2026-01-01-2026-01-02.csv"' in \
            r.headers["content-disposition"]
        assert r.text.splitlines()[0] == "day,workspace,slot_hours"
        r = server.client.get("/api/v1/cluster/usage",
                              params={"start": "2026-01-02", "end": "2026-01-01"})
        assert r.status_code == 400 and "end: 2026-01-01 is before" in r.json()["error"]
    finally:
        server.stop()


def test_each_user_sees_the_usage_of_the_workspaces_they_may_view(db_url) -> None:
    """Row-level security: det_user.cluster_usage runs as its caller (alice sees ws-alice's and
    the shared Uncategorized's slot-hours, not bob's)."""
    from test_rbac import Cluster, _seed_experiment_data

    c = Cluster(db_url)
    try:
        for name in ("alice", "bob"):
            c.user(name)
            c.owner.execute("SELECT det_user.workspace_create(%s, NULL, NULL, NULL)",
                            (f"ws-{name}",))
            c.owner.execute("SELECT det_user.project_create(%s, 'p', '')", (f"ws-{name}",))
            c.owner.execute("SELECT det_user.role_assign('Editor', %s, NULL, %s, true)",
                            (name, f"ws-{name}"))
            _seed_experiment_data(c, c.experiment(f"ws-{name}", "p"))
        c.owner.execute("UPDATE allocations SET state = 'TERMINATED', "
                        "assigned_at = '2026-01-01 10:00Z', ended_at = '2026-01-01 11:00Z'")
        everyone = usage(c.owner, D1, D1, "workspace")
        assert {r["group"] for r in everyone} == {"ws-alice", "ws-bob"}
        with c.connect("alice") as alice:
            assert _flat(usage(alice, D1, D1, "workspace")) == {(D1, "ws-alice", 1.0)}
            assert alice.execute("SELECT count(*) AS n FROM reporting.slot_hours"
                                 ).fetchone()["n"] == 1
    finally:
        c.owner.close()
