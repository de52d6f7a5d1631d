"""What the server does with an agent's control messages (docs/architecture.md, "Agent control
protocol"). The consumer only authenticates and dispatches; the message is read as its typed
form (orchestrator.protocol, which names a bad field), and each type has one handler here,
which checks it against the database and calls the devices' and runs' services."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from orchestrator.errors import FormatError
from orchestrator.eventcolumns import column_count, parse_metric_columns
from orchestrator.protocol import (
    PROTOCOL,
    Ack,
    DeployCommand,
    Events,
    HaltCommand,
    Heartbeat,
    Hello,
    LinkReport,
    LinksReport,
    LinksStored,
    Message,
    MetricSample,
    ProbeCommand,
    ProfileCommand,
    ProfileFailed,
    ProfileProgress,
    ProfileResult,
    ProfileStored,
    ProtocolError,
    StageDone,
    StageFailed,
    Stored,
    Suspect,
    Welcome,
    parse_agent_message,
)
from webapp.common.exceptions import InvalidInput
from webapp.devices import services as device_services
from webapp.devices.events import event_profiling, profiling_event_send
from webapp.devices.models import Device
from webapp.runs import recovery
from webapp.runs import services as run_services
from webapp.runs.models import Run, RunDevice

log = logging.getLogger(__name__)

Reply = Message | None


def _device(device_id: int) -> Device:
    """The device (raw SQL, as :func:`_run_of`: read for every message an agent sends)."""
    table = connection.ops.quote_name(Device._meta.db_table)
    device = next(iter(Device.objects.raw(f"SELECT * FROM {table} WHERE id = %s",
                                          [device_id])), None)
    if device is None:
        raise Device.DoesNotExist(f"no device {device_id}")
    return device


def _run_of(device: Device, run_id: int) -> Run:
    # raw SQL: composing the ORM's join for every events batch took an eighth of the web
    # server's Python time while two agents trained VGG-5
    runs, members = (connection.ops.quote_name(m._meta.db_table) for m in (Run, RunDevice))
    run = next(iter(Run.objects.raw(
        f"SELECT {runs}.* FROM {runs} JOIN {members} ON {members}.run_id = {runs}.id "
        f"WHERE {runs}.id = %s AND {members}.device_id = %s", [run_id, device.pk])), None)
    if run is None:
        raise InvalidInput("run", f"device {device.uid} has no run {run_id}")
    return run


def agent_connected(*, device_id: int, channel: str) -> Device:
    """A new control connection: it is the device's current one from now on. Its heartbeat
    time is left for its ``hello``: a device whose heartbeat is newer than a moment is one that
    said where its data plane is since then (the demo waited for a fresh heartbeat, and a
    restarted agent's fresh connection had its link measurement sent to its old address)."""
    device = Device.objects.get(pk=device_id)
    device.control_channel = channel
    device.status = Device.Status.ONLINE
    device.save(update_fields=["control_channel", "status"])
    return device


def agent_disconnected(*, device_id: int, channel: str) -> bool:
    """The connection closed. If it was the device's current one, the device is offline and the
    runs it was training fail; a connection replaced by a newer one changes nothing."""
    with transaction.atomic():
        device = Device.objects.select_for_update().get(pk=device_id)
        if device.control_channel != channel:
            return False
        device.control_channel = ""
        device.data_address = ""
        if device.status != Device.Status.RETIRED:
            device.status = Device.Status.OFFLINE
        device.save(update_fields=["control_channel", "data_address", "status"])
    recovery.run_device_lost(device=device, reason="its agent disconnected",
                             detected_by="disconnect")
    return True


def _hello(device: Device, message: Hello) -> Reply:
    if message.protocol > PROTOCOL:  # it would send what this server cannot read: say so now
        raise InvalidInput("protocol", f"the agent speaks protocol {message.protocol} and this "
                                       f"server {PROTOCOL} or older: upgrade the server")
    device.data_address = message.data_address
    device.data_key = message.data_key
    # its emulated compute resources (--resources): said anew at each hello, none without
    device.resources = [r.to_json() for r in message.resources or ()]
    device.last_heartbeat_at = timezone.now()  # a sign of life, and of where it listens
    fields = ["data_address", "data_key", "resources", "last_heartbeat_at"]
    for name in ("overhead_s", "message_s"):  # the agent's measured fixed costs
        value = getattr(message, name)
        if value is not None:
            setattr(device, name, value)
            fields.append(name)
    if message.hardware is not None:
        device.hardware = dict(message.hardware)
        fields.append("hardware")
    device.save(update_fields=fields)
    recovery.run_device_back(device=device)
    return Welcome(device=device.uid, name=device.name)


# A heartbeat that says what the last one written said is written only this often: each write
# is a database update and a Devices page event, and hundreds of agents at 1 Hz kept a web
# process's database thread busy with them (bench/load.py). Kept well within
# DEVICE_OFFLINE_AFTER_S, after which a silent device goes offline.
HEARTBEAT_WRITE_S = 5.0


def heartbeat_write_due(*, status: str, written: tuple[str, float] | None, now: float) -> bool:
    """Whether a heartbeat saying ``status`` at ``now`` (monotonic seconds) must be written:
    ``written`` is the status and time of the last one written for this connection (None:
    none yet). A change of status is written at once, the same status every
    HEARTBEAT_WRITE_S (at most a quarter of DEVICE_OFFLINE_AFTER_S)."""
    if written is None or written[0] != status:
        return True
    every = min(HEARTBEAT_WRITE_S, float(settings.DEVICE_OFFLINE_AFTER_S) / 4)
    return now - written[1] >= every


def _heartbeat(device: Device, message: Heartbeat) -> Reply:
    device_services.device_heartbeat(device=device, status=message.status)
    return None


def _events(device: Device, message: Events) -> Reply:
    run = _run_of(device, message.run)
    stored = run_services.run_events_store(
        run=run, device=device, timeline=list(message.timeline),
        timeline_columns=_columns_of([message]), faults=list(message.faults),
        metrics=list(message.metrics), metrics_columns=_metric_columns_of([message]),
        stream=message.stream, seq=message.seq)
    _repartition_check(run, [message])
    return Stored(run=run.pk, seq=message.seq, **stored)


def _columns_of(batches: Sequence[Events]) -> list[Mapping[str, Any]]:
    return [b.timeline_columns for b in batches if b.timeline_columns is not None]


def _metric_columns_of(batches: Sequence[Events]) -> list[Mapping[str, Any]]:
    return [b.metrics_columns for b in batches if b.metrics_columns is not None]


def _repartition_check(run: Run, batches: Sequence[Events]) -> None:
    """(After the batches were stored, so read.) The newest update they report, if any."""
    updates = [m for b in batches for e in b.timeline
               if e.get("kind") == "update" and isinstance(m := e.get("microbatch"), int)]
    updates += [m for columns in _columns_of(batches)
                for kind, m in zip(columns["kind"], columns["microbatch"], strict=True)
                if kind == "update"]
    if updates:  # the dynamic re-partition's clock: how far training has got
        recovery.run_repartition_check(run_id=run.pk, progress=max(updates), seen=run)


# Events batches of one agent that queued up behind each other are stored together, at most
# this many events at once (one batch holds at most orchestrator.protocol.MAX_EVENTS)
MERGED_EVENTS_MAX = 20_000

Answer = Message | Exception | None


def agent_events(*, device_id: int, messages: Sequence[Any]) -> list[Answer]:
    """Handle ``events`` messages an agent sent one after the other, which waited while its
    earlier ones were stored: each answered as :func:`agent_message` answers it (its
    ``stored``, or the exception that refused it), in order. Consecutive ones of one run and
    stream are stored at once, in one transaction and one delta to the run's page, so that an
    agent that fell behind catches up rather than falling further behind (bench/load.py)."""
    readable = [_mergeable(raw) for raw in messages]
    answers: list[Answer] = []
    first = 0
    while first < len(messages):
        head, end, size = readable[first], first + 1, _size(readable[first])
        while (head is not None and end < len(messages) and (nxt := readable[end]) is not None
               and (nxt.run, nxt.stream) == (head.run, head.stream)
               and size + _size(nxt) <= MERGED_EVENTS_MAX):
            size, end = size + _size(nxt), end + 1
        if end - first == 1:  # read already, unless it did not read as mergeable
            answers.append(_answer(device_id, head or messages[first]))
        else:
            answers.extend(_events_together(device_id, cast(list[Events],
                                                            readable[first:end])))
        first = end
    return answers


def _mergeable(raw: Any) -> Events | None:
    """``raw`` as a numbered events batch whose every metric point reads (whose answer a store
    together can say exactly), else None: stored alone."""
    try:
        message = parse_agent_message(raw)
        if not isinstance(message, Events) or message.stream is None or message.seq is None:
            return None
        read = MetricSample.reader()
        for i, point in enumerate(message.metrics):
            read(point, f"metrics[{i}]")
        if message.metrics_columns is not None and parse_metric_columns(
                message.metrics_columns)[1]:
            return None
    except (ProtocolError, FormatError):
        return None
    return message


def _size(message: Events | None) -> int:
    if message is None:
        return MERGED_EVENTS_MAX
    return _timeline_count(message) + len(message.faults) + _metrics_count(message)


def _timeline_count(message: Events) -> int:
    return len(message.timeline) + column_count(message.timeline_columns)


def _metrics_count(message: Events) -> int:
    return len(message.metrics) + column_count(message.metrics_columns)


def _answer(device_id: int, message: Any) -> Answer:
    try:
        return agent_message(device_id=device_id, message=message)
    except Exception as exc:  # the consumer answers it as it answers agent_message's
        return exc


def _events_together(device_id: int, batches: list[Events]) -> list[Answer]:
    """Consecutive batches of one run and stream, stored as one; a batch stored already (sent
    again after a reconnect) is skipped as run_events_store skips it. If the run refuses them
    (a bad event, a run no longer active), nothing is stored and each is handled alone, for
    its own answer."""
    try:
        with transaction.atomic():
            device = _device(device_id)
            if device.status == Device.Status.RETIRED:
                raise InvalidInput("device", f"device {device.uid} is retired")
            run = _run_of(device, batches[0].run)
            member = run_services.run_member_lock(run=run, device=device)
            fresh = [b for b in batches if member is None or member.events_stream != b.stream
                     or (b.seq or 0) > member.events_seq]
            if fresh:
                run_services.run_events_store_locked(
                    run=run, device=device, member=member,
                    timeline=[e for b in fresh for e in b.timeline],
                    timeline_columns=_columns_of(fresh),
                    faults=[f for b in fresh for f in b.faults],
                    metrics=[dict(p) for b in fresh for p in b.metrics],
                    metrics_columns=_metric_columns_of(fresh),
                    stream=fresh[-1].stream, seq=fresh[-1].seq)
    except Exception:
        return [_answer(device_id, b) for b in batches]
    _repartition_check(run, fresh)
    stored = {id(b) for b in fresh}
    return [Stored(run=run.pk, seq=b.seq, timeline=_timeline_count(b), faults=len(b.faults),
                   metrics=_metrics_count(b)) if id(b) in stored
            else Stored(run=run.pk, seq=b.seq, timeline=0, faults=0, metrics=0)
            for b in batches]


def _ack(device: Device, message: Ack) -> Reply:
    command, error, generation = message.command, message.error or "", message.generation
    if command == DeployCommand.NAME:
        run = _run_of(device, _ack_run(message))
        if message.ok:
            run_services.run_stage_ready(run=run, device=device, generation=generation,
                                         pipeline=message.pipeline, stage=message.stage)
        else:
            run_services.run_stage_failed(run=run, device=device, generation=generation,
                                          error=error or "the agent refused its stage",
                                          pipeline=message.pipeline, stage=message.stage)
    elif command == HaltCommand.NAME and message.ok:
        recovery.run_stage_halted(run=_run_of(device, _ack_run(message)), device=device,
                                  generation=generation,
                                  holdings=[h.to_json() for h in message.holdings or ()])
    elif command == ProbeCommand.NAME and message.ok:
        recovery.run_probe_answered(run=_run_of(device, _ack_run(message)), device=device,
                                    holds=message.holds)
    elif not message.ok:
        log.warning("device %s refused %s: %s", device.uid, command, error)
        if command == ProfileCommand.NAME:
            profiling_event_send(event_profiling(
                device, model=message.model or "", state="failed",
                error=error or "the agent refused to profile"))
    return None


def _ack_run(message: Ack) -> int:
    if message.run is None:
        raise InvalidInput("run", f"is missing from the ack of {message.command}")
    return message.run


def _stage_done(device: Device, message: StageDone) -> Reply:
    run = _run_of(device, message.run)
    run_services.run_stage_done(run=run, device=device, generation=message.generation,
                                pipeline=message.pipeline, stage=message.stage)
    if message.overhead_s is not None:  # what the stage measured, for later plans
        device_services.profile_costs_measured(
            device=device, model_spec=run.model_spec, overhead_s=message.overhead_s,
            message_s=message.message_s, pass_overhead_s=message.pass_overhead_s)
    return None


def _stage_failed(device: Device, message: StageFailed) -> Reply:
    run_services.run_stage_failed(run=_run_of(device, message.run), device=device,
                                  error=message.error, generation=message.generation,
                                  pipeline=message.pipeline, stage=message.stage)
    return None


def _suspect(device: Device, message: Suspect) -> Reply:
    """Stage 0's backward timer fired: probe the run's devices."""
    log.warning("device %s suspects a device of run %s (waited %.2f s for micro-batch %s)",
                device.uid, message.run, message.waited_s or 0.0, message.microbatch)
    recovery.run_suspect(run=_run_of(device, message.run), device=device,
                         generation=message.generation)
    return None


def _profile_result(device: Device, message: ProfileResult) -> Reply:
    spec = message.model_spec
    model_spec, _ = device_services.model_spec_get_or_create(
        model=spec.model, dataset=spec.dataset, batch_size=spec.batch_size)
    try:
        device_services.layer_profile_upload(device=device, model_spec=model_spec,
                                             document=dict(message.profile))
    except InvalidInput as exc:
        profiling_event_send(event_profiling(
            device, model=model_spec.model, state="failed",
            error=f"the server refused the profile: {exc}"))
        raise
    profiling_event_send(event_profiling(device, model=model_spec.model, state="stored"))
    return ProfileStored(model_spec=model_spec.pk)


def _link(device: Device, message: LinkReport) -> Reply:
    """The device's link as the agent measured (or emulates) it: latency, and bandwidth when
    known; planning uses them."""
    device.latency_s = message.latency_s
    fields = ["latency_s"]
    if message.bandwidth_bps is not None:
        device.bandwidth_bps = message.bandwidth_bps
        fields.append("bandwidth_bps")
    device.save(update_fields=fields)
    return None


def _links(device: Device, message: LinksReport) -> Reply:
    count = device_services.device_links_store(
        device=device, links=[link.to_json() for link in message.links])
    return LinksStored(count=count)


def _profile_progress(device: Device, message: ProfileProgress) -> Reply:
    log.info("device %s profiled %d of %d layers of %s", device.uid, message.done,
             message.total, message.model)
    profiling_event_send(event_profiling(device, model=message.model, state="running",
                                         done=message.done, total=message.total))
    return None


def _profile_failed(device: Device, message: ProfileFailed) -> Reply:
    log.warning("device %s could not profile %s: %s", device.uid, message.model, message.error)
    profiling_event_send(event_profiling(device, model=message.model, state="failed",
                                         error=message.error))
    return None


HANDLERS: dict[type[Message], Callable[[Device, Any], Reply]] = {
    Hello: _hello, Heartbeat: _heartbeat, Events: _events, Ack: _ack, StageDone: _stage_done,
    StageFailed: _stage_failed, ProfileResult: _profile_result,
    ProfileProgress: _profile_progress, ProfileFailed: _profile_failed, LinkReport: _link,
    LinksReport: _links, Suspect: _suspect,
}
"""One handler for each agent message (a ping is the consumer's: it needs no database)."""


def agent_message(*, device_id: int, message: Any) -> Reply:
    """Handle one message from an agent (its JSON, or the typed message); InvalidInput names
    the field that is wrong."""
    if not isinstance(message, Message):
        try:
            message = parse_agent_message(message)
        except ProtocolError as exc:
            raise InvalidInput(exc.field or "body", exc.reason) from None
    handler = HANDLERS.get(type(message))
    if handler is None:
        raise InvalidInput("type", f"{message.TYPE} is not for the server's gateway")
    device = _device(device_id)
    if device.status == Device.Status.RETIRED:
        raise InvalidInput("device", f"device {device.uid} is retired")
    return handler(device, message)
