"""The agent's messages to the server (:data:`AGENT_MESSAGES`, :func:`parse_agent_message`)
and the server's replies (:data:`SERVER_MESSAGES`, :func:`parse_server_message`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.protocol.commands import Command, parse_command
from orchestrator.protocol.fields import (
    MAX_EVENTS,
    MAX_NAME,
    MAX_PEERS,
    MAX_PIPELINES,
    MAX_STAGES,
    MAX_TEXT,
    ProtocolError,
    address,
    curve_key,
    fail,
    flag,
    integer,
    items,
    json_columns,
    json_document,
    json_object,
    mapping,
    number,
    one_of,
    seconds,
    text,
)
from orchestrator.protocol.records import (
    DeviceResource,
    HeldCopy,
    MeasuredLink,
    Message,
    ModelSpecRef,
    resources_reader,
    wire,
)

MAX_REFUSALS = 16  # refused metric points a ``stored`` names

# ---- the agent's messages

MAX_HARDWARE_ENTRIES = 64
MAX_HARDWARE_BYTES = 16 * 1024
MAX_HARDWARE_DEPTH = 8
# a device's hardware description, as its agent says it in hello and at enrolment
HARDWARE = json_document(entries=MAX_HARDWARE_ENTRIES, size=MAX_HARDWARE_BYTES,
                         depth=MAX_HARDWARE_DEPTH)


# The version of this protocol that an agent speaks, said in its hello. 1: timeline events and
# metric points as JSON objects only (agents before events in columns, whose hello has no field
# for it); 2: also in columns (Events.timeline_columns and metrics_columns), which agents send.
# A server welcomes agents of its version and older, and refuses a newer one's hello naming
# ``protocol``; a server older than the field refuses it as a field it does not know. Either
# way a mismatch shows at connection, not at the run's first events batch.
PROTOCOL = 2
MAX_PROTOCOL = 1000


@dataclass(frozen=True, kw_only=True)
class Hello(Message):
    """The first message of a connection: the protocol version the agent speaks, its data plane
    (where, and its public key), its hardware, its measured fixed costs and, when it emulates
    several, its compute resources."""

    TYPE = "hello"
    protocol: int = wire(integer(minimum=1, maximum=MAX_PROTOCOL), 1)
    data_address: str = wire(address)
    data_key: str = wire(curve_key)  # the data plane's CURVE public key (Z85)
    # what the agent says about its machine (shown on the dashboard): a few dozen entries
    hardware: Mapping[str, Any] | None = wire(
        HARDWARE, None)
    overhead_s: float | None = wire(seconds(10), None)
    message_s: float | None = wire(seconds(10), None)
    resources: tuple[DeviceResource, ...] | None = wire(resources_reader, None)


@dataclass(frozen=True, kw_only=True)
class Ping(Message):
    """A clock-offset probe; answered by :class:`Pong` at once."""

    TYPE = "ping"
    id: int = wire(integer())


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    TYPE = "heartbeat"
    status: str = wire(one_of("online", "busy"), "online")
    load: Mapping[str, float] | None = wire(
        mapping(text(), number(minimum=-math.inf), maximum=16), None)


@dataclass(frozen=True, kw_only=True)
class Events(Message):
    """What a run's stages here produced since the last batch. Timeline and fault events are
    JSON objects the shared event schemas check (orchestrator.events), naming the field;
    ``timeline_columns`` holds more of the device's own timeline events in columns
    (orchestrator.eventcolumns: what agents send), after ``timeline``'s. Metric points are
    JSON objects the server reads one by one as :class:`MetricSample` (one it cannot take, a
    NaN loss say, is refused alone and said in ``stored``); ``metrics_columns`` holds more of
    them in columns, after those in ``metrics``."""

    TYPE = "events"
    run: int = wire(integer())
    timeline: tuple[Mapping[str, Any], ...] = wire(
        items(json_object(maximum=16), maximum=MAX_EVENTS), ())
    timeline_columns: Mapping[str, list[Any]] | None = wire(
        json_columns(maximum=16, length=MAX_EVENTS), None)
    faults: tuple[Mapping[str, Any], ...] = wire(
        items(json_object(maximum=16), maximum=MAX_EVENTS), ())
    metrics: tuple[Mapping[str, Any], ...] = wire(
        items(json_object(maximum=8), maximum=MAX_EVENTS), ())
    metrics_columns: Mapping[str, list[Any]] | None = wire(
        json_columns(maximum=8, length=MAX_EVENTS), None)
    # this batch's number in the agent's stream (a random id per agent process): the agent
    # sends a batch again when the connection closed before its ``stored``, and the server
    # stores a (stream, seq) once
    stream: str | None = wire(text(maximum=64), None)
    seq: int | None = wire(integer(minimum=1), None)


@dataclass(frozen=True, kw_only=True)
class Ack(Message):
    """The answer to a command: ``ok``, or the ``error`` that refused it (and changed
    nothing); with what the command asked for (a halt's ``holdings``, a probe's ``holds``)."""

    TYPE = "ack"
    id: str | None = wire(text(maximum=64), None)
    command: str = wire(text(maximum=64))
    ok: bool = wire(flag())
    error: str | None = wire(text(maximum=MAX_TEXT, empty=True), None)
    run: int | None = wire(integer(), None)
    model: str | None = wire(text(), None)
    generation: int | None = wire(integer(), None)
    holdings: tuple[HeldCopy, ...] | None = wire(
        items(HeldCopy.reader(), maximum=MAX_EVENTS), None)
    applied: int | None = wire(integer(), None)
    holds: bool | None = wire(flag(), None)
    slowdown: float | None = wire(number(minimum=1, maximum=1000), None)
    # a deploy's stage (a device may hold several stages of a run: split learning)
    pipeline: int | None = wire(integer(maximum=MAX_PIPELINES), None)
    stage: int | None = wire(integer(maximum=MAX_STAGES), None)

    @classmethod
    def to(cls, command: Command, **fields: Any) -> Ack:
        """The ack of ``command`` (its id, name, and run or model when it has one)."""
        return cls(id=command.id, command=command.NAME, run=getattr(command, "run", None),
                   model=getattr(command, "model", None), **{"ok": True, **fields})


@dataclass(frozen=True, kw_only=True)
class StageDone(Message):
    """A stage finished its micro-batches: its counts and the fixed costs it measured."""

    TYPE = "stage_done"
    run: int = wire(integer())
    generation: int | None = wire(integer(), None)
    forwards: int | None = wire(integer(), None)
    backwards: int | None = wire(integer(), None)
    updates: int | None = wire(integer(), None)
    applied_from: int | None = wire(integer(), None)
    updated: tuple[int, ...] | None = wire(items(integer(), maximum=10**7), None)
    overhead_s: float | None = wire(seconds(10), None)
    message_s: float | None = wire(seconds(10), None)
    pass_overhead_s: float | None = wire(seconds(10), None)
    pipeline: int | None = wire(integer(maximum=MAX_PIPELINES), None)
    stage: int | None = wire(integer(maximum=MAX_STAGES), None)

    def check(self) -> None:
        if self.pass_overhead_s is not None and (
                self.overhead_s is None or self.pass_overhead_s > self.overhead_s):
            raise fail("pass_overhead_s", "must come with overhead_s and be at most it",
                       self.pass_overhead_s)


@dataclass(frozen=True, kw_only=True)
class StageFailed(Message):
    TYPE = "stage_failed"
    run: int = wire(integer())
    error: str = wire(text(maximum=MAX_TEXT))
    generation: int | None = wire(integer(), None)
    pipeline: int | None = wire(integer(maximum=MAX_PIPELINES), None)
    stage: int | None = wire(integer(maximum=MAX_STAGES), None)


@dataclass(frozen=True, kw_only=True)
class Suspect(Message):
    """Stage 0's backward timer fired: a gradient is late by ``waited_s``."""

    TYPE = "suspect"
    run: int = wire(integer())
    generation: int = wire(integer())
    microbatch: int | None = wire(integer(), None)
    waited_s: float | None = wire(number(), None)


@dataclass(frozen=True, kw_only=True)
class ProfileProgress(Message):
    TYPE = "profile_progress"
    model: str = wire(text())
    done: int = wire(integer())
    total: int = wire(integer(minimum=1))

    def check(self) -> None:
        if self.done > self.total:
            raise fail("done", f"is more than total ({self.total})", self.done)


@dataclass(frozen=True, kw_only=True)
class ProfileResult(Message):
    """A layer profile (the shared format, which the server checks) of ``model_spec``."""

    TYPE = "profile_result"
    model_spec: ModelSpecRef = wire(ModelSpecRef.reader())  # noqa: RUF009 (a field)
    profile: Mapping[str, Any] = wire(json_object())


@dataclass(frozen=True, kw_only=True)
class ProfileFailed(Message):
    TYPE = "profile_failed"
    model: str = wire(text())
    error: str = wire(text(maximum=MAX_TEXT))


@dataclass(frozen=True, kw_only=True)
class LinkReport(Message):
    """The agent's own link, measured or emulated."""

    TYPE = "link"
    latency_s: float = wire(number(maximum=60))
    bandwidth_bps: float | None = wire(number(above=True), None)


@dataclass(frozen=True, kw_only=True)
class LinksReport(Message):
    """The links to its peers the agent measured on ``measure``."""

    TYPE = "links"
    links: tuple[MeasuredLink, ...] = wire(items(MeasuredLink.reader(), maximum=MAX_PEERS))


AGENT_MESSAGES: Mapping[str, type[Message]] = {m.TYPE: m for m in (
    Hello, Ping, Heartbeat, Events, Ack, StageDone, StageFailed, Suspect, ProfileProgress,
    ProfileResult, ProfileFailed, LinkReport, LinksReport)}
"""Every message an agent sends, by type."""


def _parse_typed(raw: Any, registry: Mapping[str, type[Message]]) -> Message:
    if not isinstance(raw, dict):
        raise ProtocolError("a message must be a JSON object", field="body",
                            reason="a message must be a JSON object")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in registry:
        raise fail("type", f"must be one of {', '.join(sorted(registry))}", kind)
    return registry[kind].from_json(raw)


def parse_agent_message(raw: Any) -> Message:
    """Read a message from an agent (ProtocolError naming the field)."""
    return _parse_typed(raw, AGENT_MESSAGES)


# ---- the server's replies


@dataclass(frozen=True, kw_only=True)
class Welcome(Message):
    TYPE = "welcome"
    device: str = wire(text())
    name: str = wire(text(maximum=MAX_NAME, empty=True))


@dataclass(frozen=True, kw_only=True)
class Pong(Message):
    TYPE = "pong"
    id: int = wire(integer())
    server_time: float = wire(number())


@dataclass(frozen=True, kw_only=True)
class ErrorReply(Message):
    """A message the server did not accept (it changed nothing); ``field`` names what was
    wrong, ``in_reply_to`` the type of the message. Both always present, null when unknown."""

    TYPE = "error"
    detail: str = wire(text(maximum=MAX_TEXT))
    field: str | None = wire(text(maximum=MAX_NAME), None)
    in_reply_to: str | None = wire(text(maximum=MAX_NAME), None)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "detail": self.detail, "field": self.field,
                "in_reply_to": self.in_reply_to}


@dataclass(frozen=True, kw_only=True)
class Stored(Message):
    """How many of an events batch's timeline events, faults and metric points were kept, and
    the metric points refused ({field, reason}: the first MAX_REFUSALS of them)."""

    TYPE = "stored"
    run: int = wire(integer())
    timeline: int = wire(integer())
    faults: int = wire(integer())
    metrics: int = wire(integer())
    refused: tuple[Mapping[str, Any], ...] = wire(
        items(json_object(maximum=4), maximum=MAX_REFUSALS), ())
    seq: int | None = wire(integer(minimum=1), None)  # the batch's, when it had one


@dataclass(frozen=True, kw_only=True)
class ProfileStored(Message):
    TYPE = "profile_stored"
    model_spec: int = wire(integer())


@dataclass(frozen=True, kw_only=True)
class LinksStored(Message):
    TYPE = "links_stored"
    count: int = wire(integer())


SERVER_MESSAGES: Mapping[str, type[Message]] = {m.TYPE: m for m in (
    Welcome, Pong, ErrorReply, Stored, ProfileStored, LinksStored)}
"""Every reply the server sends an agent, by type (commands aside: :data:`COMMANDS`)."""


def parse_server_message(raw: Any) -> Message:
    """Read a message from the server: a command or a reply."""
    if isinstance(raw, dict) and raw.get("type") == Command.TYPE:
        return parse_command(raw)
    return _parse_typed(raw, SERVER_MESSAGES)
