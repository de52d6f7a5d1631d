"""Commands from the server to an agent: each connected agent's control WebSocket joins the
Channels group ``device-<uid>``, and one function sends a command there after the transaction
commits (docs/architecture.md, "Agent control protocol").

Commands are ``{"type": "command", "id": ..., "command": NAME, ...}``; the agent answers each
with ``{"type": "ack", "id": ..., "ok": ..., "error": ...}``.
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

COMMANDS = ("profile", "deploy", "start", "pause", "resume", "stop", "measure", "halt", "probe",
            "emulate", "exit")

Command = dict[str, Any]


def device_group(uid: str) -> str:
    return f"device-{uid}"


def command_build(name: str, **fields: Any) -> Command:
    """A command with a fresh id (the agent's ack names it)."""
    if name not in COMMANDS:
        raise ValueError(f"unknown command {name!r}; known: {', '.join(COMMANDS)}")
    return {"type": "command", "id": uuid.uuid4().hex[:12], "command": name, **fields}


def _group_send(uid: str, command: Command) -> None:
    async_to_sync(get_channel_layer().group_send)(
        device_group(uid), {"type": "agent.command", "command": command})


def device_command_send(*, uid: str, command: Command) -> None:
    """Send ``command`` to the agent of device ``uid`` once the current transaction commits."""
    transaction.on_commit(partial(_group_send, uid, command))
