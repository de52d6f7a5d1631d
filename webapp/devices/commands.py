"""Commands from the server to an agent: each connected agent's control WebSocket joins the
Channels group ``device-<uid>``, and one function sends a command there after the transaction
commits (docs/architecture.md, "Agent control protocol").

Commands are the typed ones of :mod:`orchestrator.protocol` (``COMMANDS``, the registry the
agent dispatches on too): ``{"type": "command", "id": ..., "command": NAME, ...}`` on the
wire; the agent answers each with an ``ack`` naming its id.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from orchestrator.protocol import COMMANDS, Command, ProtocolError, new_command_id


def device_group(uid: str) -> str:
    return f"device-{uid}"


def command_build(name: str, **fields: Any) -> Command:
    """The command ``name`` with these fields in their JSON form (a StageSpec's ``to_json``,
    say) and a fresh id, checked as the agent will read it: ValueError (a ProtocolError
    naming the field) for an unknown command or a bad field."""
    if name not in COMMANDS:
        raise ProtocolError(f"unknown command {name!r}; known: {', '.join(COMMANDS)}",
                            field="command")
    return COMMANDS[name].from_json(
        {"type": Command.TYPE, "id": new_command_id(), "command": name, **fields})


def _group_send(uid: str, command: dict[str, Any]) -> None:
    async_to_sync(get_channel_layer().group_send)(
        device_group(uid), {"type": "agent.command", "command": command})


def device_command_send(*, uid: str, command: Command) -> None:
    """Send ``command`` to the agent of device ``uid`` once the current transaction commits."""
    transaction.on_commit(partial(_group_send, uid, command.to_json()))
