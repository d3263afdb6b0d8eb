"""The ``det`` command. Each command is one SQL-function call or query (docs/architecture.md).

Errors a user caused print as one line and exit 1; ``det --debug ...`` shows the traceback.
"""

import logging
import sys

import psycopg
import typer

from det.cli import (
    agents,
    audit,
    checkpoints,
    cluster,
    experiments,
    image,
    models,
    pools,
    preview,
    queue,
    rbac,
    serve,
    simulate,
    templates,
    trials,
    users,
    workspaces,
)
from det.db.sqlstate import translate
from det.errors import DetError

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="det: deep-learning training on a PostgreSQL control plane.")
app.add_typer(experiments.app, name="experiment", help="Create, follow and steer experiments.")
app.add_typer(experiments.app, name="e", hidden=True)
app.add_typer(experiments.app, name="exp", hidden=True)
app.add_typer(trials.app, name="trial", help="Trials: logs and details.")
app.add_typer(trials.app, name="t", hidden=True)
app.add_typer(checkpoints.app, name="checkpoint", help="List and download checkpoints.")
app.add_typer(models.app, name="model", help="The model registry: models and their versions.")
app.add_typer(templates.app, name="template", help="Configuration templates.")
app.add_typer(users.app, name="user", help="Users: create, list, deactivate, passwords.")
app.add_typer(users.group_app, name="user-group", help="Groups of users.")
app.add_typer(workspaces.app, name="workspace", help="Workspaces: projects, pools, members.")
app.add_typer(workspaces.project_app, name="project", help="Projects of a workspace.")
app.add_typer(rbac.app, name="rbac", help="Roles: list, assign, unassign, your permissions.")
app.add_typer(audit.app, name="audit", help="The audit log (ClusterAdmin).")
app.add_typer(templates.app, name="tpl", hidden=True)
app.add_typer(cluster.cluster_app, name="cluster", help="Run a local cluster.")
cluster.cluster_app.add_typer(pools.config_app, name="config",
                              help="The cluster config: schedulers and resource pools.")
app.add_typer(pools.pool_app, name="resource-pool", help="Resource pools.")
app.add_typer(queue.app, name="job", help="The job queue: order, priorities, why a job waits.")
app.add_typer(cluster.db_app, name="db", help="Database schema.")
app.add_typer(image.app, name="image", help="Build the default task image.")
app.add_typer(cluster.agent_app, name="agent", help="Run, list and drain agents.")
cluster.agent_app.command("list")(agents.list_agents)
cluster.agent_app.command("enable")(agents.enable)
cluster.agent_app.command("disable")(agents.disable)
app.add_typer(agents.slot_app, name="slot", help="List and drain slots.")
app.command("reconcile")(cluster.reconcile)
queue.app.command("simulate")(simulate.simulate)
app.command("preview-search")(preview.preview_search)
app.command("serve")(serve.serve)

_debug = False


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show tracebacks.")) -> None:
    global _debug
    _debug = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("psycopg").setLevel(logging.WARNING)


def main() -> None:
    """Console-script entry point."""
    try:
        code = app(standalone_mode=False)
    except (DetError, psycopg.Error) as e:
        if _debug:
            raise
        error = translate(e) if isinstance(e, psycopg.Error) else e
        typer.echo(f"Error: {error}", err=True)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("Aborted.", err=True)
        sys.exit(130)
    except Exception as e:
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
