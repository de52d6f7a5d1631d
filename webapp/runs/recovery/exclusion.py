"""A run of several pipelines that goes on without a lost device's pipelines (issues 26 and
27: "the round finishes without it and says so"): a split-learning client, or a PipeLearn
device. Nobody halts and nothing is re-planned: the survivors are told (``exclude``) to end
their stages of those pipelines (a helper's copy for the lost client, the server's copy for
the lost device) and to average each round among the members left; the lowest pipeline left
sends the server each round's average from then on. A lost split-learning helper or
PipeLearn server is not for this: the run recovers (split) or fails (PipeLearn)."""

from __future__ import annotations

from collections.abc import Sequence

from webapp.devices.commands import command_build, device_command_send
from webapp.runs.models import Run, RunDevice
from webapp.runs.services.control import control_event, finish_if_done
from webapp.runs.states import RunState

S = RunDevice.StageState
GOES_ON = (RunState.RUNNING, RunState.PAUSED)  # a run that trains goes on without a device


def _essential(run: Run) -> set[str]:
    """The devices a run cannot go on without: its helpers, or its server."""
    if run.kind == "split":
        return set((run.split or {}).get("helpers") or ())
    if run.kind == "pipelearn":
        return {str((run.pipelearn or {}).get("server"))}
    return set()


def pipelines_left(rows: Sequence[RunDevice]) -> set[int]:
    """The run's pipelines some stage of which still trains (not lost, not dropped)."""
    return {part["pipeline"] for rd in rows if rd.stage_state != S.LOST
            for part in rd.parts if not part.get("dropped")}


def go_on_without(run: Run, lost: Sequence[RunDevice], *, reason: str,
                  detected_by: str) -> Run | None:
    """With the run locked: go on without the ``lost`` devices' pipelines, when the run
    trains, none of them is essential, and some pipeline is left; None otherwise (the caller
    recovers or fails the run)."""
    if run.state not in GOES_ON or any(rd.device.uid in _essential(run) for rd in lost):
        return None
    gone = {part["pipeline"] for rd in lost for part in rd.parts}
    lost_ids = {rd.pk for rd in lost}
    others = [rd for rd in RunDevice.objects.select_for_update().filter(run=run)
              .select_related("device") if rd.pk not in lost_ids]
    left = pipelines_left(others) - gone
    if not gone or not left:
        return None
    for rd in lost:
        rd.stage_state, rd.stage = S.LOST, None
        rd.parts = [{**part, "state": S.LOST} for part in rd.parts]
        rd.save(update_fields=["stage_state", "stage", "parts"])
        control_event(run, "device_lost", device=rd.device.uid, detail={
            "reason": reason, "detected_by": detected_by, "pipelines": sorted(gone),
            "goes_on_without": True})
    uploader = min(left)
    for rd in others:
        if not rd.parts:
            continue
        for part in rd.parts:
            if part["pipeline"] in gone:  # counted out: its stage ends quietly
                part.update(state=S.DONE, dropped=True)
        if all(part["state"] == S.DONE for part in rd.parts):
            rd.stage_state = S.DONE
        rd.save(update_fields=["parts", "stage_state"])
        if rd.stage_state not in (S.LOST,):
            device_command_send(uid=rd.device.uid, command=command_build(
                "exclude", run=run.pk, generation=run.generation, pipelines=sorted(gone),
                uploader=uploader))
    # the others may all have ended already: then the run has
    return finish_if_done(run)
