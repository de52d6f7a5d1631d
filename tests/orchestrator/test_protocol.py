"""The typed messages of the agent protocol: every one round-trips through JSON, and a
malformed one is refused naming its field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.protocol import (
    AGENT_MESSAGES,
    COMMANDS,
    PROTOCOL,
    SERVER_MESSAGES,
    Ack,
    ChainReplica,
    DeployCommand,
    DeviceResource,
    EmulateCommand,
    ErrorReply,
    Events,
    ExcludeCommand,
    ExitCommand,
    FetchReply,
    HaltCommand,
    Heartbeat,
    HeldCopy,
    Hello,
    LinkReport,
    LinksReport,
    LinksStored,
    MeasureCommand,
    MeasuredLink,
    MetricSample,
    ModelSpecRef,
    PauseCommand,
    Ping,
    Pong,
    ProbeCommand,
    ProfileCommand,
    ProfileFailed,
    ProfileProgress,
    ProfileResult,
    ProfileStored,
    ProtocolError,
    RestorePart,
    ResumeCommand,
    StageDone,
    StageFailed,
    StageSpec,
    StartCommand,
    StopCommand,
    Stored,
    Suspect,
    WeightFetch,
    Welcome,
    parse_agent_message,
    parse_command,
    parse_server_message,
    parse_weight_name,
)

KEY = 'Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID'  # a CURVE public key (Z85)

SPEC = StageSpec(run=7, device="a", stage=0, layers=(0, 1), model="mlp", dataset="digits",
                 batch_size=8, schedule="1f1b", stage_devices=(("a",), ("b",)),
                 stage_times_s=((1.0,), (1.0,)), microbatches=4)

EXAMPLES: list[Any] = [
    # commands
    ProfileCommand(id="c1", model="mlp", dataset="digits", batch_size=16),
    DeployCommand(id="c2", run=7, spec=SPEC, peers={"b": "tcp://10.0.0.2:5601"},
                  keys={"b": KEY},
                  started_at=1.5e9, restore=(RestorePart(layers=(0, 1), applied=8,
                                                         source="central", device="a",
                                                         kind="central", bytes=100),)),
    DeployCommand(id="c2b", run=7, spec=SPEC, peers={"b": "tcp://10.0.0.2:5601"},
                  keys={"b": KEY}),
    StartCommand(id="c3", run=7, started_at=1.5e9, generation=1, begin_at=1.5e9 + 2,
                 paused=True),
    PauseCommand(id="c4", run=7), ResumeCommand(id="c5", run=7, generation=2),
    StopCommand(id="c6", run=7), ProbeCommand(id="c7", run=7),
    HaltCommand(id="c8", run=7, generation=3),
    MeasureCommand(id="c9", peers={"a": "tcp://127.0.0.1:1", "b": "tcp://[::1]:2"},
                   keys={"a": KEY, "b": KEY}),
    EmulateCommand(id="c10", slowdown=2.5), ExitCommand(id="c11"),
    ExcludeCommand(id="c12", run=7, generation=0, pipelines=(1, 3), uploader=0),
    # the agent's messages
    Hello(data_address="tcp://127.0.0.1:5601", data_key=KEY, hardware={"cpus": 4},
          overhead_s=0.001,
          message_s=0.0002, resources=(DeviceResource(kind="cpu", speed=1, backward_speed=0.5),
                                       DeviceResource(kind="gpu", speed=2, backward_speed=4))),
    Ping(id=3), Heartbeat(status="busy", load={"loadavg_1m": 0.5}),
    Events(run=7, timeline=({"run": 7, "kind": "forward"},), faults=(),
           metrics=(MetricSample(at=1.0, kind="loss", device="a", value=2.3).to_json(),
                    MetricSample(at=1.0, kind="throughput_sps", value=10.0).to_json())),
    Stored(run=7, timeline=1, faults=0, metrics=1,
           refused=({"field": "metrics[1].value", "reason": "must be a finite number"},)),
    Ack(id="c8", command="halt", ok=True, run=7, generation=3, applied=8,
        holdings=(HeldCopy(layers=(0, 1), applied=8, kind="own"),)),
    Ack(id="c1", command="profile", ok=False, error="unknown model", model="resnet999"),
    Ack(id="c7", command="probe", ok=True, run=7, holds=False),
    Ack(id="c10", command="emulate", ok=True, slowdown=2.5),
    StageDone(run=7, generation=1, forwards=4, backwards=4, updates=4, applied_from=0,
              updated=(0, 1, 2, 3), overhead_s=0.002, message_s=0.0001, pass_overhead_s=0.001),
    StageFailed(run=7, error="boom", generation=0),
    Suspect(run=7, generation=0, microbatch=5, waited_s=1.5),
    ProfileProgress(model="mlp", done=3, total=9),
    ProfileResult(model_spec=ModelSpecRef(model="mlp", dataset="digits", batch_size=8),
                  profile={"model": "mlp", "layers": []}),
    ProfileFailed(model="mlp", error="out of memory"),
    LinkReport(latency_s=0.002, bandwidth_bps=1.25e7), LinkReport(latency_s=0.0),
    LinksReport(links=(MeasuredLink(peer="b", bandwidth_bps=5e6, latency_s=0.001),)),
    # the server's replies
    Welcome(device="edge-1", name="pi"), Pong(id=3, server_time=1.5e9),
    ErrorReply(detail="status: must be online or busy", field="status",
               in_reply_to="heartbeat"),
    ErrorReply(detail="the server failed"),
    Stored(run=7, timeline=1, faults=0, metrics=2), ProfileStored(model_spec=3),
    LinksStored(count=1),
]



@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_json(message: Any) -> None:
    # Execute
    wire = json.loads(json.dumps(message.to_json()))
    # Assert
    assert type(message).from_json(wire) == message
    if isinstance(message, tuple(COMMANDS.values())):
        assert parse_command(wire) == message == parse_server_message(wire)
    elif type(message) in AGENT_MESSAGES.values():
        assert parse_agent_message(wire) == message
    else:
        assert parse_server_message(wire) == message


def test_the_examples_cover_every_registered_message() -> None:
    covered = {type(m) for m in EXAMPLES}
    assert set(COMMANDS.values()) <= covered
    assert set(AGENT_MESSAGES.values()) <= covered
    assert set(SERVER_MESSAGES.values()) <= covered
    assert list(COMMANDS) == ["profile", "deploy", "start", "pause", "resume", "stop",
                              "measure", "halt", "probe", "emulate", "exit", "exclude"]


def test_optional_fields_are_left_out_and_null_means_absent() -> None:
    assert StopCommand(id="c6", run=7).to_json() == {"type": "command", "id": "c6",
                                                     "command": "stop", "run": 7}
    assert Ack.from_json({"type": "ack", "id": None, "command": "stop", "ok": True,
                          "run": None}) == Ack(command="stop", ok=True)
    assert ExitCommand().id != ExitCommand().id  # each command its own id


def test_a_hello_without_a_protocol_version_is_an_older_agent_s() -> None:
    assert Hello.from_json(hello()).protocol == 1
    assert Hello.from_json(hello(protocol=PROTOCOL)).protocol == PROTOCOL == 2
    # this version's agents say theirs, and an older server then refuses the field by name
    said = Hello(protocol=PROTOCOL, data_address="tcp://127.0.0.1:5601", data_key=KEY).to_json()
    assert said["protocol"] == PROTOCOL


def hello(**fields: Any) -> dict[str, Any]:
    return {"type": "hello", "data_address": "tcp://127.0.0.1:5601", "data_key": KEY, **fields}


def command(name: str, **fields: Any) -> dict[str, Any]:
    return {"type": "command", "id": "c1", "command": name, **fields}


RESOURCE = {"kind": "cpu", "speed": 1, "backward_speed": 0.5}


@pytest.mark.parametrize(("raw", "field", "says"), [
    ({"type": "teleport"}, "type", "must be one of ack, events"),
    ([1, 2], "body", "must be a JSON object"),
    ({"type": "hello"}, "data_address", "is missing from the hello message"),
    (hello(colour="red"), "colour", "is not a field of the hello message"),
    (hello(protocol=0), "protocol", "must be an integer from 1 to 1000"),
    (hello(protocol="2"), "protocol", "must be an integer from 1 to 1000"),
    (hello(data_address="http://x"), "data_address", "must be tcp://host:port"),
    (hello(data_address="tcp://x:port"), "data_address", "must be tcp://host:port"),
    (hello(data_address="tcp://x:70000"), "data_address", "must be tcp://host:port"),
    (hello(message_s=-0.5), "message_s", "must be between 0 and 10 seconds"),
    (hello(overhead_s=True), "overhead_s", "must be between 0 and 10 seconds"),
    (hello(hardware=[]), "hardware", "must be a JSON object"),
    (hello(resources=[]), "resources", "must be a list of 1 to 8 items"),
    (hello(resources=[RESOURCE] * 9), "resources", "must be a list of 1 to 8 items"),
    (hello(resources=[RESOURCE, RESOURCE]), "resources[1].kind", "is repeated"),
    (hello(resources=[{**RESOURCE, "speed": 0}]), "resources[0].speed", "must be above 0"),
    (hello(resources=[{**RESOURCE, "speed": float("inf")}]), "resources[0].speed",
     "must be a finite number"),
    (hello(resources=[{**RESOURCE, "kind": "GPU 0"}]), "resources[0].kind",
     "short identifier"),
    (hello(resources=[{"kind": "cpu", "speed": 1}]), "resources[0].backward_speed",
     "is missing from resources[0]"),
    ({"type": "heartbeat", "status": "asleep"}, "status", "must be online or busy"),
    ({"type": "ping", "id": "x"}, "id", "must be an integer"),
    ({"type": "events", "run": -1}, "run", "must be an integer from 0"),
    ({"type": "events", "run": 1, "timeline": [1]}, "timeline[0]", "must be a JSON object"),
    ({"type": "events", "run": 1, "metrics": [[0, "loss"]]}, "metrics[0]",
     "must be a JSON object"),
    ({"type": "ack", "id": "c1", "command": "deploy"}, "ok", "is missing from the ack message"),
    ({"type": "ack", "command": "halt", "ok": True, "holdings": [
        {"layers": [2, 1], "applied": 0, "kind": "own"}]}, "holdings[0].layers",
     "first <= last"),
    ({"type": "ack", "command": "halt", "ok": True, "holdings": [
        {"layers": [0, 1], "applied": 0, "kind": "theirs"}]}, "holdings[0].kind",
     "must be own or replica"),
    ({"type": "stage_done", "run": 1, "overhead_s": -1}, "overhead_s", "between 0 and 10"),
    ({"type": "stage_done", "run": 1, "overhead_s": 0.001, "pass_overhead_s": 0.002},
     "pass_overhead_s", "must come with overhead_s and be at most it"),
    ({"type": "stage_failed", "run": 1}, "error", "is missing"),
    ({"type": "suspect", "run": 1}, "generation", "is missing"),
    ({"type": "profile_progress", "model": "m", "done": 5, "total": 4}, "done",
     "is more than total"),
    ({"type": "profile_result", "profile": {}, "model_spec": {"model": "m"}},
     "model_spec.dataset", "is missing from model_spec"),
    ({"type": "link", "latency_s": 61}, "latency_s", "at most 60"),
    ({"type": "links", "links": [{"peer": "b", "bandwidth_bps": -1, "latency_s": 0}]},
     "links[0].bandwidth_bps", "must be above 0"),
])
def test_a_malformed_agent_message_is_refused_naming_the_field(raw: Any, field: str,
                                                               says: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_agent_message(raw)
    assert refused.value.field == field and says in str(refused.value)


@pytest.mark.parametrize(("raw", "field", "says"), [
    (command("teleport"), "command", "unknown command 'teleport'"),
    ({"command": "stop", "run": 1}, "type", "is missing from the stop command"),
    ({"type": "command", "command": "stop", "run": 1}, "id", "is missing"),
    (command("stop"), "run", "is missing from the stop command"),
    (command("stop", run=1, colour="red"), "colour", "is not a field of the stop command"),
    (command("deploy", run=7, spec={"run": 7}), "spec.device", "is missing from the stage spec"),
    (command("deploy", run=8, spec=SPEC.to_json()), "spec.run", "is not the command's run 8"),
    (command("deploy", run=7, spec=SPEC.to_json(), peers={"b": "udp://x:1"}), "peers.b",
     "must be tcp://host:port"),
    (command("deploy", run=7, spec=SPEC.to_json(), restore=[{"layers": [0, 1]}]),
     "restore[0].applied", "is missing"),
    (command("deploy", run=7, spec={**SPEC.to_json(), "microbatches": 10**6}),
     "spec.microbatches", "is over the 50,000 micro-batches a run may train"),
    (command("start", run=7), "started_at", "is missing"),
    (command("start", run=7, started_at=1.0, paused="yes"), "paused", "must be true or false"),
    (command("halt", run=7), "generation", "is missing"),
    (command("emulate", slowdown=0.5), "slowdown", "at least 1 and at most 1000"),
    (command("measure", peers=[]), "peers", "must be a JSON object"),
    (command("measure", peers={"b": "tcp://x:1"}), "keys.b", "every peer needs its public key"),
    (command("measure", peers={"b": "tcp://x:1"}, keys={"b": "not-a-key"}), "keys.b",
     "must be a CURVE public key"),
    (command("profile", model="mlp", batch_size=0), "batch_size", "from 1"),
])
def test_a_malformed_command_is_refused_naming_the_field(raw: Any, field: str,
                                                         says: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_command(raw)
    assert refused.value.field == field and says in str(refused.value)


def test_commands_built_in_code_obey_the_same_rules() -> None:
    with pytest.raises(ProtocolError, match="slowdown: must be at least 1"):
        EmulateCommand(slowdown=5000)
    with pytest.raises(ProtocolError, match=r"spec\.run: is not the command's run 8"):
        DeployCommand(run=8, spec=SPEC)
    with pytest.raises(ProtocolError, match="resources: must be a list of 1 to 8"):
        Hello(data_address="tcp://a:1", data_key=KEY, resources=())


def test_records_are_read_once_and_built_ones_still_checked() -> None:
    """A record read from JSON is not read again by its __post_init__ (the events batches
    were, twice), and a failed read leaves records built in code checked as before."""
    event = {"run": 1, "device": "d", "stage": 0, "kind": "forward", "microbatch": 0,
             "version": 0, "start": 0.0, "end": 1.0}
    read = parse_agent_message({"type": "events", "run": 1, "timeline": [event, event]})
    assert read == Events(run=1, timeline=(event, event))
    with pytest.raises(ProtocolError, match=r"timeline\[1\]: must be a JSON object"):
        parse_agent_message({"type": "events", "run": 1, "timeline": [event, [1]]})
    with pytest.raises(ProtocolError, match="run: must be"):
        parse_agent_message({"type": "events", "run": -1})
    with pytest.raises(ProtocolError, match=r"timeline\[0\]: must be a JSON object"):
        Events(run=1, timeline=("forward",))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="slowdown: must be at least 1"):
        EmulateCommand(slowdown=5000)


def test_a_server_reply_or_command_is_read_by_its_type() -> None:
    assert parse_server_message({"type": "welcome", "device": "d", "name": ""}) == Welcome(
        device="d", name="")
    assert isinstance(parse_server_message(command("exit")), ExitCommand)
    with pytest.raises(ProtocolError, match="type: must be one of error, links_stored"):
        parse_server_message({"type": "hello"})


# --------------------------------------------------------------------------- weight names


@pytest.mark.parametrize("name", [
    ChainReplica((0, 3)), FetchReply(12),
    WeightFetch(7, (2, 5), "edge-abc123", "tcp://192.168.1.4:5601"),
])
def test_weight_message_names_round_trip(name: Any) -> None:
    assert parse_weight_name(name.to_name()) == name


def test_a_fetch_names_its_reply() -> None:
    fetch = WeightFetch(7, (2, 5), "edge-abc123", "tcp://h:1")
    assert fetch.to_name() == "fetch:7:2-5:edge-abc123=tcp://h:1"
    assert fetch.reply().to_name() == "fetched:7"


@pytest.mark.parametrize(("name", "field"), [
    ("replica:3-1", "layers"), ("replica:a-b", "layers"), ("replica:", "layers"),
    ("fetched:x", "token"), ("fetched:0", "token"),
    ("fetch:x:0-1:a=tcp://h:1", "token"), ("fetch:1:0-1:a=http://h:1", "reply_to"),
    ("fetch:1:0-1:a=tcp://h:port", "reply_to"), ("fetch:1:0-1:=tcp://h:1", "requester"),
    ("fetch:1:0-1:a:b=tcp://h:1", "requester"), ("pickle:anything", "name"), (None, "name"),
])
def test_a_malformed_weight_name_is_refused_naming_the_part(name: str | None,
                                                            field: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_weight_name(name)
    assert refused.value.field == field
