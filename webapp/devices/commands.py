"""Commands from the server to an agent: each connected agent's control WebSocket joins the
Channels group ``device-<uid>``, and one function sends a command there after the transaction
commits (docs/architecture.md, "Agent control protocol").

Commands are the typed ones of :mod:`orchestrator.protocol` (``COMMANDS``, the registry the
agent dispatches on too): ``{"type": "command", "id": ..., "command": NAME, ...}`` on the
wire; the agent answers each with an ``ack`` naming its id.

On the embedded setup the channel layer is in memory, one per process: a command sent from
the Celery worker (a probe's verdict halting a run's stages, say) reached nobody, and the run
waited for ever. The worker stores its commands instead (:class:`PendingCommand`,
:func:`commands_through_outbox`), and the web process's connection of the device sends them
on within ``COMMANDS_OUTBOX_POLL_S`` (webapp.gateway.consumers).
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from orchestrator.protocol import COMMANDS, Command, ProtocolError, new_command_id
from webapp.devices.models import PendingCommand

# a stored command older than this is dropped unsent, as one sent to a group nobody is in: its
# device was not connected to take it
OUTBOX_MAX_AGE_S = 30.0
_through_outbox = False  # this process stores its commands (commands_through_outbox)


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


def commands_through_outbox() -> None:
    """This process's channel layer does not reach the agents' connections (a Celery worker
    on the embedded setup): store its commands for the web process to send."""
    global _through_outbox
    _through_outbox = True


def _group_send(uid: str, command: dict[str, Any]) -> None:
    if _through_outbox:
        PendingCommand.objects.create(device=uid, command=command)
        return
    async_to_sync(get_channel_layer().group_send)(
        device_group(uid), {"type": "agent.command", "command": command})


def pending_commands_take(*, uid: str) -> list[dict[str, Any]]:
    """The commands stored for device ``uid``, oldest first, removed; those older than
    OUTBOX_MAX_AGE_S are removed unsent."""
    with transaction.atomic():
        rows = list(PendingCommand.objects.select_for_update().filter(device=uid))
        if not rows:
            return []
        PendingCommand.objects.filter(pk__in=[r.pk for r in rows]).delete()
    cutoff = timezone.now() - timedelta(seconds=OUTBOX_MAX_AGE_S)
    return [r.command for r in rows if r.created_at >= cutoff]


def device_command_send(*, uid: str, command: Command) -> None:
    """Send ``command`` to the agent of device ``uid`` once the current transaction commits."""
    transaction.on_commit(partial(_group_send, uid, command.to_json()))
