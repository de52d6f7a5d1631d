"""The server's commands, one class each, named in one registry, :data:`COMMANDS`, that the
server builds from and the agent dispatches on (:func:`parse_command`)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from orchestrator.protocol.fields import (
    MAX_LAYER,
    MAX_PIPELINES,
    ProtocolError,
    fail,
    flag,
    integer,
    items,
    number,
    text,
)
from orchestrator.protocol.records import KEYS, PEERS, Message, R, RestorePart, wire
from orchestrator.protocol.stagespec import StageSpec


def _stage_spec(raw: Any, name: str) -> StageSpec:
    try:
        return StageSpec.from_json(raw)
    except ProtocolError as exc:
        where = name if exc.field is None else f"{name}.{exc.field}"
        raise ProtocolError(f"{name}.{exc}", field=where, reason=exc.reason) from None


def keys_for_peers(peers: Mapping[str, str], keys: Mapping[str, str]) -> None:
    """Every peer comes with its data plane's CURVE public key (an agent refuses to send to
    a peer it cannot authenticate, and to receive from one it was not told of)."""
    missing = sorted(set(peers) - set(keys))
    if missing:
        raise fail(f"keys.{missing[0]}", "is missing: every peer needs its public key")


def new_command_id() -> str:
    return secrets.token_hex(6)


@dataclass(frozen=True, kw_only=True)
class Command(Message):
    """``{"type": "command", "id", "command": NAME, ...}``; the agent answers each with an
    :class:`Ack` naming its id."""

    TYPE = "command"
    NAME: ClassVar[str]
    id: str = wire(text(maximum=64), factory=new_command_id)

    def to_json(self) -> dict[str, Any]:
        rest = self._json_fields()
        return {"type": self.TYPE, "id": rest.pop("id"), "command": self.NAME, **rest}

    @classmethod
    def from_json(cls: type[R], raw: Any) -> R:
        name = cast(Any, cls).NAME
        command = cls._parse(raw, what=f"the {name} command", extra=("type", "command", "id"))
        if raw["type"] != "command":
            raise fail("type", "must be 'command'", raw["type"])
        if raw["command"] != name:
            raise fail("command", f"must be {name!r}", raw["command"])
        return command


@dataclass(frozen=True, kw_only=True)
class ProfileCommand(Command):
    """Profile a zoo model layer by layer (progress messages, then the profile)."""

    NAME = "profile"
    model: str = wire(text())
    dataset: str = wire(text(maximum=4096), "digits")
    batch_size: int = wire(integer(minimum=1, maximum=2**20), 32)


@dataclass(frozen=True, kw_only=True)
class DeployCommand(Command):
    """Build this device's stage of a run and connect to its neighbours; after a recovery,
    load the weights ``restore`` lists."""

    NAME = "deploy"
    run: int = wire(integer())
    spec: StageSpec = wire(_stage_spec)  # noqa: RUF009 (a dataclasses.field)
    peers: Mapping[str, str] = wire(PEERS, factory=dict)
    keys: Mapping[str, str] = wire(KEYS, factory=dict)  # each peer's CURVE public key
    started_at: float | None = wire(number(), None)
    restore: tuple[RestorePart, ...] | None = wire(
        items(RestorePart.reader(), maximum=MAX_LAYER), None)

    def check(self) -> None:
        if self.spec.run != self.run:
            raise fail("spec.run", f"is not the command's run {self.run}", self.spec.run)
        keys_for_peers(self.peers, self.keys)


@dataclass(frozen=True, kw_only=True)
class StartCommand(Command):
    """Run the deployed stage from the common start time (``begin_at``, else ``started_at``);
    ``started_at`` is when the run's clock read 0 (earlier than ``begin_at`` after a recovery
    or for a run started again, whose clock goes on); ``paused``: wait for ``resume``."""

    NAME = "start"
    run: int = wire(integer())
    started_at: float = wire(number())
    generation: int | None = wire(integer(), None)
    begin_at: float | None = wire(number(), None)
    paused: bool | None = wire(flag(), None)


@dataclass(frozen=True, kw_only=True)
class RunCommand(Command):
    """A command about the run's stage held here (of ``generation``, when given)."""

    run: int = wire(integer())
    generation: int | None = wire(integer(), None)


@dataclass(frozen=True, kw_only=True)
class PauseCommand(RunCommand):
    NAME = "pause"


@dataclass(frozen=True, kw_only=True)
class ResumeCommand(RunCommand):
    NAME = "resume"


@dataclass(frozen=True, kw_only=True)
class StopCommand(RunCommand):
    NAME = "stop"


@dataclass(frozen=True, kw_only=True)
class ExcludeCommand(RunCommand):
    """The run goes on without ``pipelines`` (a device of theirs was lost): this agent's
    stages of them end, and its other stages' aggregation groups (and batch barriers) leave
    their members; ``uploader`` is the pipeline whose stages now send the server each
    round's average."""

    NAME = "exclude"
    pipelines: tuple[int, ...] = wire(items(integer(maximum=MAX_PIPELINES),
                                            maximum=MAX_PIPELINES))
    uploader: int | None = wire(integer(maximum=MAX_PIPELINES), None)


@dataclass(frozen=True, kw_only=True)
class ProbeCommand(RunCommand):
    """Does this agent still hold the run's stage (dead, restarted or healthy)?"""

    NAME = "probe"


@dataclass(frozen=True, kw_only=True)
class HaltCommand(Command):
    """Stop the run's stage for a recovery, keeping its weights; the ack lists them."""

    NAME = "halt"
    run: int = wire(integer())
    generation: int = wire(integer())


@dataclass(frozen=True, kw_only=True)
class MeasureCommand(Command):
    """Measure the links to these peers over the data plane; the answer is ``links``."""

    NAME = "measure"
    peers: Mapping[str, str] = wire(PEERS)
    keys: Mapping[str, str] = wire(KEYS, factory=dict)  # each peer's CURVE public key

    def check(self) -> None:
        keys_for_peers(self.peers, self.keys)


@dataclass(frozen=True, kw_only=True)
class EmulateCommand(Command):
    """Compute ``slowdown`` times slower from now on (a device heating up)."""

    NAME = "emulate"
    slowdown: float = wire(number(minimum=1, maximum=1000))


@dataclass(frozen=True, kw_only=True)
class ExitCommand(Command):
    """Fault injection: exit at once, as a crash would."""

    NAME = "exit"


COMMANDS: Mapping[str, type[Command]] = {c.NAME: c for c in (
    ProfileCommand, DeployCommand, StartCommand, PauseCommand, ResumeCommand, StopCommand,
    MeasureCommand, HaltCommand, ProbeCommand, EmulateCommand, ExitCommand, ExcludeCommand)}
"""Every command, by name: the server builds them, the agent dispatches on them."""


def command_name(raw: Any) -> str:
    """The name of the command ``raw`` is (ProtocolError naming ``command`` if none)."""
    name = raw.get("command") if isinstance(raw, dict) else None
    if name not in COMMANDS:
        raise fail("command", f"unknown command {name!r}; known: {', '.join(COMMANDS)}")
    return cast(str, name)


def parse_command(raw: Any) -> Command:
    return COMMANDS[command_name(raw)].from_json(raw)
