"""The model registry through the real `det` command against a real database (issue 16):
every `det model` command, its bad input (one line, nothing written), and the pin a version
puts on its checkpoint.

Checkpoints are written and reported by the harness itself (Core API over a claimed
allocation's token), so their rows and files are the ones a trial leaves behind.
"""

import json
import threading
from pathlib import Path

import psycopg
import pytest
from conftest import wait_for
from test_cli import one_line_error
from test_harness_db_faults import claim_allocation

from det.db.sqlstate import translate
from det.errors import StateError
from det.harness import core
from det.harness.transport import DbTransport


def write_checkpoints(url: str, storage: Path, steps: list[int]) -> list[str]:
    """A trial that validates (loss = 1 / step) and checkpoints at each of ``steps``; returns
    the checkpoints' uuids in order."""
    alloc = claim_allocation(url, storage)
    uuids = []
    with core.init(transport=DbTransport(url, alloc.id, alloc.token)) as ctx:
        for step in steps:
            ctx.train.report_validation_metrics(step, {"loss": 1 / step})
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, uuid):
                (path / "weights.bin").write_bytes(bytes([step % 256]) * 1000)
                (path / "sub").mkdir()
                (path / "sub" / "config.txt").write_text(f"step {step}")
            uuids.append(uuid)
    return uuids


@pytest.fixture
def ckpts(db_url: str, tmp_path: Path) -> list[str]:
    return write_checkpoints(db_url, tmp_path / "storage", [10, 20])


# What a finished GC does to a checkpoint's row (the states' timestamps go with them).
MARK_DELETED = ("UPDATE checkpoints SET state = 'DELETED', delete_requested_at = now(), "
                "deleted_at = now() WHERE uuid = %s")


def count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]


def test_every_model_command(det, conn, ckpts, tmp_path) -> None:
    first, second = ckpts
    assert det("model", "create", "resnet", "--description", "image classifier",
               "--labels", "vision, prod").stdout == "Created model 1: resnet\n"
    det("model", "create", "other")

    det("model", "register-version", "resnet", first, "--name", "first cut",
        "--metadata", '{"accuracy": 0.9, "framework": "torch"}', "--labels", "baseline")
    notes = tmp_path / "notes.md"
    notes.write_text("# v2\n\nTrained **longer**.\n")
    r = det("model", "register-version", "RESNET", second, "--notes-file", str(notes))
    assert r.stdout == f"Registered checkpoint {second} as version 2 of model RESNET\n"
    # The same checkpoint may be a version of several models.
    det("model", "register-version", "2", first)

    listed = json.loads(det("model", "list", "--json").stdout)
    assert [(m["name"], m["num_versions"], m["labels"]) for m in listed] == [
        ("resnet", 2, ["vision", "prod"]), ("other", 1, [])]
    table = det("model", "list").stdout
    assert "resnet" in table and "vision, prod" in table

    versions = json.loads(det("model", "list-versions", "resnet", "--json").stdout)
    assert [(v["version"], v["checkpoint_uuid"], v["steps_completed"]) for v in versions] == [
        (1, first, 10), (2, second, 20)]
    assert versions[0]["validation_metrics"] == {"loss": 0.1}
    assert versions[0]["metadata"] == {"accuracy": 0.9, "framework": "torch"}
    assert versions[0]["name"] == "first cut" and versions[0]["labels"] == ["baseline"]
    assert versions[1]["notes"] == "# v2\n\nTrained **longer**.\n"
    assert versions[0]["size_bytes"] > 1000
    assert second in det("model", "list-versions", "resnet").stdout

    out = det("model", "describe", "resnet").stdout
    assert "Model 1: resnet" in out and "image classifier" in out and "Trained **longer**" in out
    one = json.loads(det("model", "describe", "1", "--version", "2", "--json").stdout)
    assert one["name"] == "resnet" and [v["version"] for v in one["versions"]] == [2]

    # update: the model's fields, then one version's; what is not given stays.
    notes.write_text("Model card\n==========\n")
    det("model", "update", "resnet", "--description", "ResNet-18", "--labels", "vision",
        "--metadata", '{"owner_team": "cv", "stage": "dev"}', "--notes-file", str(notes))
    det("model", "update", "resnet", "--metadata", '{"stage": "prod"}',
        "--remove-metadata", "owner_team")
    det("model", "update", "resnet", "--version", "1", "--name", "v1",
        "--notes", "first *notes*", "--metadata", '{"accuracy": 0.91}',
        "--remove-metadata", "framework")
    det("model", "update", "resnet", "--name", "resnet18")
    row = conn.execute("SELECT * FROM reporting.models WHERE id = 1").fetchone()
    assert (row["name"], row["description"], row["labels"], row["metadata"], row["notes"]) == (
        "resnet18", "ResNet-18", ["vision"], {"stage": "prod"}, "Model card\n==========\n")
    assert (row["num_versions"], row["latest_version"]) == (2, 2)
    v1 = conn.execute("SELECT * FROM reporting.model_versions WHERE model_id = 1 "
                      "AND version = 1").fetchone()
    assert (v1["name"], v1["notes"], v1["metadata"], v1["experiment_id"]) == (
        "v1", "first *notes*", {"accuracy": 0.91}, 1)

    # download: the latest version by default, or the one named.
    det("model", "download", "resnet18", "-o", str(tmp_path / "latest"))
    det("model", "download", "resnet18", "1", "-o", str(tmp_path / "v1"))
    assert (tmp_path / "latest" / "weights.bin").read_bytes() == bytes([20]) * 1000
    assert (tmp_path / "v1" / "sub" / "config.txt").read_text() == "step 10"
    assert json.loads((tmp_path / "v1" / "metadata.json").read_text())["steps_completed"] == 10

    # archive: hidden from the default list, frozen; unarchive undoes it.
    assert det("model", "archive", "resnet18").stdout == "Model resnet18: archived\n"
    assert [m["name"] for m in json.loads(det("model", "list", "--json").stdout)] == ["other"]
    assert len(json.loads(det("model", "list", "--all", "--json").stdout)) == 2
    r = det("model", "register-version", "resnet18", first, check=False)
    assert "model \"resnet18\" is archived: unarchive it" in one_line_error(r)
    r = det("model", "update", "resnet18", "--description", "x", check=False)
    assert "is archived" in one_line_error(r)
    r = det("model", "update", "resnet18", "--version", "1", "--notes", "x", check=False)
    assert "is archived" in one_line_error(r)
    det("model", "download", "resnet18", "-o", str(tmp_path / "archived"))  # still readable
    det("model", "unarchive", "resnet18")
    det("model", "register-version", "resnet18", first)
    assert count(conn, "model_versions") == 4

    # delete-version, then delete: versions go with their model.
    r = det("model", "delete-version", "resnet18", "3", "--yes")
    assert r.stdout == f"Deleted version 3 of model resnet18 (checkpoint {first})\n"
    assert det("model", "delete", "resnet18", "--yes").stdout == (
        "Deleted model resnet18 and its 2 version(s)\n")
    assert count(conn, "models") == 1 and count(conn, "model_versions") == 1
    assert count(conn, "checkpoints") == 2  # deleting a model deletes no checkpoint


BAD_NAMES = [
    ("", "cannot be blank"),
    ("   ", "cannot be blank"),
    ("my  model", "cannot have excessive spacing"),
    ("team/model", "cannot have slashes"),
    ("team\\model", "cannot have slashes"),
    ("12345", "cannot be only numbers"),
    ("x" * 256, "must be at most 255 characters"),
    ("line\nbreak", "cannot contain line breaks or control characters"),
]


def test_bad_model_names_are_refused(det, conn) -> None:
    """Determined's rules for model names (master/internal/api_model.go), and det's bounds;
    a rename is held to the same rules."""
    det("model", "create", "good")
    for name, expected in BAD_NAMES:
        for args in (("model", "create", name), ("model", "update", "good", "--name", name)):
            line = one_line_error(det(*args, check=False))
            assert line.startswith("Error: model name ") and expected in line, (args, line)
    assert [r["name"] for r in conn.execute("SELECT name FROM models")] == ["good"]


def test_model_names_are_unique_regardless_of_case(det, conn) -> None:
    det("model", "create", "MyModel")
    r = det("model", "create", "mymodel", check=False)
    assert "a model of that name already exists" in one_line_error(r)
    det("model", "create", "Other")
    r = det("model", "update", "other", "--name", "MYMODEL", check=False)
    assert "a model of that name already exists" in one_line_error(r)
    det("model", "update", "mymodel", "--name", "MYMODEL")  # its own name, recased
    assert [r["name"] for r in conn.execute("SELECT name FROM models ORDER BY id")] == [
        "MYMODEL", "Other"]


def test_bad_input_is_one_line_and_writes_nothing(det, conn, ckpts, tmp_path) -> None:
    det("model", "create", "m")
    uuid = ckpts[0]
    cases = [
        (("model", "describe", "nope"), 'model "nope" not found'),
        (("model", "describe", "999"), 'model "999" not found'),
        (("model", "register-version", "nope", uuid), 'model "nope" not found'),
        (("model", "register-version", "m", "not-a-uuid"),
         'checkpoint: expected a checkpoint UUID, got "not-a-uuid"'),
        (("model", "register-version", "m", "00000000-0000-0000-0000-000000000000"),
         "checkpoint 00000000-0000-0000-0000-000000000000 not found"),
        (("model", "register-version", "m", uuid, "--metadata", "{bad"),
         "--metadata: expected a JSON object, got invalid JSON"),
        (("model", "register-version", "m", uuid, "--metadata", "[1, 2]"),
         "--metadata: expected a JSON object, got list"),
        (("model", "register-version", "m", uuid, "--metadata", '{"x": NaN}'),
         "metadata.x: expected a finite number, got nan"),
        (("model", "register-version", "m", uuid, "--labels", "ok,bad\tlabel"),
         'labels: label "bad\\tlabel" cannot contain line breaks'),
        (("model", "register-version", "m", uuid, "--notes-file", str(tmp_path / "none.md")),
         "none.md: cannot read it"),
        (("model", "register-version", "m", uuid, "--notes", "x", "--notes-file", "y"),
         "--notes and --notes-file: give one of them"),
        (("model", "create", "n", "--description", "d" * 4097),
         "description: expected at most 4096 characters, got 4097"),
        (("model", "update", "m", "--version", "1", "--notes", "x"), 'model "m" has no version 1'),
        (("model", "download", "m", "-o", str(tmp_path / "out")), 'model "m" has no versions'),
        (("model", "describe", "m", "--version", "7"), 'model "m" has no version 7'),
        (("model", "delete-version", "m", "7", "--yes"), 'model "m" has no version 7'),
        (("model", "delete", "nope", "--yes"), 'model "nope" not found'),
        (("model", "update", "m", "--version", "1", "--description", "x"),
         "--description: a model version has no description"),
    ]
    for args, expected in cases:
        r = det(*args, check=False)
        assert expected in one_line_error(r), (args, r.stderr)
    assert count(conn, "models") == 1 and count(conn, "model_versions") == 0
    assert conn.execute("SELECT metadata, notes FROM models").fetchone() == {
        "metadata": {}, "notes": ""}


def test_a_registered_checkpoint_is_pinned(det, conn, ckpts) -> None:
    """A version's checkpoint row cannot be deleted (ON DELETE RESTRICT); the refusal is one
    readable line. Once no version names it, it can go."""
    det("model", "create", "m")
    det("model", "register-version", "m", ckpts[0])
    det("model", "register-version", "m", ckpts[0])
    with pytest.raises(psycopg.errors.RestrictViolation) as info:
        conn.execute("DELETE FROM checkpoints WHERE uuid = %s", (ckpts[0],))
    error = translate(info.value)
    assert isinstance(error, StateError)
    assert str(error) == (f"checkpoint {ckpts[0]} is registered in the model registry and "
                          "cannot be deleted; delete its model versions first "
                          "(det model delete-version)")
    conn.execute("DELETE FROM checkpoints WHERE uuid = %s", (ckpts[1],))  # not registered
    det("model", "delete-version", "m", "1", "--yes")
    with pytest.raises(psycopg.errors.RestrictViolation):
        conn.execute("DELETE FROM checkpoints WHERE uuid = %s", (ckpts[0],))
    det("model", "delete-version", "m", "2", "--yes")
    conn.execute("DELETE FROM checkpoints WHERE uuid = %s", (ckpts[0],))
    assert count(conn, "checkpoints") == 0


def test_a_registered_checkpoint_survives_a_0_0_0_policy(det, conn, ckpts) -> None:
    """The GC keep rule reads checkpoint_pins, which holds every model version: with a policy
    that keeps nothing, only the unregistered checkpoint is to be deleted (once the trial
    ended: while it lives its latest checkpoint, its restart point, is pinned too)."""
    det("model", "create", "m")
    det("model", "register-version", "m", ckpts[0])
    experiment = conn.execute(
        "SELECT t.experiment_id AS id FROM checkpoints c JOIN trials t ON t.id = c.trial_id "
        "WHERE c.uuid = %s", (ckpts[0],)).fetchone()["id"]
    assert conn.execute("SELECT count(*) AS n FROM det_user.checkpoints_to_delete(%s, 0, 0, 0)",
                        (experiment,)).fetchone()["n"] == 0
    for state in ("STOPPING_COMPLETED", "COMPLETED"):
        conn.execute("UPDATE trials SET state = %s WHERE experiment_id = %s", (state, experiment))
    doomed = conn.execute(
        "SELECT uuid::text AS uuid FROM det_user.checkpoints_to_delete(%s, 0, 0, 0)",
        (experiment,)).fetchall()
    assert [row["uuid"] for row in doomed] == [ckpts[1]]


def test_a_registered_checkpoint_stays_completed(det, conn, ckpts) -> None:
    """GC and deletion move checkpoints out of COMPLETED; a pinned one cannot be moved."""
    det("model", "create", "m")
    det("model", "register-version", "m", ckpts[0])
    with pytest.raises(psycopg.errors.CheckViolation) as info:
        conn.execute(MARK_DELETED, (ckpts[0],))
    assert str(translate(info.value)) == (
        f'checkpoint {ckpts[0]} is registered in the model registry (model "m", version 1) and '
        "cannot be deleted; delete its model versions first (det model delete-version)")
    conn.execute(MARK_DELETED, (ckpts[1],))


def test_a_version_registered_while_gc_waits_still_pins(db_url, conn, ckpts) -> None:
    """Two sessions: a registration holds its checkpoint; a GC statement that decided from an
    earlier snapshot that nothing pins it waits, then is refused once the version commits."""
    conn.execute("SELECT det_user.model_create('m', '', '{}', NULL)")
    outcome: list[BaseException | None] = []
    with psycopg.connect(db_url) as registering:
        registering.execute(
            "SELECT det_user.model_register_version('m', %s, NULL, NULL, NULL, NULL)",
            (ckpts[0],))

        def gc() -> None:
            with psycopg.connect(db_url, autocommit=True) as c:
                try:
                    c.execute(MARK_DELETED + " AND NOT "
                              "EXISTS (SELECT 1 FROM model_versions WHERE checkpoint_uuid = %s)",
                              (ckpts[0], ckpts[0]))
                    outcome.append(None)
                except psycopg.Error as e:
                    outcome.append(e)

        thread = threading.Thread(target=gc)
        thread.start()
        wait_for(lambda: conn.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE NOT granted").fetchone()["n"], 30,
            "the GC statement to wait for the registration's lock")
        registering.commit()
        thread.join(30)
    assert isinstance(outcome[0], psycopg.errors.CheckViolation), outcome
    assert conn.execute("SELECT state FROM checkpoints WHERE uuid = %s",
                        (ckpts[0],)).fetchone()["state"] == "COMPLETED"


def test_only_a_completed_checkpoint_can_be_registered(det, conn, ckpts) -> None:
    det("model", "create", "m")
    conn.execute(MARK_DELETED, (ckpts[0],))
    r = det("model", "register-version", "m", ckpts[0], check=False)
    assert (f"checkpoint {ckpts[0]} is DELETED: only a COMPLETED checkpoint can be registered"
            in one_line_error(r))
    assert count(conn, "model_versions") == 0
