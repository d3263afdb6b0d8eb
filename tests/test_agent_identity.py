"""Agents with their own identity (issue 35): one-time enrollment tokens, an enrolled agent
that acts only for itself, and revocation that cuts it off mid-run.

Real reconciler and agent processes on a real PostgreSQL; each enrolled agent has a det home
of its own (as another host would), the test's database named by ``--master``.
"""

import json
import stat
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from conftest import Det, wait_for
from psycopg.rows import dict_row
from test_fencing import SILENT, trial_processes

from det.db.reconnect import open_connection


def enroll(det: Det, db_url: str, home: Path, token: str, agent_id: str,
           check: bool = True):
    return det("agent", "enroll", "--master", db_url, "--token", token, "--id", agent_id,
               check=check, DET_HOME=str(home))


def token(det: Det, *args: str) -> str:
    return det("agent", "token", "create", *args).stdout.strip()


def agent_url(home: Path) -> str:
    return json.loads((home / "agent.json").read_text())["url"]


def test_a_token_enrolls_one_agent_once_before_it_expires(det, conn, db_url, tmp_path) -> None:
    t = token(det, "--expires", "10m")
    role, secret = t.split(".", 1)
    home = tmp_path / "host1"
    r = enroll(det, db_url, home, t, "h1")
    assert "Agent h1: enrolled as det_agent_h1" in r.stdout
    # the credential: 0600, its password in det's password file and not in agent.json
    for f in (home / "agent.json", home / "pgpass"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert "password" not in (home / "agent.json").read_text()
    with open_connection(agent_url(home)) as c:
        assert c.execute("SELECT session_user").fetchone() == ("det_agent_h1",)
    # the token is stored only as PostgreSQL's SCRAM verifier of its login
    row = conn.execute("SELECT * FROM agent_enrollment_tokens").fetchone()
    assert row["agent_id"] == "h1" and row["used_at"] is not None
    assert secret not in json.dumps(row, default=str)

    again = enroll(det, db_url, tmp_path / "host2", t, "h2", check=False)
    assert again.returncode == 1
    assert "--token: already used (each token enrolls one agent)" in again.stderr

    # expiry, injected: the token's time is moved into the past
    t2 = token(det)
    conn.execute("UPDATE agent_enrollment_tokens SET expires_at = now() - interval '1 s' "
                 "WHERE used_at IS NULL")
    late = enroll(det, db_url, tmp_path / "host2", t2, "h2", check=False)
    assert late.returncode == 1 and "enrollment token: expired at" in late.stderr, late.stderr
    assert not (tmp_path / "host2" / "agent.json").exists()

    bad = det("agent", "token", "create", "--expires", "soon", check=False)
    assert bad.returncode == 1 and "--expires: expected a duration" in bad.stderr
    bad = det("agent", "token", "create", "--expires", "8 days", check=False)
    assert bad.returncode == 1 and "expires: expected more than 0 and at most 7" in bad.stderr
    bad = det("agent", "token", "create", "--pool", "nope", check=False)
    assert bad.returncode == 1 and 'no resource pool named "nope"' in bad.stderr
    bad = enroll(det, db_url, tmp_path / "host3", "secret", "h3", check=False)
    assert bad.returncode == 1 and "--token: expected the token" in bad.stderr
    # an id already taken, by an enrolled agent: the token stays good for another id
    t3 = token(det)
    taken = enroll(det, db_url, tmp_path / "host3", t3, "h1", check=False)
    assert taken.returncode == 1 and 'agent id "h1": an agent of that id exists' in taken.stderr
    enroll(det, db_url, tmp_path / "host3", t3, "h3")


def _calls(me: str, other: str, alloc: int) -> dict[str, tuple[str, tuple]]:
    """Each agent function naming agent ``other`` (and its live allocation ``alloc``)."""
    return {
        "register": ("SELECT det_agent.register(%s, 'x', 'default', 'process', '[]')", (other,)),
        "heartbeat": ("SELECT det_agent.heartbeat(%s)", (other,)),
        "listen": ("SELECT det_agent.listen(%s)", (other,)),
        "assignments": ("SELECT * FROM det_agent.assignments(%s)", (other,)),
        "live_allocations": ("SELECT * FROM det_agent.live_allocations(%s)", (other,)),
        "context": ("SELECT det_agent.context(%s, 1)", (other,)),
        "claim": ("SELECT det_agent.claim(%s, %s)", (other, alloc)),
        "claim_each": ("SELECT * FROM det_agent.claim_each(%s, %s)", (other, [alloc])),
        "report": ("SELECT det_agent.report(%s, %s, 'TERMINATED', 1, 'x')", (other, alloc)),
        "report_each": ("SELECT det_agent.report_each(%s, %s, 'TERMINATED', '{1}', '{x}')",
                        (other, [alloc])),
        "set_rendezvous": ("SELECT det_agent.set_rendezvous(%s, %s, 'h:1')", (other, alloc)),
        "claim_node": ("SELECT det_agent.claim_node(%s, %s)", (other, alloc)),
        "report_node": ("SELECT det_agent.report_node(%s, %s, 'TERMINATED', 1, 'x')",
                        (other, alloc)),
        "stop_runs": ("SELECT det_agent.stop_runs(%s)", (other,)),
        "leave": ("SELECT det_agent.leave(%s)", (other,)),
        "retire": ("SELECT det_agent.retire(%s)", (other,)),
        "mark_fenced": ("SELECT det_agent.mark_fenced(%s, %s)", (other, [alloc])),
        # names the allocation, not its agent: refused as acting for its chief
        "append_logs": ("SELECT det_agent.append_logs(%s, '{stdout}', '{x}')", (alloc,)),
    }


AGENT_ROW = "SELECT state::text, stopping, hostname, resource_pool FROM agents WHERE id = %s"
RUN_ROW = ("SELECT state::text, desired_state::text, token_hash, rendezvous, planned_stop, "
           "exit_code FROM allocations WHERE id = %s")


@pytest.mark.slow
def test_enrolled_agents_run_a_trial_act_only_for_themselves_and_a_revoked_one_is_cut_off(
        det, conn, db_url, tmp_path) -> None:
    """a1 and a2 enrolled on two homes; the trial runs on a1; a2's login is refused every
    agent function naming a1 (a1's rows unchanged); a1 is revoked mid-run: it exits with one
    line, the trial completes on a2, and at no sampled instant do two processes of it run."""
    storage = tmp_path / "checkpoints"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "train.py").write_text(SILENT)
    cfg = tmp_path / "silent.yaml"
    cfg.write_text(f"""\
name: silent
entrypoint: {sys.executable} train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 400}}}}
checkpoint_storage: {{type: shared_fs, host_path: {storage}}}
max_restarts: 1
""")
    homes = {a: tmp_path / a for a in ("a1", "a2")}
    agents = {a: Det({**det.env, "DET_HOME": str(h)}, tmp_path) for a, h in homes.items()}
    try:
        det("experiment", "create", str(cfg), str(ctx))
        det.start("reconciler", "reconcile", "--interval", "0.5", "--agent-timeout", "8")
        begun = time.time()
        enroll(det, db_url, homes["a1"], token(det), "a1")
        p1 = agents["a1"].start("a1", "agent", "run", "--slots", "1", "--cold-start")
        wait_for(lambda: conn.execute("SELECT 1 FROM agents WHERE id = 'a1'").fetchone(), 60,
                 "a1 to register")
        # the figure (not a bound): token, enrollment and start to the first heartbeat
        print(f"token + enrollment + agent start -> first heartbeat: "
              f"{time.time() - begun:.2f} s")
        wait_for(lambda: conn.execute("SELECT 1 FROM checkpoints").fetchone(), 120,
                 "the first run's first checkpoint, on a1")
        enroll(det, db_url, homes["a2"], token(det), "a2")
        agents["a2"].start("a2", "agent", "run", "--slots", "1", "--cold-start")
        wait_for(lambda: conn.execute("SELECT 1 FROM agents WHERE id = 'a2'").fetchone(), 60,
                 "a2 to register")

        (alloc,) = conn.execute("SELECT id FROM allocations WHERE agent_id = 'a1' "
                                "AND state = 'RUNNING'").fetchone().values()
        before = (conn.execute(AGENT_ROW, ("a1",)).fetchone(),
                  conn.execute(RUN_ROW, (alloc,)).fetchone())
        with open_connection(agent_url(homes["a2"]), dict_row) as a2:
            for name, (query, args) in _calls("a2", "a1", alloc).items():
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                    a2.execute(query, args)
                assert "agent a1: login det_agent_a2 acts only for agent a2" in str(e.value), \
                    name
            # its own name it may use
            assert a2.execute("SELECT det_agent.heartbeat('a2') AS s").fetchone()["s"] \
                == "ACTIVE"
        assert (conn.execute(AGENT_ROW, ("a1",)).fetchone(),
                conn.execute(RUN_ROW, (alloc,)).fetchone()) == before

        dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
        most: list[int] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                most.append(len(trial_processes(dbname)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            r = det("agent", "revoke", "a1")
            assert "Agent a1: revoked;" in r.stdout
            p1.wait(60)
            w = det("experiment", "wait", "1", check=False, timeout=240)
        finally:
            done.set()
            sampler.join()
        assert w.returncode == 0, w.stdout + det("trial", "logs", "1").stdout
        assert p1.returncode == 1
        errors = [x for x in agents["a1"].log("a1").splitlines() if x.startswith("Error:")]
        assert errors == ['Error: agent a1: the database refused its login (role '
                          '"det_agent_a1" is not permitted to log in): revoked (`det agent '
                          'revoke`), or a wrong credential'], errors
        runs = conn.execute("SELECT run, agent_id, exit_reason FROM allocations "
                            "WHERE trial_id = 1 ORDER BY run").fetchall()
        assert [(x["run"], x["agent_id"], x["exit_reason"]) for x in runs] == [
            (1, "a1", "agent lost"), (2, "a2", None)], runs
        assert max(most) == 1 and len(most) > 20, most
        with pytest.raises(psycopg.OperationalError, match="not permitted to log in"):
            open_connection(agent_url(homes["a1"])).close()
        again = det("agent", "revoke", "nobody", check=False)
        assert again.returncode == 1 and 'agent "nobody": no enrolled login' in again.stderr
    finally:
        for d in agents.values():
            d.stop_all()
