"""The messages the server and the agents exchange, as typed values both sides import.

Stdlib only (the agent runs with requirements-agent.txt): frozen dataclasses with ``to_json``
and ``from_json``. ``from_json`` is strict: a missing field, an unknown one, a value of the
wrong type or out of range raises :class:`ProtocolError` naming the field, so a malformed
message changes nothing on the side that receives it; a message built in code is checked by
the same rules. docs/architecture.md, "Agent control protocol", lists them:

- the stage spec a ``deploy`` carries (:class:`StageSpec`);
- the server's commands, one class each, named in one registry, :data:`COMMANDS`, that the
  server builds from and the agent dispatches on (:func:`parse_command`);
- the agent's messages to the server (:data:`AGENT_MESSAGES`, :func:`parse_agent_message`)
  and the server's replies (:data:`SERVER_MESSAGES`, :func:`parse_server_message`);
- the names of the weight messages agents send each other on the data plane (a chain
  replica, a fetch and its answer: :func:`parse_weight_name`).

The package's modules, each imported from here: :mod:`~orchestrator.protocol.fields` (the
limits, ProtocolError and the field readers), :mod:`~orchestrator.protocol.stagespec`,
:mod:`~orchestrator.protocol.records` (the record machinery, the small records messages carry
and the Message base), :mod:`~orchestrator.protocol.commands`,
:mod:`~orchestrator.protocol.reports` (the agent's messages and the server's replies) and
:mod:`~orchestrator.protocol.weightnames`.
"""

from orchestrator.protocol.commands import (
    COMMANDS,
    Command,
    DeployCommand,
    EmulateCommand,
    ExcludeCommand,
    ExitCommand,
    HaltCommand,
    MeasureCommand,
    PauseCommand,
    ProbeCommand,
    ProfileCommand,
    ResumeCommand,
    RunCommand,
    StartCommand,
    StopCommand,
    command_name,
    new_command_id,
    parse_command,
)
from orchestrator.protocol.fields import ProtocolError
from orchestrator.protocol.records import (
    SYSTEM_METRICS,
    DeviceResource,
    HeldCopy,
    MeasuredLink,
    Message,
    MetricSample,
    ModelSpecRef,
    RestorePart,
    resources_reader,
)
from orchestrator.protocol.reports import (
    AGENT_MESSAGES,
    HARDWARE,
    MAX_REFUSALS,
    PROTOCOL,
    SERVER_MESSAGES,
    Ack,
    ErrorReply,
    Events,
    Heartbeat,
    Hello,
    LinkReport,
    LinksReport,
    LinksStored,
    Ping,
    Pong,
    ProfileFailed,
    ProfileProgress,
    ProfileResult,
    ProfileStored,
    StageDone,
    StageFailed,
    Stored,
    Suspect,
    Welcome,
    parse_agent_message,
    parse_server_message,
)
from orchestrator.protocol.stagespec import StageSpec
from orchestrator.protocol.weightnames import (
    ChainReplica,
    FetchReply,
    WeightFetch,
    WeightName,
    parse_weight_name,
)

__all__ = [
    "AGENT_MESSAGES",
    "COMMANDS",
    "HARDWARE",
    "MAX_REFUSALS",
    "PROTOCOL",
    "SERVER_MESSAGES",
    "SYSTEM_METRICS",
    "Ack",
    "ChainReplica",
    "Command",
    "DeployCommand",
    "DeviceResource",
    "EmulateCommand",
    "ErrorReply",
    "Events",
    "ExcludeCommand",
    "ExitCommand",
    "FetchReply",
    "HaltCommand",
    "Heartbeat",
    "HeldCopy",
    "Hello",
    "LinkReport",
    "LinksReport",
    "LinksStored",
    "MeasureCommand",
    "MeasuredLink",
    "Message",
    "MetricSample",
    "ModelSpecRef",
    "PauseCommand",
    "Ping",
    "Pong",
    "ProbeCommand",
    "ProfileCommand",
    "ProfileFailed",
    "ProfileProgress",
    "ProfileResult",
    "ProfileStored",
    "ProtocolError",
    "RestorePart",
    "ResumeCommand",
    "RunCommand",
    "StageDone",
    "StageFailed",
    "StageSpec",
    "StartCommand",
    "StopCommand",
    "Stored",
    "Suspect",
    "WeightFetch",
    "WeightName",
    "Welcome",
    "command_name",
    "new_command_id",
    "parse_agent_message",
    "parse_command",
    "parse_server_message",
    "parse_weight_name",
    "resources_reader",
]
