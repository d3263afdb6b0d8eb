"""The ``det`` command. Each command is one SQL-function call or query (docs/architecture.md).

Errors a user caused print as one line and exit 1; ``det --debug ...`` shows the traceback.
"""

import importlib
import logging
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

import typer

from det.cli.lazy import Lazy, group
from det.errors import DetError


def _cli(module: str, attr: str) -> Callable[[], Any]:
    """A loader of ``det.cli.<module>.<attr>``."""
    return lambda: getattr(importlib.import_module(f"det.cli.{module}"), attr)


@cache
def _users() -> typer.Typer:
    from det.cli import login, users
    login.register(users.app)
    return users.app


@cache
def _cluster() -> typer.Typer:
    from det.cli import cluster, pools, usage
    cluster.cluster_app.add_typer(pools.config_app, name="config",
                                  help="The cluster config: schedulers and resource pools.")
    cluster.cluster_app.command("usage")(usage.cluster_usage)
    return cluster.cluster_app


@cache
def _jobs() -> typer.Typer:
    from det.cli import queue, simulate
    queue.app.command("simulate")(simulate.simulate)
    queue.app.command("u", hidden=True)(queue.update)  # Determined's alias
    return queue.app


@cache
def _agents() -> typer.Typer:
    from det.cli import agent_identity, agents, cluster
    cluster.agent_app.command("list")(agents.list_agents)
    cluster.agent_app.command("enable")(agents.enable)
    cluster.agent_app.command("disable")(agents.disable)
    cluster.agent_app.add_typer(agent_identity.token_app, name="token",
                                help="One-time enrollment tokens of new agents.")
    cluster.agent_app.command("enroll")(agent_identity.enroll)
    cluster.agent_app.command("revoke")(agent_identity.revoke)
    return cluster.agent_app


@cache
def _experiments() -> typer.Typer:
    from det.cli import experiments, upstream
    experiments.app.command("list-checkpoints")(upstream.list_checkpoints)
    experiments.app.command("lc", hidden=True)(upstream.list_checkpoints)
    experiments.app.command("download")(upstream.experiment_download)
    return experiments.app


@cache
def _trials() -> typer.Typer:
    from det.cli import trials, upstream
    trials.app.command("download")(upstream.trial_download)
    return trials.app


@cache
def _checkpoints() -> typer.Typer:
    from det.cli import checkpoints, upstream
    checkpoints.app.command("describe")(upstream.checkpoint_describe)
    return checkpoints.app


@cache
def _deploy() -> typer.Typer:
    from det.cli import upstream
    return upstream.deploy_app()


@cache
def _templates() -> typer.Typer:
    from det.cli import templates
    templates.app.command("rm", hidden=True)(templates.remove)  # Determined's alias
    return templates.app


def _alias(name: str, help: str) -> Lazy:
    """Determined's short name of command ``name`` (``det m`` for ``det model``): hidden."""
    return Lazy(lambda: COMMANDS[name].load(), help, hidden=True)


_EXPERIMENTS = "Create, follow and steer experiments."
_TRIALS = "Trials: logs and details."
_TEMPLATES = "Configuration templates."
_COMMANDS = "Commands run on the cluster, their output streamed."

COMMANDS = {
    "reconcile": Lazy(_cli("cluster", "reconcile"),
                      "Run the reconciler (one leader; others wait as standbys)."),
    "preview-search": Lazy(_cli("preview", "preview_search"),
                           "Show the trials a search will create and the training it will run."),
    "serve": Lazy(_cli("serve", "serve"),
                  "Serve the REST API (/api/v1, docs at /api/v1/docs) and the WebUI (/)."),
    "experiment": Lazy(_experiments, _EXPERIMENTS),
    "e": Lazy(_experiments, _EXPERIMENTS, hidden=True),
    "exp": Lazy(_experiments, _EXPERIMENTS, hidden=True),
    "trial": Lazy(_trials, _TRIALS),
    "t": Lazy(_trials, _TRIALS, hidden=True),
    "checkpoint": Lazy(_checkpoints, "List, describe and download checkpoints."),
    "command": Lazy(_cli("commands", "app"), _COMMANDS),
    "cmd": Lazy(_cli("commands", "app"), _COMMANDS, hidden=True),
    "notebook": Lazy(_cli("notebooks", "notebook_app"), "JupyterLab notebooks on the cluster."),
    "shell": Lazy(_cli("shells", "app"), "Shells on the cluster, opened with ssh."),
    "tensorboard": Lazy(_cli("notebooks", "tensorboard_app"),
                        "TensorBoards over experiments' and trials' metrics."),
    "task": Lazy(_cli("tasks", "app"), "Interactive tasks of every kind: list, logs."),
    "model": Lazy(_cli("models", "app"), "The model registry: models and their versions."),
    "template": Lazy(_templates, _TEMPLATES),
    "user": Lazy(_users, "Users: create, list, deactivate, passwords, log in and out, who "
                        "you are."),
    "user-group": Lazy(_cli("users", "group_app"), "Groups of users."),
    "workspace": Lazy(_cli("workspaces", "app"), "Workspaces: projects, pools, members."),
    "project": Lazy(_cli("workspaces", "project_app"), "Projects of a workspace."),
    "rbac": Lazy(_cli("rbac", "app"), "Roles: list, assign, unassign, your permissions."),
    "audit": Lazy(_cli("audit", "app"), "The audit log (ClusterAdmin)."),
    "tpl": Lazy(_templates, _TEMPLATES, hidden=True),
    "cluster": Lazy(_cluster, "Run a local cluster; its historical usage."),
    "resource-pool": Lazy(_cli("pools", "pool_app"), "Resource pools."),
    "job": Lazy(_jobs, "The job queue: order, priorities, why a job waits."),
    "db": Lazy(_cli("cluster", "db_app"), "Database schema."),
    "image": Lazy(_cli("image", "app"), "Build the default task image."),
    "agent": Lazy(_agents, "Run, list and drain agents."),
    "slot": Lazy(_cli("agents", "slot_app"), "List and drain slots."),
    "version": Lazy(_cli("upstream", "version"), "The CLI's version and its database's."),
    "master": Lazy(_cli("upstream", "master_app"),
                   "det's \"master\": its database (and det serve's URL)."),
    "deploy": Lazy(_deploy,
                   "det deploy local cluster-up|cluster-down: det cluster up|down."),
}
# Determined 0.38's short names (its `det --help`), hidden as det's own aliases are
COMMANDS |= {alias: _alias(name, COMMANDS[name].help) for alias, name in [
    ("c", "checkpoint"), ("m", "model"), ("u", "user"), ("a", "agent"), ("s", "slot"),
    ("j", "job"), ("rp", "resource-pool"), ("w", "workspace"), ("p", "project"),
    ("nb", "notebook")]}
"""det's commands, in the order of its help, each with its line there; each module is imported
when its command runs (:mod:`det.cli.lazy`)."""

app = typer.Typer(cls=group(COMMANDS), no_args_is_help=True, add_completion=False,
                  help="det: deep-learning training on a PostgreSQL control plane.")

_debug = False


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"det {version('det')}")
        raise typer.Exit()


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
             _version: bool = typer.Option(False, "--version", "-v", callback=_print_version,
                                           is_eager=True, help="Print det's version."),
             master: str = typer.Option(
                 None, "--master", "-m", metavar="URL",
                 help="det's database, postgresql://... (default: DET_MASTER if that is "
                      "one, else DET_DB_URL, else det cluster up's).")) -> None:
    global _debug
    _debug = debug
    from det.cli.master import apply_master

    apply_master(master)
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("psycopg").setLevel(logging.WARNING)


def _user_error(e: BaseException) -> DetError | None:
    """``e`` as the one-line error a user sees, or None when it is not one: a DetError, or a
    psycopg error translated (det.db.sqlstate). psycopg is not imported for this: a command
    that raised one has imported it (``det --help`` never does, 0.3 s saved)."""
    if isinstance(e, DetError):
        return e
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(e, psycopg.Error):
        from det.db.sqlstate import translate

        return translate(e)
    return None


def main() -> None:
    """Console-script entry point."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("Aborted.", err=True)
        sys.exit(130)
    except Exception as e:
        if (error := _user_error(e)) is not None:
            if _debug:
                raise
            typer.echo(f"Error: {error}", err=True)
            sys.exit(1)
        # Usage errors of the click that typer vendors: they print themselves with the usage
        # line. Anything else is a bug and keeps its traceback.
        if not hasattr(e, "show"):
            raise
        e.show()
        sys.exit(getattr(e, "exit_code", 2))
    # In non-standalone mode click returns a command's exit code instead of exiting.
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
