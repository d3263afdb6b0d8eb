"""Unpacking contexts safely (issue 32): each archive here reproduces an attack on the old
``tarfile.extractall(filter="data")`` unpacking, or on the order of det serve's checks, and
checks that nothing lands outside the destination and nothing there is overwritten."""

import base64
import functools
import gzip
import io
import os
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import httpx
import pytest
from test_api import CONFIG, Server, error

from det import context
from det.cli.users import password_verifier
from det.errors import ContextError
from det.harness.errors import StorageError
from det.harness.storage import FsspecStorage
from det.harness.tensorboard import delete_experiment_files


def tar_gz(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def cve_2025_4517(victim: Path) -> bytes:
    """The CVE-2025-4517 archive: nested directories of 247-letter names reached through
    one-letter links, a link of ``..``s whose resolved path passes PATH_MAX (so the data
    filter's ``realpath`` stops resolving and judges the rest lexically), an ``escape`` link
    through it to ``victim``, a hardlink to ``victim/existing`` through that, then a file
    written over the hardlink and a new file written through the link."""
    comp, steps = "d" * 247, "abcdefghijklmnop"
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    path = ""
    for s in steps:
        members.append((entry(os.path.join(path, comp), tarfile.DIRTYPE), None))
        members.append((entry(os.path.join(path, s), tarfile.SYMTYPE, comp), None))
        path = os.path.join(path, comp)
    chain = "/".join(steps)
    members.append((entry(f"{chain}/{'l' * 254}", tarfile.SYMTYPE, "../" * len(steps)), None))
    members.append((entry("escape", tarfile.SYMTYPE, f"{chain}/{'l' * 254}"
                          + "/.." * (len(steps) + 1) + str(victim)), None))
    members.append((entry("flag", tarfile.LNKTYPE, "escape/existing"), None))
    members.append((entry("flag"), b"overwritten\n"))
    members.append((entry("escape/new"), b"new\n"))
    return tar_gz(*members)


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[Path]:
    """A directory outside the destination with one file; the test checks it is untouched."""
    v = tmp_path / "victim"
    v.mkdir()
    (v / "existing").write_text("original\n")
    yield v
    assert sorted(os.listdir(v)) == ["existing"]
    assert (v / "existing").read_text() == "original\n"


def test_the_cve_2025_4517_archive_writes_nothing_outside(tmp_path: Path, victim: Path) -> None:
    dest = tmp_path / "dest"
    with pytest.raises(ContextError, match=r"^context: member 'a/b/.*': under 'a', a symbolic "
                                           "link"):
        context.unpack(cve_2025_4517(victim), dest)
    assert sorted(os.listdir(tmp_path)) == ["dest", "victim"]


@pytest.mark.parametrize("member, why", [
    ((entry("../evil"), b"x"), "'../evil': a '..' component"),
    ((entry("a/../../evil"), b"x"), "'a/../../evil': a '..' component"),
    ((entry("/tmp/evil"), b"x"), "'/tmp/evil': an absolute name"),
    ((entry("d/" * 257 + "f"), b"x"), "'(d/){257}f': under more than 256 directories"),
    ((entry("dev", tarfile.CHRTYPE), None), "'dev': a character device"),
    ((entry("blk", tarfile.BLKTYPE), None), "'blk': a block device"),
    ((entry("fifo", tarfile.FIFOTYPE), None), "'fifo': a FIFO"),
    ((entry("hard", tarfile.LNKTYPE, "model_def.py"), None), "'hard': a hard link"),
    ((entry("abs", tarfile.SYMTYPE, "/etc/passwd"), None), "'abs': a symbolic link to "
                                                           "'/etc/passwd', an absolute path"),
    ((entry("up", tarfile.SYMTYPE, "../victim/existing"), None), "'up': a symbolic link to "
                                                                "'../victim/existing', outside"),
    ((entry("sub/up", tarfile.SYMTYPE, "x/../../.."), None), "'sub/up': a symbolic link to "
                                                             "'x/../../..', outside"),
])
def test_classic_members_are_refused_naming_them(tmp_path: Path, victim: Path, member,
                                                 why: str) -> None:
    blob = tar_gz((entry("model_def.py"), b"class MyTrial:\n    pass\n"), member)
    with pytest.raises(ContextError, match=f"^context: member {why}"):
        context.unpack(blob, tmp_path / "dest")
    assert sorted(os.listdir(tmp_path)) == ["dest", "victim"]


def test_links_may_not_lead_through_links(tmp_path: Path, victim: Path) -> None:
    """``d/..`` is the parent of what ``d`` points to: a link walking through another is
    refused even where its text looks inside; a file under a link is never written."""
    deep = entry("a/b/c/deep", tarfile.SYMTYPE, "..")
    through = entry("out", tarfile.SYMTYPE, "a/b/c/deep/../../../../victim/existing")
    with pytest.raises(ContextError, match=r"member 'out': .* through another link "
                                           r"\('a/b/c/deep'\)"):
        context.unpack(tar_gz((deep, None), (through, None)), tmp_path / "d1")
    link = entry("l", tarfile.SYMTYPE, "sub")
    with pytest.raises(ContextError, match="member 'l/x': under 'l', a symbolic link"):
        context.unpack(tar_gz((entry("sub", tarfile.DIRTYPE), None), (link, None),
                              (entry("l/x"), b"x")), tmp_path / "d2")
    with pytest.raises(ContextError, match=r"member 'f': appears twice \(already a file\)"):
        context.unpack(tar_gz((entry("f"), b"1"), (entry("f"), b"2")), tmp_path / "d3")


def test_links_inside_are_kept(tmp_path: Path) -> None:
    """Links to files and directories inside (a link before its target, a link to an
    ancestor, a link to a link) unpack as links; the agent's copy keeps them links."""
    blob = tar_gz((entry("alias.py", tarfile.SYMTYPE, "pkg/mod.py"), None),
                  (entry("pkg/here", tarfile.SYMTYPE, "."), None),
                  (entry("pkg/loop", tarfile.SYMTYPE, ".."), None),
                  (entry("pkg/mod.py"), b"y = 2\n"),
                  (entry("pkg/run.sh", tarfile.REGTYPE), b"#!/bin/sh\n"),
                  (entry("second", tarfile.SYMTYPE, "alias.py"), None))
    dest = tmp_path / "dest"
    context.unpack(blob, dest)
    assert (dest / "alias.py").read_text() == "y = 2\n" == (dest / "second").read_text()
    assert os.readlink(dest / "pkg" / "loop") == ".."
    assert (dest / "pkg" / "loop" / "pkg" / "here" / "mod.py").read_text() == "y = 2\n"
    assert not os.access(dest / "pkg" / "run.sh", os.X_OK)


@functools.cache
def bomb(size: int) -> bytes:
    """A tar.gz of one file of ``size`` zero bytes, compressed as it is written (about
    1/1000 of ``size``)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz:
        info = entry("zeros.bin")
        info.size = size
        gz.write(info.tobuf(tarfile.GNU_FORMAT))
        chunk = b"\0" * 2**20
        for _ in range(size // len(chunk)):
            gz.write(chunk)
        gz.write(b"\0" * 1024)
    return buf.getvalue()


def test_a_zip_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    blob = bomb(400 * 2**20)
    assert len(blob) < 500_000
    started = time.monotonic()
    with pytest.raises(ContextError, match=r"^context: more than 99614720 bytes uncompressed "
                                           r"\(at member 'zeros.bin', 419430400 bytes\)"):
        context.unpack(blob, tmp_path / "dest")
    assert time.monotonic() - started < 5
    assert os.listdir(tmp_path / "dest") == []


def test_caps_count_while_streaming(tmp_path: Path, monkeypatch) -> None:
    """Many files, each under the cap, stop where their sum passes it; a long-name (pax)
    header is capped before tarfile reads it whole; members are counted."""
    monkeypatch.setattr(context, "MAX_CONTEXT_BYTES", 2**20)
    monkeypatch.setattr(context, "MAX_CONTEXT_MEMBERS", 50)
    files = [(entry(f"f{i:02d}"), b"\1" * 100_000) for i in range(20)]
    with pytest.raises(ContextError, match=r"more than 1048576 bytes uncompressed \(at "
                                           r"member 'f10', 100000 bytes\)"):
        context.unpack(tar_gz(*files), tmp_path / "d1")
    assert sum(p.stat().st_size for p in (tmp_path / "d1").iterdir()) <= 2**20
    with pytest.raises(ContextError, match=r"^context: more than 1048576 bytes uncompressed"):
        context.unpack(tar_gz((entry("x" * 80 * 2**20), b"")), tmp_path / "d2")
    many = [(entry(f"e{i}"), b"") for i in range(51)]
    with pytest.raises(ContextError, match="member 'e50': more than 50 members"):
        context.unpack(tar_gz(*many), tmp_path / "d3")


@pytest.mark.parametrize("blob, why", [
    (b"not a tarball", "BadGzipFile"),
    (gzip.compress(b"neither a tar"), "ReadError"),
    (tar_gz((entry("model_def.py"), os.urandom(100_000)))[:50_000], "EOFError"),
    (b"", "ReadError|EOFError|BadGzipFile"),
], ids=["not gzip", "gzip of no tar", "truncated", "empty"])
def test_garbage_is_a_context_error(tmp_path: Path, blob: bytes, why: str) -> None:
    with pytest.raises(ContextError, match=f"^context 12: not a readable tar.gz.*({why})"):
        context.unpack(blob, tmp_path / "dest", "context 12")


# -- det serve: permission before unpacking, and bad contexts as 400s ----------------------------


@pytest.fixture
def server(det_env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    """det serve with its temporary files under ``tmp_path/server-tmp``."""
    (tmp_path / "server-tmp").mkdir()
    s = Server({**det_env, "TMPDIR": str(tmp_path / "server-tmp")}, tmp_path)
    yield s
    s.stop()


class Watch:
    """Every name that appears in ``directory`` while the block runs (polled each 2 ms)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen: set[str] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self) -> None:
        while not self.done.wait(0.002):
            self.seen.update(os.listdir(self.directory))

    def __enter__(self) -> "Watch":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()


def login(server: Server, name: str) -> httpx.Client:
    r = httpx.post(f"{server.url}/api/v1/auth/login",
                   json={"username": name, "password": "pw of " + name})
    return httpx.Client(base_url=server.url, timeout=60,
                        headers={"Authorization": f"Bearer {r.json()['token']}"})


def test_a_viewer_is_refused_before_the_context_is_unpacked(server: Server, conn,
                                                            tmp_path: Path,
                                                            victim: Path) -> None:
    """A Viewer's upload is a 403 whatever the context holds, and det serve writes nothing to
    its temp dir: garbage (the old code: a 500 from tarfile), the CVE-2025-4517 archive (the
    old code: wrote into ``victim``) or a decompression bomb (the old code: 400 MiB in the
    server's temp dir, then the 403)."""
    conn.execute("SELECT det_user.workspace_create('vision', NULL, NULL, NULL)")
    conn.execute("SELECT det_user.project_create('vision', 'p', '')")
    conn.execute("SELECT det_user.user_create('vic', %s, false)",
                 (password_verifier(conn, "vic", "pw of vic"),))
    conn.execute("SELECT det_user.role_assign('Viewer', 'vic', NULL, 'vision', true)")
    denied = "permission denied: needs Editor on workspace 'vision' to create an experiment " \
             "in project \"p\""
    with login(server, "vic") as vic, Watch(tmp_path / "server-tmp") as watch:
        for blob in (b"garbage", cve_2025_4517(victim), bomb(400 * 2**20)):
            r = vic.post("/api/v1/experiments", json={
                "config": CONFIG, "context": base64.b64encode(blob).decode(),
                "workspace": "vision", "project": "p"})
            assert error(r, 403) == denied
    assert watch.seen == set()
    assert conn.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 0


def test_bad_contexts_are_400s_naming_the_member(server: Server) -> None:
    api = server.client

    def post(blob: bytes | str) -> httpx.Response:
        text = blob if isinstance(blob, str) else base64.b64encode(blob).decode()
        return api.post("/api/v1/experiments", json={"config": CONFIG, "context": text})

    assert error(post(b"garbage"), 400).startswith("context: not a readable tar.gz")
    assert error(post(tar_gz((entry("h", tarfile.LNKTYPE, "x"), None))), 400) == (
        "context: member 'h': a hard link (to 'x'); only files, directories and symbolic "
        "links are accepted")
    assert error(post("é"), 400).startswith("context: expected base64 of a tar.gz")
    assert error(post(bomb(400 * 2**20)), 400).startswith(
        "context: more than 99614720 bytes uncompressed")


# -- downloads and GC never follow a link out of a checkpoint -----------------------------------


@pytest.fixture
def secrets_outside(tmp_path: Path) -> Iterator[Path]:
    """A host file and a host directory a task's links point to; checked untouched after."""
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "passwd").write_text("TOP SECRET passwd\n")
    (host / "etc" / "pgpass").write_text("TOP SECRET pgpass\n")
    yield host
    assert (host / "passwd").read_text() == "TOP SECRET passwd\n"
    assert (host / "etc" / "pgpass").read_text() == "TOP SECRET pgpass\n"


def plant_links(ckpt: Path, host: Path) -> None:
    """What a task can leave in its checkpoint: links to a host file and directory, absolute
    and relative, and one inside the checkpoint."""
    os.symlink(host / "passwd", ckpt / "passwd")
    os.symlink(host / "etc", ckpt / "etc")
    os.symlink(os.path.relpath(host / "passwd", ckpt / "sub"), ckpt / "sub-rel")
    (ckpt / "sub").mkdir()
    os.symlink(os.path.relpath(host / "passwd", ckpt / "sub"), ckpt / "sub" / "up")
    os.symlink("state.bin", ckpt / "latest")


LEFT_OUT = ["etc", "latest", "passwd", "sub-rel", "sub/up"]


def test_a_linked_checkpoint_downloads_without_the_targets(server: Server, ended, det,
                                                           secrets_outside: Path,
                                                           tmp_path: Path) -> None:
    """GET /checkpoints/{uuid}/download and `det checkpoint download` copy the checkpoint's
    files and leave its links out (the old code served the host's files they point to)."""
    _, [[uuid]] = ended.make([[(10, None)]])
    plant_links(ended.storage / uuid, secrets_outside)
    r = server.client.get(f"/api/v1/checkpoints/{uuid}/download")
    assert r.status_code == 200, r.text
    assert b"TOP SECRET" not in gzip.decompress(r.content)
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        assert {m.name: m.type for m in tar.getmembers()} == {
            uuid: tarfile.DIRTYPE, f"{uuid}/state.bin": tarfile.REGTYPE,
            f"{uuid}/sub": tarfile.DIRTYPE}
    out = tmp_path / "out"
    cli = det("checkpoint", "download", uuid, "-o", str(out))
    assert f"Left out 5 link(s) or other entries that are not files or directories: " \
           f"{', '.join(LEFT_OUT)}" in cli.stderr
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["state.bin", "sub"]


def test_a_checkpoint_that_is_a_link_is_not_downloaded(tmp_path: Path,
                                                       secrets_outside: Path) -> None:
    storage = FsspecStorage(fsspec.filesystem("file"), str(tmp_path / "ckpts"))
    (tmp_path / "ckpts").mkdir()
    os.symlink(secrets_outside / "etc", tmp_path / "ckpts" / "u1")
    with pytest.raises(StorageError, match="u1 is a symbolic link, not the checkpoint's "
                                           "directory; det does not follow it"):
        storage.download("u1", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_gc_removes_links_not_their_targets(tmp_path: Path, secrets_outside: Path) -> None:
    """The GC task's removals (checkpoints, TensorBoard files) never delete through a link:
    links inside a checkpoint go as links, a checkpoint that is a link goes as a link, and a
    directory on the way replaced by a link leaves the target alone (the old code removed
    ``host/experiment/7`` through ``tensorboard -> host``)."""
    base = tmp_path / "ckpts"
    (base / "u1").mkdir(parents=True)
    (base / "u1" / "state.bin").write_bytes(b"x")
    plant_links(base / "u1", secrets_outside)
    os.symlink(secrets_outside / "etc", base / "u2")
    (secrets_outside / "experiment" / "7").mkdir(parents=True)
    (secrets_outside / "experiment" / "7" / "events").write_text("theirs")
    os.symlink(secrets_outside, base / "tensorboard")
    storage = FsspecStorage(fsspec.filesystem("file"), str(base))
    assert storage.delete("u1") and storage.delete("u2")
    assert not delete_experiment_files(storage, 7)
    assert sorted(os.listdir(base)) == ["tensorboard"]
    assert (secrets_outside / "experiment" / "7" / "events").read_text() == "theirs"
    assert not storage.delete("u1")
