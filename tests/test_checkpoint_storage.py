"""Checkpoint storage (issue 16): a real experiment writes its checkpoints through fsspec, to
S3 (s3fs, against moto's server mode, started here) or a shared directory; GC removes what the
policy drops when the experiment ends, `det checkpoint download` fetches one with a byte count,
`det experiment delete` empties the storage."""

import io
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "det-test", "AWS_SECRET_ACCESS_KEY": "det-test-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}

# Three checkpoints with validations 0.5, 0.3, 0.4 at steps 1, 2, 3: the default policy keeps
# the best (step 2) and the latest (step 3).
TRAIN = """
from det.harness import core

with core.init() as ctx:
    for op in ctx.searcher.operations():
        for step, loss in ((1, 0.5), (2, 0.3), (3, 0.4)):
            ctx.train.report_validation_metrics(step, {"loss": loss})
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, uuid):
                (path / "weights.bin").write_bytes(bytes(range(256)) * 40 * step)
                (path / "sub").mkdir()
                (path / "sub" / "note.txt").write_text(f"step {step}")
        op.report_completed(0.3)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 server on a free local port; yields its endpoint URL. The credentials go into
    this process's environment (so s3fs here, and det processes started with it, find them
    through the standard AWS chain)."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    port = free_port()
    log = open(tmp_path / "moto.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return proc.poll() is not None  # let the assertion below report a dead server

    try:
        wait_for(up, 30, "moto's S3 server to listen")
        assert proc.poll() is None, (tmp_path / "moto.log").read_text()
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def objects(fs, root: str) -> set[str]:
    """Every file under ``root``, relative to it."""
    fs.invalidate_cache()
    return {p[len(root) + 1:] for p in fs.find(root)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "shared_fs"])
def test_checkpoints_gc_download_and_delete(det, conn, tmp_path, request, kind) -> None:
    """A real experiment through the reconciler and an agent; its checkpoints' files really
    disappear from the storage."""
    import fsspec

    if kind == "s3":
        endpoint = request.getfixturevalue("s3_server")
        det.env.update(CREDENTIALS)
        fs = fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True)
        fs.mkdir("ckpts")
        root = "ckpts/runs/a"
        storage = f"{{type: s3, bucket: ckpts, prefix: runs/a, endpoint_url: '{endpoint}'}}"
    else:
        fs = fsspec.filesystem("file")
        root = str(tmp_path / "shared")
        storage = f"{{type: shared_fs, host_path: {tmp_path}, storage_path: shared}}"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "train.py").write_text(TRAIN)
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(f"""\
name: s3
entrypoint: {sys.executable} train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 3}}}}
checkpoint_storage: {storage}
max_restarts: 0
""")
    det("experiment", "create", str(cfg), str(ctx))
    det.start("reconciler", "reconcile", "--interval", "0.2")
    det.start("agent", "agent", "run", "--id", "a1", "--work-dir", str(tmp_path / "agent"))
    r = det("experiment", "wait", "1", check=False, timeout=120)
    assert r.returncode == 0, det.log("agent")

    rows = conn.execute("SELECT uuid::text AS uuid, steps_completed, state FROM checkpoints "
                        "ORDER BY steps_completed").fetchall()
    assert [r["steps_completed"] for r in rows] == [1, 2, 3]
    first, best, latest = (r["uuid"] for r in rows)
    wait_for(lambda: conn.execute("SELECT state FROM checkpoints WHERE uuid = %s",
                                  (first,)).fetchone()["state"] == "DELETED", 60,
             "GC to remove the first checkpoint")
    keys = objects(fs, root)
    assert not any(first in k for k in keys)
    assert f"{best}/weights.bin" in keys and f"{latest}/sub/note.txt" in keys
    freed = conn.execute("SELECT freed_bytes FROM checkpoints WHERE uuid = %s",
                         (first,)).fetchone()["freed_bytes"]
    assert freed >= 256 * 40  # weights, note and metadata.json

    if kind == "s3":  # the task's upload said how many bytes it moved
        logs = det("trial", "logs", "1")
        assert f"checkpoint {best}: upload: 20.0 KiB" in logs.stdout + logs.stderr
    out = tmp_path / "download"
    r = det("checkpoint", "download", best, "-o", str(out))
    assert (out / "weights.bin").read_bytes() == bytes(range(256)) * 80
    assert (out / "sub" / "note.txt").read_text() == "step 2"
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert f"checkpoint {best}: download:" in r.stderr
    assert f"{size} B" in r.stderr or "KiB" in r.stderr

    det("experiment", "delete", "--yes", "1")
    wait_for(lambda: conn.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 0,
             60, "the experiment's rows to go")
    assert objects(fs, root) == set()


def test_progress_counts_bytes() -> None:
    """The byte count of a put through a local filesystem (which reports no bytes itself)."""
    import fsspec

    from det.harness.progress import ByteProgress

    fs = fsspec.filesystem("memory")
    out = io.StringIO()
    src = Path(__file__).parent
    files = sorted(src.glob("test_storage_*.py"))
    with ByteProgress("upload", None, upload=True, file=out) as progress:
        for f in files:
            with progress.branched(str(f), f"/x/{f.name}") as child:
                fs.put_file(str(f), f"/x/{f.name}", callback=child)
    assert progress.bytes == sum(f.stat().st_size for f in files)
    assert out.getvalue().startswith("upload: ") and "/s)" in out.getvalue()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal() -> None:
    from det.harness.progress import ByteProgress

    out = _Terminal()
    with ByteProgress("download x", 3 * 2**20, upload=False, file=out) as progress:
        for _ in range(3):
            with progress.branched("remote", "/nonexistent") as child:
                child.relative_update(2**20)
    assert "download x: 100%|##########| 3.00M/3.00M" in out.getvalue()
    assert "B/s]" in out.getvalue()

