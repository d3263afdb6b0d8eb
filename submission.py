"""Submission: the one path by which experiments and interactive tasks enter the cluster,
used alike by the ``det`` CLI and ``det serve`` (the API no longer imports the CLI).

A submission reads the config (a file or text, ``--config`` overrides, a template merged under
it, the workspace's defaults under everything), validates and expands it (det.configs), packs
the context, refuses what no agent could ever run (unless forced), and stores it in one
transaction through ``det_user.create_experiment`` or ``det_internal.create_task`` (schema.sql).
"""

import ast
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psycopg
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg.types.json import Jsonb

from det import context
from det.configs import ExperimentConfig, is_trial_class, read_config_file
from det.configs.load import parse_experiment_config, parse_yaml
from det.configs.overrides import apply_overrides, make_test_config
from det.configs.task import TaskConfig, TaskKind, TaskResources, parse_task_config
from det.configs.templates import merge
from det.db import det_home
from det.errors import ConfigError, ContextError, NotFoundError, StateError
from det.queries.workspaces import placement, workspace_defaults
from det.reconciler.schedulers import Agent, Task
from det.reconciler.schedulers.fitting import never_fits
from det.sql import named

Q = named("submission")


def template_for_submission(conn: psycopg.Connection, name: str, workspace: str | None) -> dict:
    """Template ``name`` of ``workspace`` (None: Uncategorized), secrets included, to merge
    under a config submitted to that workspace: ``{"name", "config"}``, the shape
    :func:`expand_config_text` takes. Through ``det_user.template_expand``, which takes Editor on
    the workspace, as the submission does.

    Raises:
        NotFoundError: no such template there, or a workspace the caller may not view.
        PermissionDeniedError: the caller may view the workspace but not edit it.
    """
    config = conn.execute(Q.template_expand, (workspace, name)).fetchone()["c"]
    return {"name": name, "config": config}


def check_entrypoint(entrypoint: str | list[str], ctx: Path) -> None:
    """For a ``module:Class`` entrypoint, check the module file exists in the context and
    defines the class (read with ``ast``; nothing is imported).

    Raises:
        ConfigError: naming the missing file or class.
    """
    if not is_trial_class(entrypoint):
        return
    module, cls = entrypoint.split(":")
    rel = Path(*module.split("."))
    path = next((p for p in (ctx / f"{rel}.py", ctx / rel / "__init__.py") if p.is_file()), None)
    if path is None:
        raise ConfigError("entrypoint", f"{entrypoint}: no file {rel}.py in context {ctx}")
    tree = ast.parse(path.read_text(), filename=str(path))
    if not any(isinstance(n, ast.ClassDef) and n.name == cls for n in tree.body):
        raise ConfigError("entrypoint", f"{entrypoint}: {path.name} defines no class {cls}")


def expanded_config(config_file: Path, ctx: Path, template: dict | None = None,
                    overrides: list[str] | None = None, test: bool = False,
                    defaults: dict | None = None) -> tuple[dict, str]:
    """Read ``config_file`` and :func:`expand_config_text` it.

    Raises:
        ConfigError: unreadable or oversized file, or what expand_config_text raises.
    """
    return expand_config_text(read_config_file(config_file), str(config_file), ctx, template,
                              overrides, test, defaults)


def expand_config_text(text: str, source: str, ctx: Path, template: dict | None = None,
                       overrides: list[str] | None = None, test: bool = False,
                       defaults: dict | None = None) -> tuple[dict, str]:
    """Validate and expand the config ``text`` (read from ``source``), with ``overrides``
    (``--config KEY=VALUE``) applied and merged over ``template`` (a template row: ``name``,
    ``config``; det.configs.templates) if given; returns (expanded config, original text).
    With ``test``, the config is first validated as it is, then made ``--test``'s small
    experiment (``det.configs.overrides.make_test_config``); the original text is then
    the test config's YAML, as with overrides. ``defaults`` (a partial config: the target
    workspace's default pool and checkpoint storage,
    :func:`det.queries.workspaces.workspace_defaults`) is merged
    under everything. The CLI and ``POST /api/v1/experiments`` both submit through it.

    The default checkpoint storage is a shared_fs directory under det's home; a
    ``checkpoint_storage`` without ``type`` (GC settings only, as 0.38 allows) is merged over
    it. Determined keys det does not use are printed as warnings on stderr, one line each.

    Raises:
        ConfigError: invalid YAML or config (or merge), or an entrypoint the context lacks.
    """
    data = parse_yaml(text, source)
    if overrides:
        data = apply_overrides(data, overrides)
        text = yaml.safe_dump(data, sort_keys=False)
    if test:
        expanded_config_data(data, source, ctx, template, defaults)
        from det.harness.local import local_hparams

        data = make_test_config(data, local_hparams(data.get("hyperparameters") or {}))
        text = yaml.safe_dump(data, sort_keys=False)
    return expanded_config_data(data, source, ctx, template, defaults), text


def validated_config(data: object, source: str, template: dict | None = None,
                     defaults: dict | None = None,
                     warnings: list[str] | None = None) -> ExperimentConfig:
    """The experiment config ``data`` (parsed YAML read from ``source``) validated as every
    submission validates it, so that ``det preview-search`` accepts what ``det experiment
    create`` does: ``template``'s config merged under it, ``defaults`` under
    everything, and a ``checkpoint_storage`` without ``type`` (GC settings only, as 0.38
    allows) merged over det's default storage. Unused Determined keys are appended to
    ``warnings``, one line each.

    Raises:
        ConfigError: an invalid config, naming the field.
    """
    if template is not None and isinstance(data, dict):
        data = merge(data, template["config"])
        source = f"{source} with template {template['name']!r}"
    if defaults and isinstance(data, dict):
        data = merge(data, defaults)
    if isinstance(data, dict) and isinstance(data.get("checkpoint_storage"), dict) \
            and data["checkpoint_storage"].get("type") is None:
        data = {**data, "checkpoint_storage": merge(data["checkpoint_storage"],
                                                    _default_storage())}
    return parse_experiment_config(data, source, warnings)


def _default_storage() -> dict:
    """The checkpoint storage of a config that names none: a shared_fs directory under det's
    home."""
    return {"type": "shared_fs", "host_path": str(det_home() / "checkpoints")}


def expanded_config_data(data: object, source: str, ctx: Path, template: dict | None = None,
                         defaults: dict | None = None) -> dict:
    """``expanded_config`` of already parsed YAML ``data`` read from ``source``."""
    warnings: list[str] = []
    cfg = validated_config(data, source, template, defaults, warnings)
    for line in warnings:
        print(line, file=sys.stderr)
    check_entrypoint(cfg.entrypoint, ctx)
    expanded = cfg.expanded()
    if expanded.get("checkpoint_storage") is None:
        expanded["checkpoint_storage"] = {
            **_default_storage(), "storage_path": None, "save_experiment_best": 0,
            "save_trial_best": 1, "save_trial_latest": 1}
    return expanded


@contextmanager
def context_with(context_dir: Path, include: list[Path]) -> Iterator[Path]:
    """``context_dir``, or with ``include`` (files or directories) a temporary copy of it with
    each added at its top level (Determined's ``--include``).

    Raises ``ContextError`` for a missing include or one whose name the context already has.
    """
    if not include:
        yield context_dir
        return
    with tempfile.TemporaryDirectory(prefix="det-context-") as tmp:
        root = Path(tmp) / "context"
        shutil.copytree(context_dir, root, symlinks=True)
        _pin_outside_links(context_dir, root)
        for path in include:
            target = root / path.resolve().name
            if not path.exists():
                raise ContextError(f"--include {path}: no such file or directory")
            if target.exists():
                raise ContextError(f"--include {path}: the context already has "
                                   f"{target.name}")
            if path.is_dir():
                shutil.copytree(path, target, symlinks=True)
            else:
                shutil.copy2(path, target)
        yield root


def _pin_outside_links(context_dir: Path, copy: Path) -> None:
    """Point each relative link in ``copy`` (a copy of ``context_dir``) that leads out of
    ``context_dir`` at its target's absolute path: from the temporary copy the relative form
    would lead elsewhere, and packing follows links out of the context (:mod:`det.context`)."""
    real_root = os.path.realpath(context_dir)
    for dirpath, dirnames, filenames in os.walk(copy):
        for name in [*dirnames, *filenames]:
            link = Path(dirpath) / name
            original = context_dir / link.relative_to(copy)
            if not link.is_symlink() or os.path.isabs(os.readlink(link)):
                continue
            lexical = os.path.normpath(os.path.join(original.parent.relative_to(context_dir),
                                                    os.readlink(link)))
            resolved = os.path.realpath(original)
            if lexical == ".." or lexical.startswith("../") \
                    or os.path.commonpath([real_root, resolved]) != real_root:
                link.unlink()
                link.symlink_to(resolved)


def refuse_unfit(conn: psycopg.Connection, expanded: dict,
                 slots_key: str = "slots_per_trial") -> None:
    """Raise ConfigError if no agent now registered in the job's pools (any of them, when
    ``resources.resource_pool`` is a list) could ever run one trial (or task: ``slots_key``
    ``slots``). A pool with no agents yet is let through: agents may join it later."""
    resources = expanded.get("resources") or {}
    pools = resources.get("resource_pool") or "default"
    pools = [pools] if isinstance(pools, str) else pools
    slots = resources.get(slots_key, 1)
    reasons = []
    for pool in pools:
        agents = [Agent(r["id"], tuple(range(r["slots"])), ())
                  for r in conn.execute(Q.pool_capacity, {"pool": pool}).fetchall()]
        reason = never_fits(Task("trial", "experiment", slots), agents) if agents else None
        if reason is None:
            return
        reasons.append(f"pool {pool!r}: {reason}")
    raise ConfigError(f"resources.{slots_key}",
                      f"{slots} slots can never be scheduled: {'; '.join(reasons)} "
                      "(submit with --force to queue it anyway)")


# -- interactive tasks -------------------------------------------------------------------------

def task_pool(conn: psycopg.Connection, workspace: str | None, slots: int) -> str:
    """The pool a task that names none goes to (the seed, Resource Pools): a slot task to the
    workspace's default compute pool, else the cluster's; a zero-slot task to the workspace's
    default auxiliary pool, else the cluster's; ``default`` where no config names one."""
    row = conn.execute(Q.task_pool_defaults, {"workspace": workspace}).fetchone()
    if slots > 0:
        return row["default_compute_pool"] or row["cluster_compute"] or "default"
    return row["default_aux_pool"] or row["cluster_aux"] or "default"


def _task_template(config: dict) -> dict:
    """The part of an (experiment) template a task config has: its top-level keys that
    TaskConfig knows, ``resources`` cut to a task's (a template's ``slots_per_trial`` or
    ``searcher`` means nothing to a notebook)."""
    out = {k: v for k, v in config.items() if k in TaskConfig.model_fields}
    if isinstance(out.get("resources"), dict):
        out["resources"] = {k: v for k, v in out["resources"].items()
                            if k in TaskResources.model_fields}
    return out


def expand_task_config(conn: psycopg.Connection, kind: TaskKind, text: str | None, source: str,
                       overrides: Sequence[str] = (), template: dict | None = None,
                       workspace: str | None = None, entrypoint: list[str] | None = None
                       ) -> dict:
    """Validate and expand a task config: the YAML ``text`` (None: empty) read from
    ``source``, ``entrypoint`` (a command's argv) and ``overrides`` applied, ``template`` (a
    :func:`template_for_submission` row) merged under it, and its pool chosen by
    :func:`task_pool` when it names none. Returns the expanded config (TaskConfig.expanded).

    Raises:
        ConfigError: invalid YAML or config, naming the key.
    """
    data = parse_yaml(text, source) if text and text.strip() else {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("", "expected a mapping at the top level", source)
    if entrypoint:
        data = {**data, "entrypoint": list(entrypoint)}
    if overrides:
        data = apply_overrides(data, list(overrides))
    if template is not None:
        data = merge(data, _task_template(template["config"]))
        source = f"{source} with template {template['name']!r}"
    expanded = parse_task_config(data, kind, source).expanded(kind)
    if expanded["resources"]["resource_pool"] is None:
        expanded["resources"]["resource_pool"] = task_pool(conn, workspace,
                                                           expanded["resources"]["slots"])
    return expanded


def task_secrets() -> dict[str, str]:
    """A new task's secrets: a random Jupyter token (32 bytes) and an Ed25519 SSH key pair
    (OpenSSH formats), made here so that only det serve and the task's opener see them."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return {"jupyter_token": secrets.token_urlsafe(32), "ssh_private_key": private,
            "ssh_public_key": f"{public} det-task"}


def submit_task(conn: psycopg.Connection, kind: TaskKind, expanded: dict,
                context_dir: Path | None = None, workspace: str | None = None,
                project: str | None = None, experiment_ids: Sequence[int] = (),
                trial_ids: Sequence[int] = (), force: bool = False) -> int:
    """Store a task of ``kind`` with the ``expanded`` config (:func:`expand_task_config`) and
    ``context_dir`` packed (None: no context), in project ``project`` of ``workspace``
    (both None: Uncategorized), in one transaction; returns its job id. A TensorBoard shows
    ``experiment_ids`` and ``trial_ids``.

    Raises:
        ConfigError: slots no agent of the pool could ever hold (unless ``force``).
        ContextError: an unreadable or oversized context.
        NotFoundError / PermissionDeniedError: no Editor role in the target project's
            workspace, or a TensorBoard source the caller cannot view (from
            det_internal.create_task).
    """
    blob = context.pack(context_dir) if context_dir is not None else None
    with conn.transaction():
        if not force:
            refuse_unfit(conn, expanded, "slots")
        return conn.execute(
            Q.create_task, (kind, Jsonb(expanded), blob, workspace, project,
                            list(experiment_ids), list(trial_ids), Jsonb(task_secrets()))
        ).fetchone()["id"]


# -- experiments made from an existing one ------------------------------------------
# spec run-training-code.rst: "create an experiment from an existing experiment or trial".

def source_experiment(conn: psycopg.Connection, exp_id: int) -> dict:
    """Experiment ``exp_id`` as a source: its original config (YAML), packed context (None:
    none), workspace and project names.

    Raises:
        NotFoundError: no such experiment, or one the caller may not view.
    """
    row = conn.execute(Q.source_experiment, {"id": exp_id}).fetchone()
    if row is None:
        raise NotFoundError(f"experiment {exp_id} not found")
    return row


def source_trial(conn: psycopg.Connection, trial_id: int) -> dict:
    """Trial ``trial_id`` as a source: its experiment, hyperparameters and latest checkpoint.

    Raises:
        NotFoundError: no such trial, or one the caller may not view.
        StateError: the trial has no checkpoint to continue from.
    """
    row = conn.execute(Q.source_trial, {"id": trial_id}).fetchone()
    if row is None:
        raise NotFoundError(f"trial {trial_id} not found")
    if row["latest_checkpoint"] is None:
        raise StateError(f"trial {trial_id}: no checkpoint to continue from")
    return row


def continue_config(data: object, hparams: dict, checkpoint: str, source: str) -> dict:
    """The config of ``det trial continue``'s experiment made of config ``data`` (read from
    ``source``): one trial (searcher ``single``, keeping the searcher's metric, direction and
    max_length) with the continued trial's ``hparams`` as constants, starting from its latest
    ``checkpoint`` (``searcher.source_checkpoint_uuid``, which pins it). Applied to whatever
    config is given (the source's or the user's), so the result always continues that trial.

    Raises:
        ConfigError: ``data`` is not a mapping.
    """
    if not isinstance(data, dict):
        raise ConfigError("", "expected a mapping at the top level", source)
    searcher = data.get("searcher") if isinstance(data.get("searcher"), dict) else {}
    kept = {k: searcher[k] for k in ("metric", "smaller_is_better", "max_length") if k in searcher}
    return {**data,
            "hyperparameters": {k: {"type": "const", "val": v} for k, v in hparams.items()},
            "searcher": {"name": "single", **kept, "source_checkpoint_uuid": checkpoint}}


def continue_config_text(conn: psycopg.Connection, trial_id: int) -> str:
    """The YAML ``det trial continue TRIAL`` submits without ``--config-file``: the trial's
    experiment's original config made :func:`continue_config` (what the WebUI's dialog shows
    to edit).

    Raises:
        NotFoundError, StateError: see :func:`source_trial`.
    """
    trial = source_trial(conn, trial_id)
    src = source_experiment(conn, trial["experiment_id"])
    data = continue_config(parse_yaml(src["original_config"], f"experiment {src['id']}"),
                           trial["hparams"], trial["latest_checkpoint"],
                           f"experiment {src['id']}")
    return yaml.safe_dump(data, sort_keys=False)


@contextmanager
def unpacked(blob: bytes | None) -> Iterator[Path]:
    """A temporary directory holding the packed context ``blob`` (empty for None)."""
    with tempfile.TemporaryDirectory(prefix="det-source-ctx-") as tmp:
        if blob is not None:
            context.unpack(blob, Path(tmp) / "context")
        else:
            (Path(tmp) / "context").mkdir()
        yield Path(tmp) / "context"


def _from_source(conn: psycopg.Connection, function: str, source_id: int, src: dict, text: str,
                 source: str, overrides: Sequence[str], workspace: str | None,
                 project: str | None, project_id: int | None, force: bool) -> int:
    """Expand ``text`` against ``src``'s context and store it with SQL ``function``
    (det_user.experiment_fork or det_user.trial_continue of ``source_id``) in one transaction.
    The new experiment goes where the options or the config's keys say (:func:`placement`),
    else to the source's project; that workspace's defaults apply."""
    workspace, project = placement(conn, text, source, workspace, project, project_id)
    if workspace is None:
        workspace, project = src["workspace"], src["project"]
    defaults = workspace_defaults(conn, workspace)
    with unpacked(src["context"]) as ctx:
        expanded, original = expand_config_text(text, source, ctx, None, list(overrides),
                                                defaults=defaults)
    with conn.transaction():
        if not force:
            refuse_unfit(conn, expanded)
        return conn.execute(f"SELECT {function}(%s, %s, %s, %s, %s) AS id",
                            (source_id, Jsonb(expanded), original, workspace, project)
                            ).fetchone()["id"]


def fork_experiment(conn: psycopg.Connection, exp_id: int, text: str | None = None,
                    source: str = "config", overrides: Sequence[str] = (),
                    workspace: str | None = None, project: str | None = None,
                    project_id: int | None = None, force: bool = False) -> int:
    """``det experiment fork``: a new experiment with experiment ``exp_id``'s model definition
    and the config ``text`` (read from ``source``; None: ``exp_id``'s original config), with
    ``overrides`` applied; checked, expanded and refused as ``det experiment create`` does.
    Returns the new experiment's id.

    Raises:
        NotFoundError: an experiment the caller cannot view.
        ConfigError: an invalid config, naming the key.
        PermissionDeniedError: no Editor role where it goes (det_user.create_experiment).
    """
    src = source_experiment(conn, exp_id)
    text = src["original_config"] if text is None else text
    return _from_source(conn, "det_user.experiment_fork", exp_id, src, text, source, overrides,
                        workspace, project, project_id, force)


def continue_trial(conn: psycopg.Connection, trial_id: int, text: str | None = None,
                   source: str = "config", overrides: Sequence[str] = (),
                   workspace: str | None = None, project: str | None = None,
                   project_id: int | None = None, force: bool = False) -> int:
    """``det trial continue``: a new experiment of one trial that resumes trial ``trial_id``
    from its latest checkpoint (weights and batch count; det_user.trial_continue), with the model
    definition of its experiment and the config ``text`` (read from ``source``; None: that
    experiment's original config) made :func:`continue_config`, then ``overrides`` applied
    (``searcher.max_length.batches=400`` trains it further). Returns the new experiment's id.

    Raises:
        NotFoundError, StateError: see :func:`source_trial`.
        ConfigError: an invalid config, naming the key (from det_user.trial_continue too: a
            checkpoint storage other than the checkpoint's).
    """
    trial = source_trial(conn, trial_id)
    src = source_experiment(conn, trial["experiment_id"])
    text = src["original_config"] if text is None else text
    data = continue_config(parse_yaml(text, source), trial["hparams"],
                           trial["latest_checkpoint"], source)
    return _from_source(conn, "det_user.trial_continue", trial_id, src,
                        yaml.safe_dump(data, sort_keys=False), source, overrides, workspace,
                        project, project_id, force)
