"""The default task image: the commands and build args chosen (pure), and a real image built
offline (debootstrap, no registry) that imports det and torch."""

from pathlib import Path

import pytest

import det
from det.agent import image


def test_offline_and_online_differ_only_in_base() -> None:
    online, offline = image.build_args(offline=False), image.build_args(offline=True)
    assert online == {"BASE": "python:3.11-slim", "DET_VERSION": det.__version__,
                      "DET_IMAGE_REVISION": image.image_revision()}
    assert offline == {**online, "BASE": image.OFFLINE_BASE}
    # the offline base is named by its packages: one made with others is never reused
    assert image.OFFLINE_BASE.startswith("det/base:bookworm-")
    digest = image.OFFLINE_BASE.rsplit("-", 1)[1]
    assert image.rootfs_tarball().name == f"rootfs-bookworm-{digest}.tar"
    assert f"det/task:{det.__version__}-cpu" == image.DEFAULT_IMAGE


def test_wheels_are_det_with_torch_from_its_source_tree_and_the_hosts_torch(
        tmp_path: Path) -> None:
    cmd = image.wheel_command(tmp_path / "ctx", tmp_path / "cache")
    assert cmd[1:4] == ["-m", "pip", "wheel"]
    assert cmd[cmd.index("--wheel-dir") + 1] == str(tmp_path / "ctx")
    # The cache is a source, so a second build downloads nothing it already has.
    assert cmd[cmd.index("--find-links") + 1] == str(tmp_path / "cache")
    src = Path(det.__file__).resolve().parent
    assert (src / "pyproject.toml").is_file()
    torch = pytest.importorskip("torch")
    # The host's torch build (here +cpu), not the index's newest.
    assert cmd[-2:] == [f"{src}[torch]", f"torch=={torch.__version__}"]


def test_debootstrap_command_mirror_from_argument_then_env(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DET_DEBIAN_MIRROR", raising=False)
    cmd = image.debootstrap_command(tmp_path)
    assert cmd == ["debootstrap", "--variant=minbase",
                   "--include=python3,python3-venv,ca-certificates,openssh-server", "bookworm",
                   str(tmp_path),
                   "http://deb.debian.org/debian"]
    monkeypatch.setenv("DET_DEBIAN_MIRROR", "http://mirror.example/debian")
    assert image.debootstrap_command(tmp_path)[-1] == "http://mirror.example/debian"
    assert image.debootstrap_command(tmp_path, "http://m/d")[-1] == "http://m/d"


def test_dockerfile_is_package_data() -> None:
    assert image.DOCKERFILE.is_file()
    assert "ARG BASE" in image.DOCKERFILE.read_text()


def test_task_image_imports_det_and_torch_and_has_the_interactive_servers(
        docker_client, task_image: str) -> None:
    out = docker_client.containers.run(
        task_image, ["python3", "-c", "import det.harness, torch, psycopg, jupyterlab, "
                     "tensorboard, os, sys; print(sys.version_info[:2] == (3, 11), "
                     "torch.__version__, sys.executable, os.access('/usr/sbin/sshd', os.X_OK), "
                     "os.listdir('/etc/ssh').count('ssh_host_ed25519_key'))"],
        remove=True, network_mode="none").decode()
    is_311, torch_version, executable, has_sshd, host_keys = out.split()
    assert is_311 == "True"
    assert torch_version.startswith("2.")
    assert executable == "/opt/det/venv/bin/python3"
    # shell tasks' sshd, with no host key baked in (each task makes its own)
    assert (has_sshd, host_keys) == ("True", "0")
    labels = docker_client.images.get(task_image).labels
    assert labels["ai.det.version"] == det.__version__
    assert labels[image.LABEL_REVISION] == image.image_revision()
