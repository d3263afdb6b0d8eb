"""The task's SQL functions check what they store (issue 39, item 6): each garbage input the
issue fed them, sent with a real task token, is refused with invalid_parameter_value naming
the field, which det's error translation makes one line; and readers survive what older rows
hold (metadata nested 3,000 deep)."""

import json

import psycopg
import pytest
from test_trial_history import a_trial, start_run

from det.db.sqlstate import translate


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.fixture
def token(conn: psycopg.Connection) -> str:
    job, trial = a_trial(conn)
    conn.execute("INSERT INTO searcher_ops (trial_id, length) VALUES (%s, 10)", (trial,))
    return start_run(conn, job, trial, 1)[1]


def refused(conn: psycopg.Connection, sql: str, args: tuple, field: str) -> str:
    """Run ``sql``; it must be refused with 22023 and a one-line message naming ``field``."""
    with pytest.raises(psycopg.Error) as e:
        conn.execute(sql, args)
    assert e.value.sqlstate == "22023", e.value
    message = str(translate(e.value))
    assert field in message and "\n" not in message, message
    return message


METRICS = "SELECT det_task.report_metrics_batch(%s, NULL, NULL, %s, %s, %s::jsonb[])"


@pytest.mark.parametrize(("group", "steps", "values", "field"), [
    ("training", 1, json.dumps({"x": "y" * 10_000_000}), "bytes, more than"),
    ("training", 1, json.dumps({f"k{i}": i for i in range(100_000)}), "bytes, more than"),
    ("training", 1, '{"x": ' + deep(5000) + "}", "deeper than 32"),
    ("training", 1, json.dumps("loss"), "must be a JSON object, not string"),
    ("training", 9 * 10**18, json.dumps({"x": 1}), "steps_completed"),
    ("training", -1, json.dumps({"x": 1}), "steps_completed"),
    ("a\nb", 1, json.dumps({"x": 1}), "group: holds a control character"),
    ("\x1b[31mred", 1, json.dumps({"x": 1}), "group: holds a control character"),
    ("g" * 256, 1, json.dumps({"x": 1}), "group: longer than 255"),
    ("validation", 1, '{"loss": 1e400}', 'searcher metric "loss"'),
])
def test_metrics_rows_are_bounded(conn, token, group, steps, values, field) -> None:
    # the bad row second, after a good one: the whole batch is refused, nothing is stored
    refused(conn, METRICS, (token, ["training", group], [0, steps], ['{"x": 1}', values]),
            field)
    assert conn.execute("SELECT count(*) AS n FROM metrics").fetchone()["n"] == 0


def test_metrics_within_the_bounds_are_stored(conn, token) -> None:
    ok = '{"x": ' + "[" * 30 + "1" + "]" * 30 + ', "s": "NaN", "n": null, "b": true}'
    conn.execute(METRICS, (token, ["training", "my group é"], [2**53 - 1, 0],
                           [ok, json.dumps({"y": "z" * 60_000})]))
    assert conn.execute("SELECT count(*) AS n FROM metrics").fetchone()["n"] == 2


@pytest.mark.parametrize("units", [float("nan"), float("-inf"), float("inf"), -1.0])
def test_progress_is_finite_and_not_negative(conn, token, units) -> None:
    op = conn.execute("SELECT id FROM searcher_ops").fetchone()["id"]
    refused(conn, "SELECT det_task.report_progress(%s, %s, %s)", (token, op, units), "progress")


def test_progress_past_the_length_is_the_length(conn, token) -> None:
    """Units, not a fraction: an epoch length trained in whole batches may pass it a little."""
    op = conn.execute("SELECT id FROM searcher_ops").fetchone()["id"]
    conn.execute("SELECT det_task.report_progress(%s, %s, %s)", (token, op, 4.5))
    assert conn.execute("SELECT progress FROM searcher_ops").fetchone()["progress"] == 4.5
    conn.execute("SELECT det_task.report_progress(%s, %s, %s)", (token, op, 12.8))
    assert conn.execute("SELECT progress FROM searcher_ops").fetchone()["progress"] == 10


CHECKPOINT = "SELECT det_task.report_checkpoint(%s, gen_random_uuid(), %s, %s::jsonb, %s::jsonb)"


@pytest.mark.parametrize(("steps", "resources", "metadata", "field"), [
    (10, '{"a": "12x"}', "{}", "checkpoint resources: entry"),  # broke GC (bigint cast)
    (10, '{"a": -1}', "{}", "checkpoint resources: entry"),
    (10, '{"a": 1.5}', "{}", "checkpoint resources: entry"),
    (10, '{"../escape": 1}', "{}", "checkpoint resources: entry"),
    (10, '{"/etc/passwd": 1}', "{}", "checkpoint resources: entry"),
    (10, '{"a/../../b": 1}', "{}", "checkpoint resources: entry"),
    (10, '["a"]', "{}", "checkpoint resources: expected a JSON object"),
    (10, '{"a": 1}', deep(3000), "checkpoint metadata must be a JSON object"),
    (10, '{"a": 1}', '{"m": ' + deep(3000) + "}", "checkpoint metadata nests deeper"),
    (10, '{"a": 1}', json.dumps({"m": "x" * 100_000}), "checkpoint metadata is"),
    (9 * 10**18, '{"a": 1}', "{}", "checkpoint steps_completed"),
])
def test_checkpoint_rows_are_bounded(conn, token, steps, resources, metadata, field) -> None:
    refused(conn, CHECKPOINT, (token, steps, resources, metadata), field)
    assert conn.execute("SELECT latest_checkpoint FROM trials").fetchone()[
        "latest_checkpoint"] is None


def test_checkpoint_with_subdirectories_is_stored(conn, token) -> None:
    conn.execute(CHECKPOINT, (token, 10, json.dumps({"model/": 0, "model/w.pt": 123, "a..b": 1}),
                              json.dumps({"framework": "torch"})))
    assert conn.execute("SELECT steps_completed FROM trials").fetchone()["steps_completed"] == 10


@pytest.mark.parametrize(("metadata", "field"), [
    ('{"m": ' + deep(3000) + "}", "metadata nests deeper than 32"),
    (json.dumps({"m": "x" * 100_000}), "metadata is"),
    ('"text"', "metadata must be a JSON object"),
])
def test_trial_metadata_is_bounded(conn, token, metadata, field) -> None:
    refused(conn, "SELECT det_task.set_trial_metadata(%s, %s::jsonb)", (token, metadata), field)


def test_describe_shows_deep_metadata_stored_before(det, conn, token) -> None:
    """A trial whose metadata was stored 3,000 deep before the bound (an older row): describe
    prints it as not shown instead of dying with a RecursionError."""
    trial = conn.execute("UPDATE trials SET metadata = %s::jsonb RETURNING id",
                         ('{"m": ' + deep(3000) + "}",)).fetchone()["id"]
    r = det("trial", "describe", str(trial))
    assert "nested deeper than 32 levels" in r.stdout and r.stderr == ""
    out = json.loads(det("trial", "describe", "--json", str(trial)).stdout)
    assert out["metadata"] == "(not shown: nested deeper than 32 levels)"


def test_the_harness_raises_a_refusal_as_one_line(conn, db_url) -> None:
    """Through the task's transport a report the database refuses (over 64 KiB: a bound only
    the database checks) is a DetError of one line, not psycopg's error with its PL/pgSQL
    context."""
    from conftest import task_url

    from det.errors import DetError
    from det.harness.transport import DbTransport

    job, trial = a_trial(conn)
    alloc, token = start_run(conn, job, trial, 1)
    task = DbTransport(task_url(db_url), alloc, token)
    task.report_metrics("training", 1, {"loss": "x" * 70_000})
    with pytest.raises(DetError) as e:
        task.close()  # flushes: the writer's refused batch is raised here
    assert str(e.value).startswith('metrics "training" at batch 1: values is 700')
    assert str(e.value).endswith("bytes, more than the 65536 allowed")


def test_trial_metadata_is_bounded_as_merged(conn, token) -> None:
    """Each call within bounds, the trial's metadata still stops at 1 MiB of JSON."""
    for i in range(17):
        conn.execute("SELECT det_task.set_trial_metadata(%s, %s::jsonb)",
                     (token, json.dumps({f"k{i}": "x" * 60_000})))
    refused(conn, "SELECT det_task.set_trial_metadata(%s, %s::jsonb)",
            (token, json.dumps({"k17": "x" * 60_000})), "metadata: the trial's metadata would be")
    assert len(conn.execute("SELECT metadata FROM trials").fetchone()["metadata"]) == 17


@pytest.mark.parametrize(("group", "steps"), [
    ("a\nb", 1), ("\x1b[31mred", 1), ("g" * 256, 1), ("", 1), ("training", 2**53),
])
def test_the_harness_refuses_what_the_database_would_when_reported(group, steps) -> None:
    """Group and step rules are checked at the report too, naming it, so that the good
    reports buffered with it are not refused with it."""
    from det.errors import DetError
    from det.harness.report_writer import encode_metrics

    with pytest.raises(DetError, match="group must be|steps_completed must be"):
        encode_metrics(group, steps, {"x": 1})
