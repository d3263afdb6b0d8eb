"""det's default task image: Python 3.11 with det[torch] in a venv at ``/opt/det/venv``.

One Dockerfile (``agent/image/Dockerfile``) is built in two ways, chosen by its ``BASE`` arg:

- online: ``FROM python:3.11-slim``, pulled from a registry;
- offline: ``FROM det/base:bookworm-<digest>``, a Debian bookworm root filesystem made by
  ``debootstrap`` from a Debian mirror with :data:`BASE_PACKAGES` and imported into the engine
  (bookworm's python3 is 3.11, the same cp311 ABI as the wheels); the digest is of the
  package list, so a base made with other packages is never taken for it.

The host's pip first writes det[torch] and all its dependencies (JupyterLab, TensorBoard) as
wheels into the build context, torch pinned to the host's own build. An offline build then
fetches nothing (it runs with no network); an online one fetches only Debian's
``openssh-server`` for shell tasks, which python:3.11-slim lacks. The wheels and the
root-filesystem tarball are cached under ``det_home()/image``, so a second build downloads
nothing and only repeats the image steps. Tasks run ``python3`` from the venv, which ``PATH``
puts first. The image is labelled with :func:`image_revision`: an image of det's tag built
from another Dockerfile, base or set of dependencies is built again by
:func:`ensure_default_image`.

Measured on 2 cores with a CPU torch: about 2 min from nothing (debootstrap included) and
1 min 50 s again with the caches; the image was 1.5 GB. With JupyterLab and openssh-server
it is 1.8 GB, and took 10 min with the base cached on the same 2 cores shared with
four other test runs (load ~5), so not comparable.
"""

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors

import det
from det.db.connect import det_home
from det.errors import ImageError

# "cpu": the torch inside is the host's build, the CPU one on hosts that have no CUDA torch.
DEFAULT_IMAGE = f"det/task:{det.__version__}-cpu"
ONLINE_BASE = "python:3.11-slim"
# bookworm is the Debian release whose python3 is 3.11, the Python the wheels are built for.
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DOCKERFILE = Path(__file__).parent / "image" / "Dockerfile"
# python3-venv brings ensurepip's bundled pip, which installs the wheels inside the image;
# openssh-server is the sshd of shell tasks (det.harness.interactive).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "openssh-server")
_BASE_DIGEST = hashlib.sha256(",".join(BASE_PACKAGES).encode()).hexdigest()[:8]
OFFLINE_BASE = f"det/base:{SUITE}-{_BASE_DIGEST}"
LABEL_REVISION = "ai.det.image-revision"
IMAGE_PINS = ("soupsieve<3",)
"""Versions the wheels are held to, beyond det's own requirements: the host's pip picks what
its own Python accepts, and these newest versions need a later 3.11 than the offline base's
(bookworm's python3 is 3.11.2; soupsieve 3 and later, which JupyterLab pulls in through
nbconvert and beautifulsoup4, need 3.11.5)."""
# `docker import` gives an image no environment; these match python:3.11-slim's.
BASE_CHANGES = ("ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ENV LANG=C.UTF-8", 'CMD ["python3"]')

Log = Callable[[str], None]


def image_dir() -> Path:
    """Where build inputs are cached: ``det_home()/image`` (``wheels/``, ``rootfs-bookworm.tar``;
    delete it to start over) and the build context is assembled (``context/``)."""
    return det_home() / "image"


def rootfs_tarball() -> Path:
    """The cached root filesystem of the offline base (named by its packages' digest)."""
    return image_dir() / f"rootfs-{SUITE}-{_BASE_DIGEST}.tar"


def image_revision() -> str:
    """What the default image is built from, as a digest: the Dockerfile, the offline base's
    packages, :data:`IMAGE_PINS` and det's requirements (its ``Requires-Dist``, JupyterLab's
    among them)."""
    parts = [DOCKERFILE.read_bytes(), ",".join(BASE_PACKAGES).encode(),
             ",".join(IMAGE_PINS).encode()]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        parts += [r.encode() for r in importlib.metadata.requires("det") or []]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]


def det_requirements() -> list[str]:
    """What pip makes wheels of: det with its torch extra, from its source tree when det runs
    from one (the directory holding pyproject.toml, as in an editable install), else at this
    version from the index; and torch pinned to the host's own build when the host has torch,
    so a CPU host's image gets that CPU build rather than the index's newest (CUDA, ~3 GB)."""
    src = Path(det.__file__).resolve().parent
    if (src / "pyproject.toml").is_file():
        reqs = [f"{src}[torch]"]
    else:
        reqs = [f"det[torch]=={det.__version__}"]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        reqs.append(f"torch=={importlib.metadata.version('torch')}")
    return reqs


def wheel_command(wheel_dir: Path, cache_dir: Path, requirements: list[str] | None = None,
                  constraints: Path | None = None) -> list[str]:
    """The host pip command that writes ``requirements`` (default :func:`det_requirements`) and
    all their dependencies as wheels into ``wheel_dir``, taking those it can from
    ``cache_dir`` rather than downloading them again, within ``constraints`` (a pip
    constraints file: :data:`IMAGE_PINS`)."""
    return [sys.executable, "-m", "pip", "wheel", "--progress-bar", "off",
            "--wheel-dir", str(wheel_dir), "--find-links", str(cache_dir),
            *(["--constraint", str(constraints)] if constraints else []),
            *(requirements or det_requirements())]


def debootstrap_command(rootfs: Path, mirror: str | None = None) -> list[str]:
    """The debootstrap command that makes the offline base's root filesystem in ``rootfs``
    from ``mirror`` (default: ``DET_DEBIAN_MIRROR``, else deb.debian.org)."""
    mirror = mirror or os.environ.get("DET_DEBIAN_MIRROR") or DEFAULT_MIRROR
    return ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            SUITE, str(rootfs), mirror]


def build_args(offline: bool) -> dict[str, str]:
    """The Dockerfile's build args: the base image, det's version and the image's revision
    (for the labels)."""
    return {"BASE": OFFLINE_BASE if offline else ONLINE_BASE, "DET_VERSION": det.__version__,
            "DET_IMAGE_REVISION": image_revision()}


def build_default_image(client: docker.DockerClient, tag: str = DEFAULT_IMAGE,
                        offline: bool = False, mirror: str | None = None,
                        log: Log = print) -> str:
    """Build the task image as ``tag`` and return the tag; build output goes to ``log`` line by
    line. ``offline`` bases it on a debootstrapped bookworm instead of pulling
    ``python:3.11-slim``; ``mirror`` is the Debian mirror debootstrap reads (default:
    ``DET_DEBIAN_MIRROR``, else deb.debian.org).

    Raises:
        ImageError: the host's Python is not 3.11, pip cannot make the wheels, the base cannot
            be pulled or made (debootstrap missing, not root), or a build step fails.
    """
    with _build_lock():
        _build(client, tag, offline, mirror, log)
    return tag


def ensure_default_image(client: docker.DockerClient, tag: str = DEFAULT_IMAGE,
                         log: Log = print) -> str:
    """``tag`` if the engine has it at this :func:`image_revision`, else build it offline (no
    registry needed) and return it.

    Raises:
        ImageError: as :func:`build_default_image`.
    """
    if _is_current(client, tag):
        return tag
    with _build_lock():
        if not _is_current(client, tag):  # another process may have built it while we waited
            log(f"{tag} is missing or older than this det's image; building it offline")
            _build(client, tag, True, None, log)
    return tag


def _is_current(client: docker.DockerClient, tag: str) -> bool:
    try:
        labels = client.images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        return False
    return labels.get(LABEL_REVISION) == image_revision()


def _build(client: docker.DockerClient, tag: str, offline: bool, mirror: str | None,
           log: Log) -> None:
    if sys.version_info[:2] != (3, 11):
        raise ImageError(f"the task image needs wheels for Python 3.11 but det runs on "
                         f"{sys.version.split()[0]}; run `det image build` from a Python 3.11 "
                         f"environment")
    if offline:
        ensure_offline_base(client, mirror, log)
    else:
        _pull_online_base(client, log)
    context, cache = image_dir() / "context", image_dir() / "wheels"
    # The context gets exactly this resolution's wheels (the cache may hold older ones).
    wheels = context / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    cache.mkdir(exist_ok=True)
    requirements = det_requirements()
    pins = image_dir() / "constraints.txt"
    pins.write_text("".join(f"{pin}\n" for pin in IMAGE_PINS))
    _run(wheel_command(wheels, cache, requirements, pins), log,
         f"pip could not make wheels of {' '.join(requirements)}; if the torch pin is not on "
         f"pip's indexes, give it one (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)")
    for wheel in wheels.glob("*.whl"):
        if not (cache / wheel.name).exists():
            os.link(wheel, cache / wheel.name)
    shutil.copyfile(DOCKERFILE, context / "Dockerfile")
    _docker_build(client, context, tag, build_args(offline), log, network=not offline)


def ensure_offline_base(client: docker.DockerClient, mirror: str | None = None,
                        log: Log = print) -> str:
    """Import the cached bookworm root filesystem as ``det/base:bookworm`` unless the engine has
    it, debootstrapping the tarball first if it is not cached; return the tag.

    Raises:
        ImageError: debootstrap is missing, det is not root, or debootstrap fails.
    """
    if _has_image(client, OFFLINE_BASE):
        return OFFLINE_BASE
    tarball = rootfs_tarball()
    if not tarball.is_file():
        _debootstrap(tarball, mirror, log)
    repository, tag = OFFLINE_BASE.split(":")
    log(f"importing {tarball} as {OFFLINE_BASE}")
    try:
        client.api.import_image_from_file(str(tarball), repository=repository, tag=tag,
                                          changes=list(BASE_CHANGES))
    except docker.errors.APIError as e:
        raise ImageError(f"the engine refused to import {tarball} ({e.explanation}); delete it "
                         f"and run `det image build --offline` again") from e
    return OFFLINE_BASE


def _debootstrap(tarball: Path, mirror: str | None, log: Log) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed; `apt-get install debootstrap`, or build "
                         "online with `det image build` on a machine that can pull images")
    if os.geteuid() != 0:
        raise ImageError("debootstrap needs root; run `sudo det image build --offline`")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent, prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = debootstrap_command(rootfs, mirror)
        _run(cmd, log, f"debootstrap of {SUITE} from {cmd[-1]} failed; check the mirror "
                       f"(--mirror or DET_DEBIAN_MIRROR)")
        # Downloaded .debs and package lists are only needed to install, not to run.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        partial = Path(tmp) / "rootfs.tar"
        _run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], log,
             f"could not write {tarball}")
        partial.replace(tarball)  # the cache only ever holds a complete tarball


def _pull_online_base(client: docker.DockerClient, log: Log) -> None:
    if _has_image(client, ONLINE_BASE):
        return
    log(f"pulling {ONLINE_BASE}")
    try:
        client.images.pull(ONLINE_BASE)
    except docker.errors.APIError as e:
        raise ImageError(f"cannot pull {ONLINE_BASE} ({e.explanation}); on a machine with no "
                         f"registry use `det image build --offline`") from e


def _docker_build(client: docker.DockerClient, context: Path, tag: str,
                  args: dict[str, str], log: Log, network: bool) -> None:
    step, last_id, stages = "", None, []
    old_id = client.images.get(tag).id if _has_image(client, tag) else None
    try:
        # network_mode none offline: the build must not fetch anything; all it needs is in the
        # context and the base. Online, apt fetches openssh-server (see the Dockerfile).
        for chunk in client.api.build(path=str(context), tag=tag, buildargs=args, decode=True,
                                      rm=True, forcerm=True, pull=False,
                                      network_mode=None if network else "none"):
            if "error" in chunk:
                raise ImageError(f"building {tag} failed at {step.strip() or 'the start'}: "
                                 f"{chunk['error'].strip()}; see the build output above")
            for line in chunk.get("stream", "").splitlines():
                if line.startswith("Step "):
                    step = line
                    if " : FROM " in line and last_id:
                        stages.append(last_id)
                elif line.startswith(" ---> ") and " " not in line[6:]:
                    last_id = line[6:]
                if line.strip():
                    log(line)
    except docker.errors.APIError as e:
        raise ImageError(f"the engine refused to build {tag}: {e.explanation}") from e
    # The install stage's image (wheels and a venv, GBs) and the image the tag named before are
    # dangling now; nothing reuses them, as every build makes a new det wheel. Removal fails,
    # harmlessly, for an old image a container still uses.
    new_id = client.images.get(tag).id
    for image_id in [*stages, *([old_id] if old_id and old_id != new_id else [])]:
        try:
            client.images.remove(image_id)
        except docker.errors.APIError as e:
            log(f"kept image {image_id}: {e.explanation}")


def _has_image(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _run(cmd: list[str], log: Log, failure: str) -> None:
    """Run ``cmd`` with its output (stdout and stderr) going to ``log`` line by line."""
    log("$ " + " ".join(cmd))
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
    except OSError as e:
        raise ImageError(f"{failure}: {e.strerror}") from e
    assert proc.stdout is not None
    tail = ""
    for line in proc.stdout:
        if line.strip():
            tail = line.strip()
            log(line.rstrip())
    if proc.wait() != 0:
        raise ImageError(f"{failure} (exit {proc.returncode}: {tail})")


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """Serialise builds on this host: two would write the same cached wheels and tarball."""
    image_dir().mkdir(parents=True, exist_ok=True)
    with open(image_dir() / "build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
