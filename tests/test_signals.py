"""det's NOTIFY channels are secrets (issue 32): PostgreSQL has no privilege on LISTEN or
NOTIFY, so a user or a task that could name det_reconciler, det_web, agent_<id> or
alloc_<id> heard the ids and activity of experiments in workspaces it cannot see, and woke det
(a ``*`` on det_web refreshed every stream). Each probe below is one such attack."""

import re
from collections.abc import Iterator

import psycopg
import pytest
from conftest import task_url
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from test_rbac import Cluster

from det.configs import load_experiment_config
from det.db import channels
from det.reconciler.passes import Settings, run_pass

OLD_NAMES = ["det_reconciler", "det_web", "agent_a1", *(f"alloc_{i}" for i in range(1, 6))]
"""The well-known names det's channels had before issue 32."""


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    c = Cluster(db_url)
    c.owner.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                    (Jsonb([{"slot_id": 0, "type": "cpu"}, {"slot_id": 1, "type": "cpu"}]),))
    c.user("alice")  # a plain user: a member of no workspace
    yield c
    c.owner.close()


def submit(c: Cluster) -> int:
    """A one-trial experiment in the default workspace, submitted by the owner."""
    config = load_experiment_config(
        "name: x\nentrypoint: 'true'\n"
        "searcher: {name: single, metric: loss, max_length: {batches: 1}}\n").expanded()
    return c.owner.execute("SELECT det_user.create_experiment(%s, '', NULL) AS id",
                           (Jsonb(config),)).fetchone()["id"]


def claimed_run(c: Cluster, exp: int, slot: int) -> tuple[int, str]:
    """A trial run of ``exp`` on agent a1's ``slot``, claimed as the agent claims it:
    (allocation id, its token)."""
    trial = c.owner.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) "
                            "VALUES (%s, gen_random_uuid(), '{}', 0) RETURNING id",
                            (exp,)).fetchone()["id"]
    alloc = c.owner.execute(
        "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
        "state, agent_id) SELECT job_id, %s, 1, 'default', 1, '{}', 'ASSIGNED', 'a1' "
        "FROM experiments WHERE id = %s RETURNING id", (trial, exp)).fetchone()["id"]
    c.owner.execute("INSERT INTO allocation_slots (allocation_id, agent_id, slot_id) "
                    "VALUES (%s, 'a1', %s)", (alloc, slot))
    token = c.owner.execute("SELECT det_agent.claim('a1', %s) AS t", (alloc,)).fetchone()["t"]
    return alloc, token


def names(c: Cluster, allocs: list[int]) -> dict[str, str]:
    """This cluster's channel names (read as the owner, who alone may)."""
    out = {"reconciler": channels.name(c.owner, channels.RECONCILER),
           "web": channels.name(c.owner, channels.WEB),
           "agent a1": channels.name(c.owner, channels.agent("a1"))}
    out.update({f"alloc {a}": channels.name(c.owner, channels.allocation(a)) for a in allocs})
    return out


def notify_only(source: str) -> str:
    """``source`` without its ``pg_notify(det_internal.channel(...), ...)`` calls: what is left must
    not mention a channel's name or secret (a function that only notifies returns neither)."""
    return re.sub(r"pg_notify\(det_internal.channel\('[a-z]+', [^)]*\)", "pg_notify(", source)


def test_a_user_cannot_learn_a_channel_name(cluster: Cluster) -> None:
    c = cluster
    exp = submit(c)
    alloc, _ = claimed_run(c, exp, 0)
    secret = names(c, [alloc])
    assert len(set(secret.values())) == len(secret)
    assert all(len(n.encode()) <= 63 and n.startswith("det_") for n in secret.values())

    with c.connect("alice") as alice:
        for call in ("det_internal.channel('reconciler', '')", "det_internal.listen('web', '')",
                     "det_web.listen()", "det_agent.listen('a1')", "det_task.listen('x')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                alice.execute(f"SELECT {call}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("SELECT secret FROM channel_key")

        # No function alice may call hands a name or the secret out: those that build a name
        # (the user actions that wake the reconciler) only notify with it.
        callable_ = alice.execute(
            "SELECT n.nspname || '.' || p.proname AS proname, p.prosrc FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname LIKE 'det%' "
            "AND has_function_privilege(p.oid, 'EXECUTE')").fetchall()
        assert len(callable_) > 30
        leaks = [f["proname"] for f in callable_
                 if re.search(r"det_internal\.channel|det_internal\.listen|channel_key|LISTEN",
                              notify_only(f["prosrc"]))]
        assert leaks == []
        notifiers = [f["proname"] for f in callable_ if "det_internal.channel" in f["prosrc"]]
        assert "det_user.experiment_action" in notifiers

        # Nor does any table or view alice may read hold one.
        readable = alice.execute(
            "SELECT format('%I.%I', schemaname, tablename) AS t FROM pg_tables "
            "WHERE schemaname IN ('public', 'reporting') "
            "AND has_table_privilege(format('%I.%I', schemaname, tablename), 'SELECT') "
            "UNION SELECT format('%I.%I', schemaname, viewname) FROM pg_views "
            "WHERE schemaname IN ('public', 'reporting') "
            "AND has_table_privilege(format('%I.%I', schemaname, viewname), 'SELECT')"
        ).fetchall()
        assert len(readable) > 10
        for r in readable:
            text = " ".join(row["t"] for row in alice.execute(
                sql.SQL("SELECT t::text AS t FROM {} t").format(
                    sql.SQL(r["t"]))).fetchall())
            assert not any(n in text for n in secret.values()), r["t"]


def test_a_user_listening_hears_nothing_and_cannot_wake_det(cluster: Cluster) -> None:
    c = cluster
    c.owner.execute("SELECT det_web.watch('test', 60)")  # det serve streams pages
    with (c.connect("alice") as alice,
          psycopg.connect(c.url, autocommit=True) as reconciler,
          psycopg.connect(c.url, autocommit=True) as web,
          psycopg.connect(c.url, autocommit=True) as agent):
        for old in OLD_NAMES:
            alice.execute(sql.SQL("LISTEN {}").format(sql.Identifier(old)))
        channels.listen(reconciler, channels.RECONCILER)
        channels.listen(web, channels.WEB)
        agent.execute("SET ROLE det_agent")
        channels.listen_agent(agent, "a1")

        # Submissions, a pause, and the passes that place the trial and wake its agent.
        exp = submit(c)
        c.owner.execute("SELECT det_user.experiment_action(%s, 'pause')", (exp,))
        c.owner.execute("SELECT det_user.experiment_action(%s, 'activate')", (exp,))
        with psycopg.connect(c.url, autocommit=True, row_factory=dict_row) as leader:
            while run_pass(leader, Settings(), "test").changes:
                pass
        assert c.owner.execute("SELECT count(*) AS n FROM allocations "
                               "WHERE agent_id = 'a1'").fetchone()["n"] == 1

        heard = [(n.channel, n.payload) for n in alice.notifies(timeout=0.5)]
        assert heard == []
        assert {n.payload for n in reconciler.notifies(timeout=0.5)} >= {"experiment"}
        assert any(f"experiment:{exp}" in n.payload.split() for n in web.notifies(timeout=0.5))
        assert len(list(agent.notifies(timeout=0.5))) >= 1

        # alice's NOTIFYs on every name she could know wake none of det's listeners.
        for old in OLD_NAMES:
            alice.execute("SELECT pg_notify(%s, '*')", (old,))
        for listener in (reconciler, web, agent):
            assert list(listener.notifies(timeout=0.3)) == []


def test_a_task_listens_only_on_its_own_channel(cluster: Cluster, db_url: str) -> None:
    c = cluster
    exp = submit(c)
    (mine, my_token), (other, other_token) = claimed_run(c, exp, 0), claimed_run(c, exp, 1)
    secret = names(c, [mine, other])
    with (psycopg.connect(task_url(db_url), autocommit=True) as task,
          psycopg.connect(task_url(db_url), autocommit=True) as other_task):
        channels.listen_task(task, my_token)
        channels.listen_task(other_task, other_token)
        # The other task, of the same role, reads the first's last statement: no name in it.
        seen = " ".join(q or "" for (q,) in other_task.execute(
            "SELECT query FROM pg_stat_activity WHERE usename = 'det_task'").fetchall())
        assert "det_task.listen" in seen
        assert not any(n in seen for n in secret.values())

        listening = task.execute("SELECT pg_listening_channels()").fetchall()
        assert listening == [(secret[f"alloc {mine}"],)]
        for a in (mine, other):
            channels.notify(c.owner, channels.allocation(a), channels.OP_DECIDED)
        got = [n.channel for n in task.notifies(timeout=0.5)]
        assert got == [secret[f"alloc {mine}"]]

        for call in ("det_internal.channel('alloc', %s)", "det_internal.listen('alloc', %s)",
                     "det_agent.listen(%s)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                task.execute(f"SELECT {call}", (str(other),))
        with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification):
            task.execute("SELECT det_task.listen('not a token')")


def test_an_agent_listens_on_its_own_channel(cluster: Cluster) -> None:
    """det_agent (an agent's role, which names itself in every call) hears its channel through
    det_agent.listen, and may neither name channels nor listen as the reconciler."""
    c = cluster
    with psycopg.connect(make_conninfo(c.url), autocommit=True) as agent:
        agent.execute("SET ROLE det_agent")
        channels.listen_agent(agent, "a1")
        for a in ("a1", "a2"):
            channels.notify(c.owner, channels.agent(a), "")
        assert [n.channel for n in agent.notifies(timeout=0.5)] == \
            [channels.name(c.owner, channels.agent("a1"))]
        for call in ("det_internal.channel('agent', 'a2')", "det_internal.listen('reconciler', '')",
                     "det_web.listen()"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                agent.execute(f"SELECT {call}")
