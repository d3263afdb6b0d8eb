"""Determined 0.38.1's CLI forms in det's CLI (issue 38: 26 of 64 worked).

``UPSTREAM_FORMS`` are the command paths a user of 0.38.1 types, collected from its
``det --help`` and each group's (``det e --help``...), aliases included; each must parse in
det (its ``--help`` answers). The new commands also run for real against a database, on
checkpoints the harness itself reported (validation loss 1/step).
"""

import json
from pathlib import Path
from urllib.parse import urlencode

import pytest
from psycopg.conninfo import conninfo_to_dict
from test_cli import one_line_error
from test_model_registry import write_checkpoints
from typer.testing import CliRunner

from det.cli.main import app

UPSTREAM_FORMS = [
    "version", "master info", "deploy local cluster-up", "deploy local cluster-down",
    "preview-search",
    "experiment create", "experiment list", "experiment describe", "experiment pause",
    "experiment activate", "experiment cancel", "experiment kill", "experiment wait",
    "experiment logs", "experiment list-checkpoints", "experiment download",
    "experiment archive", "experiment unarchive", "experiment move", "experiment delete",
    "experiment set", "e ls", "e list", "e create", "e describe", "e logs", "e lc",
    "e download", "e list-checkpoints",
    "trial describe", "trial logs", "trial download", "t logs", "t download", "t describe",
    "checkpoint describe", "checkpoint download", "checkpoint delete", "c describe",
    "c download",
    "model create", "model list", "model describe", "model list-versions",
    "model register-version", "model delete", "model move", "m ls", "m create",
    "user list", "user create", "user login", "user logout", "user whoami",
    "user change-password", "user activate", "user deactivate", "u ls", "u whoami",
    "agent list", "a ls", "a enable", "a disable", "slot list", "s ls", "s enable",
    "s disable", "job list", "j ls", "j update", "j u", "j update-batch", "resource-pool bindings",
    "rp bindings",
    "workspace list", "workspace create", "workspace describe", "workspace list-projects",
    "workspace list-members", "workspace archive", "workspace unarchive", "workspace delete",
    "w ls", "w create",
    "project list", "project create", "project describe", "project archive",
    "project unarchive", "project delete", "p ls", "p create",
    "command run", "command list", "cmd run", "cmd ls", "cmd logs", "cmd kill",
    "notebook start", "notebook list", "notebook ls", "notebook open", "notebook kill",
    "shell start", "shell list", "shell open", "tensorboard start", "tensorboard list",
    "task list", "task ls", "task logs",
    "template list", "tpl ls", "template describe", "template set", "template remove", "tpl rm",
    "user-group list", "rbac list-roles",
]


def test_every_upstream_form_parses(capsys) -> None:
    """Each of 0.38.1's forms answers ``--help`` in det's CLI, and ``-m``/``-v`` parse; the
    count is printed (the issue's before: 26 of 64)."""
    runner = CliRunner()
    failed = [form for form in UPSTREAM_FORMS
              if runner.invoke(app, [*form.split(), "--help"]).exit_code != 0]
    with capsys.disabled():
        print(f"\nupstream CLI forms parsed: {len(UPSTREAM_FORMS) - len(failed)} of "
              f"{len(UPSTREAM_FORMS)}")
    assert failed == []
    assert runner.invoke(app, ["-v"]).output.startswith("det ")


@pytest.fixture
def ckpts(db_url: str, tmp_path: Path) -> list[str]:
    return write_checkpoints(db_url, tmp_path / "storage", [10, 20, 30])


def test_master_url_is_the_database(det, db_url) -> None:
    """``-m postgresql://...`` and ``DET_MASTER=postgresql://...`` point the CLI at that
    database (``-m`` over DET_DB_URL); an http URL (det serve's) is a one-line error, not
    ignored."""
    bad = "postgresql://nobody@127.0.0.1:1/none"
    params = conninfo_to_dict(db_url)
    url = "postgresql:///{dbname}?{query}".format(dbname=params.pop("dbname"),
                                                   query=urlencode(params))
    r = det("-m", url, "master", "info", "--json", DET_DB_URL=bad)
    info = json.loads(r.stdout)
    assert info["database"] == conninfo_to_dict(db_url)["dbname"], info
    assert "password" not in info["database_url"] and info["schema_version"] > 0
    # without DET_MASTER this would find no cluster (the test's DET_HOME has none)
    assert json.loads(det("e", "ls", "--json", DET_DB_URL="", DET_MASTER=url).stdout) == []
    assert det("-m", db_url, "e", "ls", DET_DB_URL=bad).returncode == 0  # key=value form
    error = one_line_error(det("-m", "http://det.example:8080", "e", "ls", check=False))
    assert "'http://det.example:8080' is not a database URL" in error
    # DET_DB_URL wins over a DET_MASTER that names a database: this one would fail
    assert det("e", "ls", DET_MASTER=bad).returncode == 0
    version = det("version", DET_DB_URL=bad, check=False)
    assert version.returncode == 1 and "cannot connect" in version.stderr
    assert version.stdout.startswith("client: det ")  # printed before the database is asked
    assert det("version").stdout.startswith("client: det ")


def test_checkpoint_forms_run(det, conn, ckpts, tmp_path) -> None:
    """``det e list-checkpoints`` ranks by the searcher metric at each checkpoint's batches
    (loss 1/step: the last is best); ``det e download`` / ``det trial download --best
    --latest --uuid`` fetch into ./checkpoints/UUID; ``det checkpoint describe`` shows one."""
    row = conn.execute("SELECT t.id AS trial, t.experiment_id AS exp, "
                       "e.config #>> '{searcher,metric}' AS metric FROM trials t "
                       "JOIN experiments e ON e.id = t.experiment_id").fetchone()
    assert row["metric"] == "loss", row
    listed = json.loads(det("e", "list-checkpoints", str(row["exp"]), "--json").stdout)
    assert [c["uuid"] for c in listed] == ckpts[::-1]
    best = json.loads(det("e", "lc", str(row["exp"]), "--best", "1", "--json").stdout)
    assert [c["uuid"] for c in best] == [ckpts[2]]
    assert listed[0]["metric_value"] == pytest.approx(1 / 30)

    work = tmp_path / "work"
    work.mkdir()
    r = det("e", "download", str(row["exp"]), "-o", str(work / "top"))
    assert (work / "top" / ckpts[2] / "weights.bin").read_bytes() == bytes([30]) * 1000, r
    r = det("e", "download", str(row["exp"]), "-o", str(work / "worst"), "-q",
            "--sort-by", "loss", "--smaller-is-better", "false")
    assert r.stdout.strip() == str(work / "worst" / ckpts[0])
    r = det("t", "download", str(row["trial"]), "--uuid", ckpts[1][:8], "-o",
            str(work / "mid"))
    assert (work / "mid" / "sub" / "config.txt").read_text() == "step 20"
    # the default directory: ./checkpoints/UUID, where det runs
    r = det("trial", "download", str(row["trial"]), "--latest", "-q", cwd=work)
    assert r.stdout.strip() == f"checkpoints/{ckpts[2]}"
    assert (work / "checkpoints" / ckpts[2]).is_dir()
    # usage errors, as typer reports them (exit 2, after the usage line)
    r = det("t", "download", str(row["trial"]), check=False)
    assert r.returncode == 2 and "give one of --best, --latest, --uuid" in r.stderr, r
    r = det("e", "download", str(row["exp"]), "--sort-by", "loss", check=False)
    assert r.returncode == 2 and "--sort-by and --smaller-is-better go together" in r.stderr
    r = det("t", "download", str(row["trial"]), "--best", "--sort-by", "loss",
            "--smaller-is-better", "yes", check=False)
    assert r.returncode == 2 and "expected true or false, got 'yes'" in r.stderr, r
    error = one_line_error(det("e", "download", "999", check=False))
    assert error == "Error: experiment 999 not found"

    described = json.loads(det("c", "describe", ckpts[1][:8], "--json").stdout)
    assert (described["uuid"], described["trial_id"], described["steps_completed"],
            described["validation"]) == (ckpts[1], row["trial"], 20, {"loss": 0.05})
    files = described["resources"]
    text = det("checkpoint", "describe", ckpts[1]).stdout
    assert f"uuid: {ckpts[1]}" in text, text
    assert f"files: {len(files)}, {sum(files.values())} bytes" in text, text
