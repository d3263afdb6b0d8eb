"""The config read once: the fields of a stored config that the control plane decides on are
typed columns generated from the config (experiments.searcher_metric, tasks.idle_timeout, ...);
no function, view or named query reads them from the JSON by path, and each column equals its
config's value, after an edit of the config and after the migration that added it."""

import re
import uuid
from pathlib import Path

import psycopg
import pytest
import schema_contract
from conftest import spelled
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.configs import parse_experiment_config
from det.configs.cluster import load_cluster_config
from det.configs.task import parse_task_config
from det.db.migrate import load_migrations, migrate, migrations_dir
from det.sql import named
from det.submission import expand_task_config, submit_task, task_secrets

ROOT = Path(__file__).resolve().parent.parent

# experiments' column -> its config path (det.configs' expanded config)
EXPERIMENT_COLUMNS = {
    "searcher_name": ("searcher", "name"),
    "searcher_metric": ("searcher", "metric"),
    "smaller_is_better": ("searcher", "smaller_is_better"),
    "max_trials": ("searcher", "max_trials"),
    "max_concurrent_trials": ("searcher", "max_concurrent_trials"),
    "source_trial_id": ("searcher", "source_trial_id"),
    "source_checkpoint_uuid": ("searcher", "source_checkpoint_uuid"),
    "max_restarts": ("max_restarts",),
    "preemption_timeout": ("preemption_timeout",),
    "slots_per_trial": ("resources", "slots_per_trial"),
    "experiment_seed": ("reproducibility", "experiment_seed"),
    "save_experiment_best": ("checkpoint_storage", "save_experiment_best"),
    "save_trial_best": ("checkpoint_storage", "save_trial_best"),
    "save_trial_latest": ("checkpoint_storage", "save_trial_latest"),
}
TASK_COLUMNS = {"idle_timeout": ("idle_timeout",)}
CLUSTER_COLUMNS = {
    "scheduler": ("resource_manager", "scheduler"),
    "default_compute_pool": ("resource_manager", "default_compute_resource_pool"),
    "default_aux_pool": ("resource_manager", "default_aux_resource_pool"),
}

RAW = {
    "name": "columns", "entrypoint": "model_def:Trial",
    "searcher": {"name": "adaptive_asha", "metric": "accuracy", "smaller_is_better": False,
                 "max_trials": 7, "max_concurrent_trials": 3, "max_length": {"batches": 100}},
    "hyperparameters": {"lr": {"type": "double", "minval": 0.001, "maxval": 0.1}},
    "resources": {"slots_per_trial": 2, "resource_pool": "default"},
    "max_restarts": 3, "preemption_timeout": 120, "reproducibility": {"experiment_seed": 42},
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp", "save_experiment_best": 1,
                           "save_trial_best": 2, "save_trial_latest": 3},
}


def _path_reads() -> re.Pattern:
    """A read of a converted field from a stored config by path: ``e.config ->> 'max_restarts'``,
    ``config #>> '{searcher,metric}'``, ``k.config -> 'idle_timeout'``, or the ``searcher``
    section taken whole to read on from it. A function's input (``p_config``) is not stored."""
    keys = [p[0] for p in {**EXPERIMENT_COLUMNS, **TASK_COLUMNS}.values() if len(p) == 1]
    paths = ["{" + ",".join(p) + "}"
             for p in {**EXPERIMENT_COLUMNS, **CLUSTER_COLUMNS}.values() if len(p) == 2]
    key_alt = "|".join(map(re.escape, keys + ["searcher", "reproducibility"]))
    path_alt = "|".join(map(re.escape, paths))
    return re.compile(rf"(?<![\w.])(?:\w+\.)?config\s*(?:->>?\s*'(?:{key_alt})'"
                      rf"|#>>?\s*'(?:{path_alt})')")


def _without_generated_columns(text: str) -> str:
    """``text`` less the generated columns' own expressions (the one place that reads them)."""
    return re.sub(r"GENERATED ALWAYS AS\s*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)\s*STORED",
                  "", text, flags=re.S)


def _value(config: dict, path: tuple[str, ...]):
    for key in path:
        config = (config or {}).get(key)
    return config


def test_no_function_view_or_query_reads_a_converted_field_by_path() -> None:
    pattern = _path_reads()
    found = []
    for path in [*schema_contract.files(), *sorted((ROOT / "sql").glob("*.sql"))]:
        text = _without_generated_columns(path.read_text())
        for m in pattern.finditer(text):
            found.append(f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    assert found == []


def test_the_pattern_finds_the_reads_it_forbids() -> None:
    pattern = _path_reads()
    for read in ["(e.config ->> 'max_restarts')::integer", "config #>> '{searcher,metric}'",
                 "e.config #> '{checkpoint_storage,save_trial_best}'",
                 "k.config->>'idle_timeout'", "e.config -> 'searcher' ->> 'name'",
                 "c.config #>> '{resource_manager,default_aux_resource_pool}'"]:
        assert pattern.search(read), read
    for fine in ["p_config #>> '{searcher,metric}'", "e.config -> 'checkpoint_storage'",
                 "p_config -> 'resource_pools'"]:
        assert not pattern.search(fine), fine


def _submit(conn, config: dict) -> int:
    return conn.execute(
        spelled(conn, "SELECT det_user.create_experiment(%s, 'name: columns', NULL) AS id"),
        (Jsonb(config),)).fetchone()["id"]


def _columns(conn, table: str, key: str, ident: int, columns: dict) -> tuple[dict, dict]:
    row = conn.execute(f"SELECT config, {', '.join(columns)} FROM {table} WHERE {key} = %s",
                       (ident,)).fetchone()
    want = {c: _value(row["config"], p) for c, p in columns.items()}
    got = {c: (str(row[c]) if c == "source_checkpoint_uuid" and row[c] else row[c])
           for c in columns}
    return got, want


def test_a_submitted_experiment_s_columns_are_its_config_s_values(conn) -> None:
    expanded = parse_experiment_config(RAW).expanded()
    eid = _submit(conn, expanded)
    got, want = _columns(conn, "experiments", "id", eid, EXPERIMENT_COLUMNS)
    assert got == want
    assert got["searcher_metric"] == "accuracy" and got["smaller_is_better"] is False
    assert (got["max_trials"], got["max_concurrent_trials"], got["slots_per_trial"]) == (7, 3, 2)
    assert (got["save_experiment_best"], got["save_trial_best"], got["save_trial_latest"]) \
        == (1, 2, 3)


def test_the_columns_follow_an_edit_of_the_config(conn) -> None:
    eid = _submit(conn, parse_experiment_config(RAW).expanded())
    # det experiment set gc-policy
    conn.execute("SELECT det_user.set_gc_policy(%s, 4, 5, 6)", (eid,))
    conn.execute("UPDATE experiments SET config = jsonb_set(config, '{max_restarts}', '9') "
                 "WHERE id = %s", (eid,))
    got, want = _columns(conn, "experiments", "id", eid, EXPERIMENT_COLUMNS)
    assert got == want
    assert (got["save_experiment_best"], got["save_trial_best"], got["save_trial_latest"],
            got["max_restarts"]) == (4, 5, 6, 9)


def test_a_whole_number_written_as_2_0_is_accepted_as_2(conn) -> None:
    """det_internal.experiment_config_problem accepts 2.0 where a whole number is expected (a config
    stored from psql): its column is 2, not a failed cast."""
    config = parse_experiment_config(RAW).expanded()
    config["max_restarts"] = 2.0
    config["checkpoint_storage"]["save_trial_best"] = 4.0
    row = conn.execute("SELECT max_restarts, save_trial_best FROM experiments WHERE id = %s",
                       (_submit(conn, config),)).fetchone()
    assert row == {"max_restarts": 2, "save_trial_best": 4}


def test_a_warm_start_source_is_a_column(conn) -> None:
    eid = _submit(conn, parse_experiment_config(RAW).expanded())
    conn.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) "
                 "VALUES (%s, gen_random_uuid(), '{}', 0)", (eid,))
    trial = conn.execute("SELECT id FROM trials WHERE experiment_id = %s", (eid,)).fetchone()["id"]
    fork = parse_experiment_config({**RAW, "searcher": {**RAW["searcher"],
                                                       "source_trial_id": trial}}).expanded()
    got, want = _columns(conn, "experiments", "id", _submit(conn, fork), EXPERIMENT_COLUMNS)
    assert got == want and got["source_trial_id"] == trial


def test_a_task_s_idle_timeout_is_a_column(conn) -> None:
    expanded = expand_task_config(conn, "NOTEBOOK", "idle_timeout: 20s\n", "notebook.yaml")
    job = submit_task(conn, "NOTEBOOK", expanded)
    got, want = _columns(conn, "tasks", "job_id", job, TASK_COLUMNS)
    assert got == want == {"idle_timeout": 20.0}


def test_the_cluster_config_s_columns_are_its_values(conn) -> None:
    config = load_cluster_config(
        "resource_manager: {default_aux_resource_pool: default,\n"
        "                   scheduler: {type: priority, default_priority: 30}}\n"
        "resource_pools: [{pool_name: default}]\n")
    conn.execute("SELECT det_user.apply_cluster_config(%s, '')",
                 (Jsonb(config.model_dump(mode="json")),))
    got, want = _columns(conn, "cluster_config", "singleton", True, CLUSTER_COLUMNS)
    assert got == want and got["scheduler"]["default_priority"] == 30
    assert got["default_aux_pool"] == "default"


@pytest.fixture
def empty_database(pg_server: str):
    """A URL of a new empty database, dropped after the test."""
    name = f"det_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield make_conninfo(pg_server, dbname=name)
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_the_migration_fills_the_columns_of_existing_rows(empty_database, tmp_path) -> None:
    """Rows stored before the columns existed get their config's values when it adds them."""
    added = next(m for m in load_migrations() if m.file.endswith("_config_read_once.sql"))
    older = tmp_path / "older"
    older.mkdir()
    for m in load_migrations():
        if m.version < added.version:
            (older / m.file).write_text(migrations_dir().joinpath(m.file).read_text())
    with psycopg.connect(empty_database, autocommit=True, row_factory=dict_row) as conn:
        migrate(conn, older)
        eid = _submit(conn, parse_experiment_config(RAW).expanded())
        # expanded without expand_task_config: its pool query reads this version's columns
        expanded = parse_task_config({"idle_timeout": "30s"}, "NOTEBOOK").expanded("NOTEBOOK")
        expanded["resources"]["resource_pool"] = "default"
        # submit_task's statement, as this migration names the function
        job = conn.execute(spelled(conn, named("submission").create_task), (
            "NOTEBOOK", Jsonb(expanded), None, None, None, [], [], Jsonb(task_secrets()))
        ).fetchone()["id"]
        assert added.version in migrate(conn)
        got, want = _columns(conn, "experiments", "id", eid, EXPERIMENT_COLUMNS)
        assert got == want and got["searcher_metric"] == "accuracy"
        assert _columns(conn, "tasks", "job_id", job, TASK_COLUMNS)[0] == {"idle_timeout": 30.0}
