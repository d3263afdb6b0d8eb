"""A TensorBoard task's server: TensorBoard over the event files det writes for the chosen
experiments and trials (:mod:`det.harness.tensorboard`), behind det serve's proxy."""

import os
from collections.abc import Iterable, Mapping
from typing import Any

from det.harness.interactive.common import Server, ServerError, http_get
from det.harness.tensorboard import experiment_dir, storage_dir

LOCAL_STORAGE = ("shared_fs", "directory")
"""Storage types whose event files TensorBoard reads as local files (s3 would need TensorFlow's
file system plugins, which det's image does not have)."""

RELOAD_SECONDS = 5
"""How often TensorBoard looks for new events: a running trial's metrics show within seconds."""


def event_dirs(sources: Iterable[Mapping[str, Any]]) -> tuple[list[tuple[str, str]], list[str]]:
    """``(run name, directory)`` of each source (``det_task.tensorboard_sources`` rows: a whole
    experiment when ``trial_id`` is None, else one trial) on local storage, and a line saying
    why each other one is left out. A name is ``exp<id>`` or ``exp<id>-trial<id>``; the
    directory is the storage's base (``shared_fs``: host_path/storage_path; ``directory``:
    container_path) joined with :func:`~det.harness.tensorboard.experiment_dir` or
    :func:`~det.harness.tensorboard.storage_dir`."""
    dirs: list[tuple[str, str]] = []
    skipped: list[str] = []
    for row in sources:
        eid, tid = row["experiment_id"], row["trial_id"]
        what = f"experiment {eid}" if tid is None else f"trial {tid} of experiment {eid}"
        storage = row["storage"] or {}
        kind = storage.get("type")
        if kind not in LOCAL_STORAGE:
            skipped.append(f"{what}: its event files are on {kind or 'no'} storage, which "
                           f"TensorBoard here cannot read (only {' or '.join(LOCAL_STORAGE)})")
            continue
        if kind == "shared_fs":
            base = os.path.join(storage.get("host_path") or "/", storage.get("storage_path") or "")
        else:
            base = storage.get("container_path") or "/"
        rel = experiment_dir(eid) if tid is None else storage_dir(eid, tid)
        name = f"exp{eid}" if tid is None else f"exp{eid}-trial{tid}"
        dirs.append((name, os.path.normpath(os.path.join(base, rel))))
    return dirs, skipped


def logdir_spec(dirs: Iterable[tuple[str, str]]) -> str:
    """TensorBoard's ``--logdir_spec``: ``name:path`` pairs joined by commas.

    Raises:
        ServerError: no directory, or a path with a comma (the spec's separator).
    """
    pairs = []
    for name, path in dirs:
        if "," in path:
            raise ServerError(f"TensorBoard cannot read {path}: its --logdir_spec separates "
                              f"directories by commas")
        pairs.append(f"{name}:{path}")
    if not pairs:
        raise ServerError("TensorBoard has no event files to show: none of its experiments "
                          "and trials is on storage it can read")
    return ",".join(pairs)


def path_prefix(job_id: int) -> str:
    """Where det serve proxies the task; TensorBoard serves under it."""
    return f"/proxy/{job_id}"


def tensorboard_server(python: str, host: str, port: int, job_id: int,
                       dirs: list[tuple[str, str]], env: dict[str, str]) -> Server:
    """TensorBoard for job ``job_id`` on ``host:port`` over ``dirs`` (:func:`event_dirs`),
    answering at ``<prefix>/data/environment``. ``--load_fast false``: the Python loader,
    with no data server process of its own to start and stop."""
    argv = [python, "-m", "tensorboard.main", "--logdir_spec", logdir_spec(dirs),
            "--path_prefix", path_prefix(job_id), "--host", host, "--port", str(port),
            "--load_fast", "false", "--reload_interval", str(RELOAD_SECONDS)]
    url = f"http://{host}:{port}{path_prefix(job_id)}/data/environment"
    return Server("TensorBoard", argv, env, f"{host}:{port}",
                  lambda: http_get(url) is not None)
