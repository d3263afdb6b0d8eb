"""``det cluster config apply | show`` and ``det resource-pool list | describe``."""

from pathlib import Path

import typer
import yaml
from psycopg.types.json import Jsonb

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.configs import read_config_file
from det.configs.cluster import ClusterConfig, load_cluster_config
from det.errors import DetError
from det.queries.cluster import pool_bindings
from det.sql import named

Q = named("cli")
READ = named("queries")

config_app = typer.Typer(no_args_is_help=True)
pool_app = typer.Typer(no_args_is_help=True)

@config_app.command("apply")
def apply(config_file: Path = typer.Argument(..., help="Cluster config (YAML).")) -> None:
    """Validate a cluster config and apply it (one transaction): schedulers and pools."""
    text = read_config_file(config_file)
    cfg = load_cluster_config(text, str(config_file))
    with db() as conn:
        conn.execute(Q.apply_cluster_config, (Jsonb(cfg.model_dump(mode="json")), text))
    typer.echo(f"Applied cluster config with {len(cfg.resource_pools)} resource pool(s)")


@config_app.command("show")
def show(
    effective: bool = typer.Option(False, "--effective",
                                   help="Show the scheduler each pool really uses."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The applied cluster config (the default one if none was applied)."""
    with db() as conn:
        row = conn.execute(READ.stored_cluster_config).fetchone()
    cfg = ClusterConfig.model_validate(row["config"]) if row else ClusterConfig()
    data = cfg.model_dump(mode="json")
    if effective:
        data = {p.name: cfg.effective_scheduler(p.name).model_dump(mode="json")
                for p in cfg.resource_pools}
    if json_:
        print_json(data)
    elif not effective and row:
        typer.echo(row["original"].rstrip())
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


@pool_app.command("list")
def list_pools(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Pools with their schedulers, agents, slots used / total and queued jobs."""
    with db() as conn:
        rows = conn.execute(READ.pools).fetchall()
    if json_:
        print_json(rows)
        return
    for r in rows:
        s = r["scheduler"]
        r["scheduler"] = s["type"] + (" (preemption)" if s.get("preemption") else "")
        r["slots"] = f"{r['slots_used']}/{r['slots_total']}"
        r["provider"] = _provider(r)
    print_table(rows, ["name", "description", "scheduler", "agents", "slots", "queued_jobs",
                       "max_aux_containers_per_agent", "provider", "provider_status"],
                ["Pool", "Description", "Scheduler", "Agents", "Slots used/total",
                 "Queued jobs", "Aux containers/agent", "Provider", "Provisioner"])


def _provider(row: dict) -> str:
    """``local 1/2``: an elastic pool's provider type, live instances / max_instances."""
    p = row["provider"]
    return f"{p['type']} {row['instances']}/{p['max_instances']}" if p else ""


@pool_app.command("describe")
def describe(
    pool_name: str = typer.Argument(..., help="The pool."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
    limit: int = typer.Option(20, help="At most this many instances (the live ones first).",
                              min=1),
) -> None:
    """A pool, and for an elastic pool its provider, why the provisioner waits or refuses, and
    its instances (state, agent, why each was terminated)."""
    with db() as conn:
        pool = next((r for r in conn.execute(READ.pools).fetchall() if r["name"] == pool_name),
                    None)
        if pool is None:
            raise DetError(f"resource pool {pool_name!r} not found")
        instances = conn.execute(READ.pool_instances,
                                 {"pool": pool_name, "limit": limit}).fetchall()
    if json_:
        print_json({**pool, "instance_list": instances})
        return
    typer.echo(f"Pool:        {pool['name']}")
    typer.echo(f"Agents:      {pool['agents']} (slots used/total "
               f"{pool['slots_used']}/{pool['slots_total']})")
    if not pool["provider"]:
        typer.echo("Provider:    none (static agents)")
        return
    typer.echo(f"Provider:    {yaml.safe_dump(pool['provider'], default_flow_style=True).strip()}")
    typer.echo(f"Provisioner: {pool['provider_status'] or 'nothing to do'}")
    typer.echo("")
    print_table(instances, ["id", "agent_id", "state", "provider_id", "provider_state", "reason",
                            "requested_at", "gone_at"],
                ["Instance", "Agent", "State", "Provider id", "Provider says", "Reason",
                 "Requested", "Gone"])


bindings_app = typer.Typer(no_args_is_help=True)
pool_app.add_typer(bindings_app, name="bindings",
                   help="Bind pools to workspaces: a bound pool serves only those workspaces.")

def _bind(pool_name: str, workspace_names: list[str], bound: bool) -> None:
    with db() as conn, conn.transaction():
        for w in workspace_names:
            conn.execute(Q.workspace_bind_pool, (w, pool_name, bound))
    typer.echo(f"{'Bound' if bound else 'Unbound'} pool {pool_name} "
               f"{'to' if bound else 'from'} {', '.join(workspace_names)}")


@bindings_app.command("add")
def bindings_add(
    pool_name: str = typer.Argument(..., help="The pool."),
    workspace_names: list[str] = typer.Argument(..., help="Workspaces to bind it to."),
) -> None:
    """Bind a pool to workspaces (ClusterAdmin); all or none."""
    _bind(pool_name, workspace_names, True)


@bindings_app.command("remove")
def bindings_remove(
    pool_name: str = typer.Argument(..., help="The pool."),
    workspace_names: list[str] = typer.Argument(..., help="Workspaces to unbind it from."),
) -> None:
    """Unbind a pool from workspaces (ClusterAdmin); a pool bound to none serves all."""
    _bind(pool_name, workspace_names, False)


@bindings_app.command("list-workspaces")
def bindings_list(
    pool_name: str = typer.Argument(None, help="The pool (default: every pool)."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The workspaces each pool is bound to (that you may view)."""
    with db() as conn:
        rows = pool_bindings(conn, pool_name)
    if json_:
        print_json(rows)
        return
    print_table(rows, ["resource_pool", "workspace"])
