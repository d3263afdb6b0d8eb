"""Bad input through the real `det` command: one line naming what and where, a non-zero
exit, and nothing written."""

from pathlib import Path

import pytest

GOOD = """\
name: ok
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


@pytest.fixture
def ctx(tmp_path: Path) -> Path:
    d = tmp_path / "ctx"
    d.mkdir()
    (d / "model_def.py").write_text("class MyTrial:\n    pass\n")
    return d


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(("text", "expected"), [
    ("name: [unclosed\n", "cfg.yaml"),
    (GOOD + "bogus_key: 1\n", "bogus_key"),
    (GOOD + "max_restarts: many\n", "max_restarts"),
    (GOOD.replace("{batches: 10}", "10 batches"), "searcher.max_length"),
    (GOOD.replace("MyTrial", "Missing"), "defines no class Missing"),
    (GOOD.replace("model_def:", "nomodule:"), "no file nomodule.py"),
])
def test_bad_config_is_one_line_and_writes_nothing(det, conn, ctx, tmp_path, text,
                                                   expected) -> None:
    r = det("experiment", "create", str(write(tmp_path, text)), str(ctx), check=False)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    assert expected in lines[0]
    assert conn.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 0


def test_context_over_limit(det, conn, ctx, tmp_path) -> None:
    with open(ctx / "weights.bin", "wb") as f:
        f.truncate(96 * 1024 * 1024)  # sparse: costs no disk
    r = det("experiment", "create", str(write(tmp_path, GOOD)), str(ctx), check=False)
    assert r.returncode == 1 and "limit is 95 MiB" in r.stderr
    assert conn.execute("SELECT count(*) AS n FROM context_blobs").fetchone()["n"] == 0


@pytest.mark.parametrize("args", [["experiment", "describe", "42"], ["trial", "logs", "7"],
                                  ["experiment", "pause", "42"],
                                  ["checkpoint", "download", "nope", "-o", "/tmp/x"]])
def test_unknown_ids(det, args) -> None:
    r = det(*args, check=False)
    assert r.returncode == 1 and "not found" in r.stderr and len(r.stderr.splitlines()) == 1


def test_create_list_describe(det, ctx, tmp_path) -> None:
    r = det("experiment", "create", str(write(tmp_path, GOOD)), str(ctx))
    assert r.stdout.strip() == "Created experiment 1"
    listing = det("experiment", "list").stdout
    assert "ok" in listing and "ACTIVE" in listing and "tester" in listing
    import json

    described = json.loads(det("experiment", "describe", "1", "--json").stdout)
    assert described["config"]["searcher"]["max_length"] == {"batches": 10}
    assert described["config"]["checkpoint_storage"]["type"] == "shared_fs"
