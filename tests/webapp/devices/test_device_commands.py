"""Commands the server sends are orchestrator.protocol's typed ones, checked as the agent will
read them before they are sent."""

import pytest

from orchestrator.protocol import DeployCommand, ProtocolError, StageSpec, StopCommand
from webapp.devices.commands import command_build

SPEC = StageSpec(run=7, device="a", stage=0, layers=(0, 1), model="mlp", dataset="digits",
                 batch_size=8, schedule="1f1b", stage_devices=(("a",),),
                 stage_times_s=((1.0,),), microbatches=4)


def test_command_build_gives_the_typed_command_with_a_fresh_id() -> None:
    deploy = command_build("deploy", run=7, spec=SPEC.to_json(), peers={})
    assert isinstance(deploy, DeployCommand) and deploy.spec == SPEC
    stop, again = command_build("stop", run=7), command_build("stop", run=7)
    assert isinstance(stop, StopCommand) and stop.id != again.id
    assert stop.to_json() == {"type": "command", "id": stop.id, "command": "stop", "run": 7}


@pytest.mark.parametrize(("name", "fields", "field"), [
    ("teleport", {}, "command"),
    ("emulate", {"slowdown": 5000}, "slowdown"),
    ("deploy", {"run": 8, "spec": SPEC.to_json()}, "spec.run"),
    ("stop", {"run": 7, "colour": "red"}, "colour"),
])
def test_command_build_refuses_what_the_agent_could_not_read(name, fields, field) -> None:
    with pytest.raises(ProtocolError) as refused:
        command_build(name, **fields)
    assert refused.value.field == field
