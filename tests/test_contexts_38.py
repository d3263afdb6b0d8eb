"""Contexts follow symbolic links out of the context to files, as Determined 0.38.1's CLI does
(issue 38: all six upstream e2e ``mnist_pytorch`` fixtures link their code to an example
elsewhere in the checkout, and det refused them); dangling links, loops and links to
directories outside stay refused, naming the link; an uploaded archive's links stay checked."""

import io
import os
import tarfile
from pathlib import Path

import pytest

from det import context
from det.errors import ContextError
from det.submission import context_with


def members(blob: bytes) -> dict[str, str]:
    """Member name -> its content for a file, "link -> target" for a link."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {m.name: f"link -> {m.linkname}" if m.issym()
                else tar.extractfile(m).read().decode() for m in tar.getmembers()}


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """An upstream-like checkout: examples/mnist holds the code, e2e/fixtures/mnist (the
    context) links to it, relatively as upstream's fixtures do, and absolutely."""
    example = tmp_path / "examples" / "mnist"
    example.mkdir(parents=True)
    (example / "model_def.py").write_text("class MNistTrial: pass\n")
    (example / "data.py").write_text("def load(): return 1\n")
    ctx = tmp_path / "e2e" / "fixtures" / "mnist"
    (ctx / "pkg").mkdir(parents=True)
    (ctx / "const.yaml").write_text("name: mnist\n")
    os.symlink("../../../examples/mnist/model_def.py", ctx / "model_def.py")
    os.symlink(example / "data.py", ctx / "pkg" / "data.py")
    os.symlink("../const.yaml", ctx / "pkg" / "const.yaml")  # inside: stays a link
    return ctx


def test_links_out_of_the_context_to_files_are_followed_and_noted(checkout: Path,
                                                                   tmp_path: Path) -> None:
    notes: list[str] = []
    blob = context.pack(checkout, note=notes.append)
    assert members(blob) == {
        "const.yaml": "name: mnist\n",
        "model_def.py": "class MNistTrial: pass\n",
        "pkg/const.yaml": "link -> ../const.yaml",
        "pkg/data.py": "def load(): return 1\n",
    }
    example = (tmp_path / "examples" / "mnist").resolve()
    assert notes == [
        "context: model_def.py is a symbolic link to ../../../examples/mnist/model_def.py "
        f"outside the context; packed a copy of {example / 'model_def.py'}",
        f"context: pkg/data.py is a symbolic link to {example / 'data.py'} outside the "
        f"context; packed a copy of {example / 'data.py'}",
    ]
    out = tmp_path / "out"
    context.unpack(blob, out)
    assert (out / "model_def.py").read_text() == "class MNistTrial: pass\n"
    assert not (out / "model_def.py").is_symlink()


def test_the_note_goes_to_stderr_by_default(checkout: Path, capsys) -> None:
    context.pack(checkout)
    err = capsys.readouterr().err
    assert "model_def.py is a symbolic link to ../../../examples" in err
    assert "pkg/data.py is a symbolic link to" in err


def test_followed_files_count_towards_the_size_limit(checkout: Path, tmp_path: Path,
                                                     monkeypatch) -> None:
    monkeypatch.setattr(context, "MAX_CONTEXT_BYTES", 1000)
    (tmp_path / "examples" / "mnist" / "data.py").write_bytes(b"#" * 2000)
    with pytest.raises(ContextError, match="limit is 95 MiB"):
        context.pack(checkout)


def test_include_keeps_relative_links_out_of_the_context(checkout: Path,
                                                         tmp_path: Path) -> None:
    """``--include`` packs a temporary copy of the context, from where the fixture's relative
    link would lead nowhere."""
    extra = tmp_path / "extra.txt"
    extra.write_text("more\n")
    with context_with(checkout, [extra]) as root:
        blob = context.pack(root, note=lambda _: None)
    got = members(blob)
    assert got["model_def.py"] == "class MNistTrial: pass\n"
    assert got["extra.txt"] == "more\n" and got["pkg/const.yaml"] == "link -> ../const.yaml"


@pytest.mark.parametrize(("links", "named", "why"), [
    ({"helper.py": "missing.py"}, "helper.py", "which does not exist"),
    ({"helper.py": "../../nowhere.py"}, "helper.py", "which does not exist"),
    ({"helper.py": "helper.py"}, "helper.py", "which loops"),
    ({"a.py": "b.py", "b.py": "a.py"}, "a.py", "which loops"),
    ({"a.py": "../loop.py"}, "a.py", "which loops"),  # a loop outside the context
    ({"lib": "../../../examples"}, "lib", "a directory outside the context"),
])
def test_dangling_looping_and_directory_links_are_refused(checkout: Path, tmp_path: Path,
                                                          links: dict[str, str], named: str,
                                                          why: str) -> None:
    os.symlink("loop.py", tmp_path / "e2e" / "fixtures" / "loop.py")
    for name, target in links.items():
        os.symlink(target, checkout / name)
    with pytest.raises(ContextError) as info:
        context.pack(checkout, note=lambda _: None)
    message = str(info.value)
    assert f": {named} is a symbolic link to {links[named]}, {why}" in message
    assert "\n" not in message


def test_an_uploaded_archive_with_a_link_out_is_still_refused(tmp_path: Path) -> None:
    """Following is the CLI reading its user's own checkout; an archive that arrives packed
    (the API, a stored blob) is unpacked member by member and a link out is refused."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        link = tarfile.TarInfo("model_def.py")
        link.type, link.linkname = tarfile.SYMTYPE, "../../etc/passwd"
        tar.addfile(link)
    with pytest.raises(ContextError, match="model_def.py"):
        context.unpack(buf.getvalue(), tmp_path / "out")


def test_create_follows_the_link_and_says_so(det, conn, checkout: Path, tmp_path: Path) -> None:
    """``det experiment create`` of an upstream-style fixture: accepted, the note printed, the
    stored context holding the followed file's content."""
    config = tmp_path / "const.yaml"
    config.write_text("name: mnist\nentrypoint: model_def:MNistTrial\n"
                      "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n")
    r = det("experiment", "create", str(config), str(checkout))
    assert "Created experiment" in r.stdout
    assert "context: model_def.py is a symbolic link to ../../../examples/mnist/model_def.py " \
           "outside the context; packed a copy of" in r.stderr
    blob = conn.execute("SELECT b.data FROM experiments e JOIN context_blobs b "
                        "ON b.id = e.context_id").fetchone()["data"]
    assert members(bytes(blob))["model_def.py"] == "class MNistTrial: pass\n"
