"""The ``docker`` runtime: each task in a container of its own, through the docker SDK.

A task container (spec: experiment-lifecycle, Trial Setup; system-architecture, Agent) gets
the unpacked context as its working directory, the agent's own det package mounted read-only
and first on ``PYTHONPATH`` (so the harness always speaks the schema's version of the SQL
API, whatever det the image holds), the task's environment, the user's ``bind_mounts``, the
checkpoint storage and the database's socket directory at their host paths, the TLS files
the database URL names (``sslrootcert``, ``sslcert``, ``sslkey``, ``sslcrl``: an agent of
another host verifies det's gateway with its CA) read-only at theirs, host networking
(so the database URL the agent uses works unchanged, as Determined's default
``network_mode: host``), ``shm_size`` (default 4 GiB, as in
Determined 0.38's ``resources.json`` schema), an optional memory limit, its
CUDA devices by uuid or a CPU share, and labels naming its allocation and agent, so a
restarted agent adopts it instead of starting it twice.
"""

import contextlib
import logging
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
from docker.types import DeviceRequest, Mount
from docker.utils import parse_repository_tag
from psycopg.conninfo import conninfo_to_dict

import det
from det.agent.image import DEFAULT_IMAGE
from det.agent.logs import LogShipper
from det.agent.runtime import DRAIN_SECONDS, Exit, Launch
from det.configs.allocation import AllocationSpec
from det.errors import DetError

log = logging.getLogger("det.agent")

LABEL_ALLOCATION = "ai.det.allocation"
LABEL_AGENT = "ai.det.agent"
WORKDIR = "/run/det/workdir"
HARNESS_DIR = "/run/det/lib"
DEFAULT_SHM_BYTES = 4 * 2**30
# docker's relative CPU weight for one CPU slot (its default weight for a container).
CPU_SHARES_PER_SLOT = 1024

# Runs the context's startup-hook.sh (sourced, so its exports reach the task; spec:
# run-training-code, Get Ready), then becomes the entrypoint, which thus receives the SIGTERM
# that docker's init (PID 1) forwards.
_WRAPPER = """if [ -f ./startup-hook.sh ]; then . ./startup-hook.sh || exit $?; fi
exec "$@"
"""


class RuntimeUnavailable(DetError):
    """No Docker engine answers."""


def image_for(spec: AllocationSpec, device_type: str) -> str:
    """The image a task on ``device_type`` runs: ``environment.image`` for that device type,
    or det's default task image."""
    return getattr(spec.environment.image, device_type) or DEFAULT_IMAGE


def container_config(launch: Launch, *, agent_id: str, image: str, db_url: str,
                     harness_dir: Path) -> dict[str, Any]:
    """The keyword arguments of ``containers.create`` for ``launch`` (pure; the rules are in
    the module docstring). Resource keys come from the spec's ``resources``: ``shm_size``
    and ``memory_limit`` in bytes."""
    spec = launch.spec
    resources = spec.resources
    mounts = [Mount(WORKDIR, str(launch.workdir), type="bind"),
              Mount(f"{HARNESS_DIR}/det", str(harness_dir), type="bind", read_only=True)]
    shared = _socket_dirs(db_url)
    if (storage := shared_fs_path(spec)) is not None:
        shared.append(storage)
    mounts += [Mount(p, p, type="bind") for p in dict.fromkeys(shared)]
    mounts += [Mount(p, p, type="bind", read_only=True) for p in _tls_files(db_url)]
    for m in spec.bind_mounts:
        target = PurePosixPath(WORKDIR, m.container_path)  # an absolute path stays as is
        mounts.append(Mount(str(target), m.host_path, type="bind", read_only=m.read_only))
    config: dict[str, Any] = {
        "image": image,
        "command": ["sh", "-c", _WRAPPER, "det-task", *launch.argv],
        "working_dir": WORKDIR,
        "environment": {**launch.env, "PYTHONPATH": HARNESS_DIR},
        "labels": {LABEL_ALLOCATION: str(launch.allocation_id), LABEL_AGENT: agent_id},
        "mounts": mounts,
        "network_mode": "host",
        "init": True,
        "shm_size": resources.shm_size or DEFAULT_SHM_BYTES,
    }
    if resources.memory_limit:
        config["mem_limit"] = resources.memory_limit
    gpus = [s.device_uuid for s in launch.slots if s.type == "cuda" and s.device_uuid]
    if gpus:
        config["device_requests"] = [DeviceRequest(device_ids=gpus, capabilities=[["gpu"]])]
    elif launch.slots:
        config["cpu_shares"] = CPU_SHARES_PER_SLOT * len(launch.slots)
    return config


def shared_fs_path(spec: AllocationSpec) -> str | None:
    """The host directory of ``shared_fs`` checkpoint storage (mounted at the same path), or
    None for other storage."""
    storage = spec.checkpoint_storage
    return storage.host_path if storage is not None and storage.type == "shared_fs" else None


def _socket_dirs(db_url: str) -> list[str]:
    """The Unix-socket directories a database URL names (host=/dir), to mount as they are."""
    hosts = conninfo_to_dict(db_url).get("host") or ""
    return [h for h in str(hosts).split(",") if h.startswith("/")]


def _tls_files(db_url: str) -> list[str]:
    """The certificate and key files a database URL names (absolute paths), to mount as
    they are: without its CA file a task cannot verify the server (sslmode=verify-full)."""
    params = conninfo_to_dict(db_url)
    return [str(params[k]) for k in ("sslrootcert", "sslcert", "sslkey", "sslcrl")
            if str(params.get(k) or "").startswith("/")]


def end_reason(state: dict[str, Any], killed: bool) -> str | None:
    """A reason a user can read for a container's end, from ``State`` of its inspection."""
    code = state.get("ExitCode")
    if state.get("OOMKilled"):
        return "out of memory: the container reached its memory limit and was killed"
    if killed:
        return "killed on request"
    if state.get("Error"):
        return f"container error: {state['Error']}"
    if isinstance(code, int) and code > 128:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(code - 128).name}"
    return None


class ContainerTask:
    """One task container, started or adopted. Its stdout and stderr are followed by two
    threads into the task logs, from ``since`` (epoch seconds) on."""

    def __init__(self, container, logs: LogShipper, since: float | None = None) -> None:
        self.container = container
        self.allocation_id = int(container.labels[LABEL_ALLOCATION])
        self._killed = False
        self._exited_at: float | None = None
        self._readers = [threading.Thread(target=self._follow, args=(stream, logs, since),
                                          daemon=True, name=f"logs-{self.allocation_id}")
                         for stream in ("stdout", "stderr")]
        for t in self._readers:
            t.start()

    def _follow(self, stream: str, logs: LogShipper, since: float | None) -> None:
        chunks = self.container.logs(stdout=stream == "stdout", stderr=stream == "stderr",
                                     stream=True, follow=True, since=since)
        pending = b""
        for chunk in chunks:
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                logs.add(self.allocation_id, stream, raw.decode(errors="replace"))
        if pending:
            logs.add(self.allocation_id, stream, pending.decode(errors="replace"))

    @property
    def killed(self) -> bool:
        return self._killed

    def poll(self) -> Exit | None:
        """The container's end once it has exited and its output is read, else None; never
        blocks on the output (followed for at most ``DRAIN_SECONDS`` after the exit)."""
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return Exit(None, "the container vanished (removed outside det)")
        if self.container.status not in ("exited", "dead"):
            return None
        now = time.monotonic()
        if self._exited_at is None:
            self._exited_at = now
        if any(t.is_alive() for t in self._readers) and now < self._exited_at + DRAIN_SECONDS:
            return None
        state = self.container.attrs["State"]
        return Exit(state.get("ExitCode"), end_reason(state, self.killed))

    def kill(self) -> None:
        """SIGKILL the container (see ``Task.kill``)."""
        self._killed = True
        self._signal("SIGKILL")

    def _signal(self, sig: str) -> None:
        # The container may have exited since the last look; that is what was wanted.
        with contextlib.suppress(docker.errors.APIError):
            self.container.kill(signal=sig)

    def remove(self) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.container.remove(force=True)


class DockerRuntime:
    """Task containers on the Docker engine ``client`` talks to, for agent ``agent_id``."""

    name = "docker"
    python = "python3"

    def __init__(self, client, logs: LogShipper, agent_id: str, db_url: str,
                 device_type: str) -> None:
        self.client = client
        self.logs = logs
        self.agent_id = agent_id
        self.db_url = db_url
        self.device_type = device_type
        self.harness_dir = Path(det.__file__).resolve().parent
        self._pulls: dict[int, Future[None]] = {}
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pull")

    @classmethod
    def connect(cls, logs: LogShipper, agent_id: str, db_url: str,
                device_type: str) -> "DockerRuntime":
        """Raises ``RuntimeUnavailable`` when no engine answers at DOCKER_HOST (or the
        default socket)."""
        try:
            client = docker.from_env()
            client.ping()
        except docker.errors.DockerException as e:
            raise RuntimeUnavailable(f"no Docker engine answers: {e}") from e
        return cls(client, logs, agent_id, db_url, device_type)

    # -- images -------------------------------------------------------------------------------

    def fetch(self, allocation_id: int, spec: AllocationSpec) -> "Future[None] | None":
        """Pull the task's image when it is missing (or always, with
        ``environment.force_pull_image``), progress going to the task's logs."""
        if (pulling := self._pulls.get(allocation_id)) is not None:
            if pulling.done():  # handed back once finished, whatever the outcome
                del self._pulls[allocation_id]
            return pulling
        image = image_for(spec, self.device_type)
        env = spec.environment
        if not env.force_pull_image:
            try:
                self.client.images.get(image)
                return None
            except docker.errors.ImageNotFound:
                pass
        future = self._pool.submit(self._pull, allocation_id, image, env.registry_auth)
        self._pulls[allocation_id] = future
        return future

    def _pull(self, allocation_id: int, image: str, auth: dict | None) -> None:
        repo, tag = parse_repository_tag(image)
        self.logs.add(allocation_id, "det", f"pulling image {image}")
        # det's own image is built, not published: say how to get it.
        hint = "; build it with `det image build [--offline]`" if image == DEFAULT_IMAGE else ""
        try:
            for event in self.client.api.pull(repo, tag or "latest", stream=True, decode=True,
                                              auth_config=auth):
                if "error" in event:
                    raise DetError(f"cannot pull image {image}: {event['error']}{hint}")
                if event.get("status") and "progress" not in event:
                    self.logs.add(allocation_id, "det",
                                  " ".join(filter(None, (event.get("id"), event["status"]))))
        except docker.errors.APIError as e:
            raise DetError(f"cannot pull image {image}: {e.explanation or e}{hint}") from e

    # -- tasks --------------------------------------------------------------------------------

    def launch(self, launch: Launch) -> ContainerTask:
        image = image_for(launch.spec, self.device_type)
        config = container_config(launch, agent_id=self.agent_id, image=image,
                                  db_url=self.db_url, harness_dir=self.harness_dir)
        if (storage := shared_fs_path(launch.spec)) is not None:
            # The first task on a new cluster finds no checkpoint directory; a bind mount
            # needs one.
            Path(storage).mkdir(parents=True, exist_ok=True)
        try:
            container = self.client.containers.create(
                name=f"det-{self.agent_id}-{launch.allocation_id}", **config)
        except docker.errors.ImageNotFound as e:
            raise DetError(f"image {image} is not on this agent and could not be pulled") from e
        except docker.errors.APIError as e:
            raise DetError(f"cannot create the container: {e.explanation or e}") from e
        try:
            container.start()
        except docker.errors.APIError as e:
            container.remove(force=True)
            raise DetError(f"cannot start the container: {e.explanation or e}") from e
        return ContainerTask(container, self.logs)

    def adopt(self, agent_id: str,
              live: dict[int, datetime | None]) -> dict[int, ContainerTask]:
        """Containers labelled with this agent: those of ``live`` allocations are followed
        again, their logs from the time of the last line shipped on (``live``'s values), so
        nothing is repeated; the rest are removed."""
        adopted: dict[int, ContainerTask] = {}
        for c in self.client.containers.list(all=True,
                                             filters={"label": f"{LABEL_AGENT}={agent_id}"}):
            alloc_id = int(c.labels.get(LABEL_ALLOCATION, -1))
            if alloc_id in live:
                since = live[alloc_id]
                adopted[alloc_id] = ContainerTask(
                    c, self.logs, since=since.timestamp() + 1e-6 if since else None)
                log.info("allocation %s: adopted container %s", alloc_id, c.short_id)
            else:
                log.info("removing container %s of ended allocation %s", c.short_id, alloc_id)
                with contextlib.suppress(docker.errors.NotFound):
                    c.remove(force=True)
        return adopted
