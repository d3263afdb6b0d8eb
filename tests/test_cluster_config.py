"""The cluster config and the queue commands that need no agents: parsing (both formats,
the spec's pool_name, whole-scheduler replacement), `det cluster config apply | show`,
`det resource-pool list` and `det job simulate --scenario`."""

import json
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from det.configs.cluster import ResourcePoolConfig, SchedulerConfig, load_cluster_config
from det.errors import ConfigError

SPEC_EXAMPLE = """\
resource_manager:
  type: agent
  scheduler:
    type: round_robin
    fitting_policy: best
  default_aux_resource_pool: pool1
  default_compute_resource_pool: pool1
resource_pools:
  - pool_name: pool1
    scheduler:
      fitting_policy: worst
"""


def test_a_pool_scheduler_replaces_the_clusters_whole() -> None:
    """spec: Resource Pools: pool1 gets a worst-fit *fair share* scheduler, not round robin."""
    cfg = load_cluster_config(SPEC_EXAMPLE, "master.yaml")
    s = cfg.effective_scheduler("pool1")
    assert (s.type, s.fitting_policy) == ("fair_share", "worst")


def test_the_old_single_pool_format_still_loads() -> None:
    cfg = load_cluster_config("scheduler: {type: priority, preemption: true}\n")
    assert [p.name for p in cfg.resource_pools] == ["default"]
    assert cfg.effective_scheduler("default").preemption


@pytest.mark.parametrize("text, message", [
    ("resource_pools: [{name: a}, {name: a}]\n", "pool 'a' is listed twice"),
    ("resource_manager: {default_compute_resource_pool: gpu}\n", "no pool named 'gpu'"),
    ("resource_manager: {scheduler: {type: fifo}}\n", "resource_manager.scheduler.type"),
    ("resource_manager: {scheduler: {default_priority: 100}}\n", "default_priority"),
    ("resource_pools: [{name: a, colour: red}]\n", "colour"),
])
def test_bad_cluster_configs_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        load_cluster_config(text, "cluster.yaml")
    assert str(e.value).startswith("cluster.yaml")


def test_apply_show_and_pool_list(det, conn, tmp_path: Path) -> None:
    f = tmp_path / "cluster.yaml"
    f.write_text(SPEC_EXAMPLE.replace("pool1", "default") + "  - name: gpu\n")
    det("cluster", "config", "apply", str(f))
    assert det("cluster", "config", "show").stdout.strip() == f.read_text().strip()
    effective = json.loads(det("cluster", "config", "show", "--effective", "--json").stdout)
    assert effective["default"]["type"] == "fair_share"
    assert effective["gpu"]["type"] == "round_robin"
    pools = {p["name"]: p for p in json.loads(det("resource-pool", "list", "--json").stdout)}
    assert pools["gpu"]["scheduler"]["type"] == "round_robin"
    # A pool with active jobs cannot be dropped; the whole apply is refused.
    conn.execute("INSERT INTO jobs (type, resource_pool, queue_position, owner) "
                 "VALUES ('EXPERIMENT', 'gpu', 1, 't')")
    conn.execute("INSERT INTO experiments (job_id, name, config, original_config, owner) "
                 "SELECT id, 'x', '{}', '', 't' FROM jobs")
    f.write_text("resource_pools: [{name: default}]\n")
    r = det("cluster", "config", "apply", str(f), check=False)
    assert r.returncode == 1 and 'pool "gpu" still has agents or active jobs' in r.stderr
    assert "gpu" in det("resource-pool", "list").stdout


def test_the_databases_defaults_are_det_configs(conn) -> None:
    """det.configs.cluster is the home of each default; the database's own fallbacks (a
    pool's scheduler before any cluster config is applied, a pool's zero-slot limit from a
    config that omits it, the columns' defaults) hold the same values, so they cannot drift."""
    assert (conn.execute("SELECT det_user.pool_scheduler('default') AS s").fetchone()["s"]
            == SchedulerConfig().model_dump())
    conn.execute("SELECT det_user.apply_cluster_config(%s, '')",
                 (Jsonb({"resource_pools": [{"name": "default"}, {"name": "aux"}]}),))
    limits = conn.execute("SELECT array_agg(DISTINCT max_aux_containers_per_agent) AS n "
                          "FROM resource_pools").fetchone()["n"]
    assert limits == [ResourcePoolConfig(name="x").max_aux_containers_per_agent]
    defaults = conn.execute(
        "SELECT table_name || '.' || column_name AS c, column_default AS d "
        "FROM information_schema.columns WHERE table_schema = 'public' AND (table_name, "
        "column_name) IN (('jobs', 'priority'), ('resource_pools', "
        "'max_aux_containers_per_agent'))").fetchall()
    assert {r["c"]: r["d"] for r in defaults} == {
        "jobs.priority": str(SchedulerConfig().default_priority),
        "resource_pools.max_aux_containers_per_agent": str(limits[0])}


def test_simulate_a_scenario_file(det, tmp_path: Path) -> None:
    f = tmp_path / "scenario.yaml"
    f.write_text("""\
scheduler: {type: priority, preemption: true}
agents: [{id: a1, slots: 4}]
tasks:
  - {id: t1, job: j1, slots: 4, priority: 50, state: running, on: {a1: 4}}
  - {id: t2, slots: 1, priority: 40}
  - {id: t3, slots: 0, preemptible: false}
""")
    out = json.loads(det("job", "simulate", "--scenario", str(f), "--json").stdout)
    assert out == {"allocate": ["t3"], "release": ["t1"]}
    table = det("job", "simulate", "--scenario", str(f), "--scheduler", "round_robin").stdout
    assert "keep running" in table and "start on a1" in table
    f.write_text("agents: [{id: a1}]\n")
    r = det("job", "simulate", "--scenario", str(f), check=False)
    assert r.returncode == 1 and "agents[0].slots" in r.stderr


def test_drained_agents_and_slots_take_no_new_work(det, conn, tmp_path: Path) -> None:
    conn.execute("SELECT det_agent.register('a1', 'h', 'default', 'process', "
                 "'[{\"slot_id\": 0, \"type\": \"cpu\"}, {\"slot_id\": 1, \"type\": \"cpu\"}]')")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "model_def.py").write_text("class MyTrial:\n    pass\n")
    cfg = tmp_path / "two.yaml"
    cfg.write_text("name: two\nentrypoint: model_def:MyTrial\nresources: {slots_per_trial: 2}\n"
                   "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n")
    det("slot", "disable", "a1", "1")
    assert [s["enabled"] for s in json.loads(det("slot", "list", "--json").stdout)] == [True,
                                                                                       False]
    det("experiment", "create", str(cfg), str(ctx))
    det("agent", "disable", "a1")
    det("reconcile", "--once")
    assert "pool has no agents" in det("job", "explain", "1").stdout
    det("agent", "enable", "a1")
    det("reconcile", "--once")
    assert "needs 2 slots but the pool has 1" in det("job", "explain", "1").stdout
    det("slot", "enable", "a1", "1")
    det("reconcile", "--once")
    assert conn.execute("SELECT state::text AS s FROM allocations").fetchone()["s"] == "ASSIGNED"
    assert json.loads(det("agent", "list", "--json").stdout)[0]["used"] == 2
    r = det("agent", "disable", "nope", check=False)
    assert r.returncode == 1 and "agent nope not found" in r.stderr
