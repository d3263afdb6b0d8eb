"""``det agent list | enable | disable`` and ``det slot list | enable | disable``.

Disabling drains (spec: system-architecture, Agent): work already running finishes, the
scheduler places nothing new there; ``--drain`` also stops the running work as a planned stop
(it checkpoints and resumes elsewhere, not a failure). All go through SQL functions
(migrations 2 and 31).
"""

import typer

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.sql import named

Q = named("cli")
READ = named("queries")

slot_app = typer.Typer(no_args_is_help=True)



def list_agents(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Agents: pool, state, runtime, slots and how many are in use."""
    with db() as conn:
        rows = conn.execute(READ.agents).fetchall()
    if json_:
        print_json(rows)
        return
    print_table(rows, ["id", "hostname", "resource_pool", "state", "runtime", "slots", "used",
                       "last_heartbeat"],
                ["Agent", "Host", "Pool", "State", "Runtime", "Slots", "Used", "Heartbeat"])


def _set_agent(agent_id: str, enabled: bool) -> None:
    with db() as conn:
        state = conn.execute(Q.agent_set_enabled, (agent_id, enabled)).fetchone()["s"]
    typer.echo(f"Agent {agent_id}: {state}")


def enable(agent_id: str = typer.Argument(..., metavar="AGENT_ID")) -> None:
    """Let the scheduler place work on this agent again."""
    _set_agent(agent_id, True)


def disable(agent_id: str = typer.Argument(..., metavar="AGENT_ID"),
            drain: bool = typer.Option(False, "--drain",
                                       help="Also stop its running trials now: each "
                                            "checkpoints (as on pause) and resumes on another "
                                            "agent; not counted as a failure.")) -> None:
    """Disable this agent: nothing new lands; running work finishes (with --drain: stops
    at its next checkpoint)."""
    if not drain:
        _set_agent(agent_id, False)
        return
    with db() as conn:
        n = conn.execute(Q.agent_drain, (agent_id,)).fetchone()["n"]
    typer.echo(f"Agent {agent_id}: DISABLED; {n} run(s) asked to checkpoint and stop")


@slot_app.command("list")
def list_slots(
    agent_id: str = typer.Option(None, "--agent", help="Only this agent's slots."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Slots: device (name, uuid, memory in MiB), enabled, and the allocation and trial
    holding each."""
    with db() as conn:
        rows = conn.execute(READ.slots, {"agent": agent_id}).fetchall()
    if json_:
        print_json(rows)
        return
    print_table(rows, ["agent_id", "slot_id", "type", "device_name", "device_uuid", "memory_mb",
                       "enabled", "resource_pool", "allocation_id", "trial_id"],
                ["Agent", "Slot", "Type", "Device", "UUID", "Memory (MiB)", "Enabled", "Pool",
                 "Allocation", "Trial"])


def _set_slot(agent_id: str, slot_id: int, enabled: bool) -> None:
    with db() as conn:
        conn.execute(Q.slot_set_enabled, (agent_id, slot_id, enabled))
    typer.echo(f"Agent {agent_id} slot {slot_id}: {'enabled' if enabled else 'disabled'}")


@slot_app.command("enable")
def enable_slot(agent_id: str = typer.Argument(..., metavar="AGENT_ID"),
                slot_id: int = typer.Argument(..., metavar="SLOT")) -> None:
    """Let the scheduler use this slot again."""
    _set_slot(agent_id, slot_id, True)


@slot_app.command("disable")
def disable_slot(agent_id: str = typer.Argument(..., metavar="AGENT_ID"),
                 slot_id: int = typer.Argument(..., metavar="SLOT")) -> None:
    """Drain one slot: work holding it runs on, nothing new lands on it."""
    _set_slot(agent_id, slot_id, False)
