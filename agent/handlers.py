"""The agent's command handlers: one per command of orchestrator.protocol's ``COMMANDS``,
dispatched by the command's class (docs/architecture.md, "Agent control protocol").

- ``profile``: profile a zoo model layer by layer (progress messages, then the profile);
- ``deploy`` / ``start``: build this device's stage of a run, run it (agent.launch);
- ``pause`` / ``resume`` / ``stop``: of a run's stages here (a stop also forgets the run's
  weights and revokes its peers' admission to the data plane);
- ``measure``: measure the links to the given peers over the data plane (bandwidth and
  latency), reported in one ``links`` message, so that planning sees real links; the peers
  are admitted to the data plane for the measurement only;
- ``halt``: stop a run's stages for a recovery, keeping their weights; the ack lists what
  this agent holds (checkpoints and replicas), and a ``deploy`` of the next generation says
  what to restore from where;
- ``probe``: does this agent still hold the run's stage (dead, restarted or healthy);
- ``emulate``: change the emulated ``--slowdown`` mid-run (a device heating up);
- ``exit``: fault injection: the process exits at once, as a crash would.

Every command is acknowledged; one the agent cannot carry out (malformed, a stage for
another device, a model it does not know, a run it holds no stage of) is refused with the
reason and changes nothing. Long work (profiling, measuring, training) runs on threads.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agent.connection import Connection
from agent.data import DataError, Dataset
from agent.deployments import Deployment, Deployments
from agent.executor import StageError
from agent.launch import Launcher, run_grant
from agent.profiler import profile_model, warm_times
from agent.reporting import Reporter
from agent.transport import DataPlane
from agent.warmtimes import WarmTimes
from agent.weightservice import WeightService
from agent.workers import spawn
from agent.zoo import build_model
from orchestrator.protocol import (
    COMMANDS,
    Ack,
    Command,
    DeployCommand,
    EmulateCommand,
    ExcludeCommand,
    ExitCommand,
    HaltCommand,
    LinksReport,
    MeasureCommand,
    MeasuredLink,
    ModelSpecRef,
    PauseCommand,
    ProbeCommand,
    ProfileCommand,
    ProfileFailed,
    ProfileProgress,
    ProfileResult,
    ProtocolError,
    ResumeCommand,
    RunCommand,
    StartCommand,
    StopCommand,
    command_name,
)

log = logging.getLogger("edgepipe.agent")

PROGRESS_EVERY_S = 0.5  # profiling progress goes to the server at most this often
BLOCKING = (DeployCommand.NAME, HaltCommand.NAME)  # carried out off the event loop
MEASURE_GRANT = ("measure",)  # what a link measurement's peers are admitted under
# a measurement's peers stay admitted this long after this agent measured its own links: they
# measure theirs to it meanwhile, one peer after another (up to 15 s each when one is slow)
MEASURE_GRACE_S = 120.0
MEASURE_ATTEMPTS = 2  # a link that timed out is measured once more, after the others


class CommandHandlers:
    def __init__(self, *, uid: str, threads: int | None, slowdown: float, plane: DataPlane,
                 connection: Connection, deployments: Deployments, weights: WeightService,
                 reporter: Reporter, warm: WarmTimes, dataset: Callable[[str], Dataset]
                 ) -> None:
        self.uid = uid
        self.threads = threads
        self.slowdown = slowdown  # the emulated slowdown now
        self.plane = plane
        self.connection = connection
        self.deployments = deployments
        self.weights = weights
        self.warm = warm
        self.dataset = dataset
        self.launcher = Launcher(uid=uid, threads=threads, plane=plane, connection=connection,
                                 deployments=deployments, weights=weights, warm=warm,
                                 reporter=reporter, dataset=dataset,
                                 slowdown=lambda: self.slowdown)
        self.table: dict[type[Command], Callable[[Any], Ack]] = {
            ProfileCommand: self.profile, DeployCommand: self.launcher.deploy,
            StartCommand: self.start, PauseCommand: self.pause, ResumeCommand: self.resume,
            StopCommand: self.stop, MeasureCommand: self.measure, HaltCommand: self.halt,
            ProbeCommand: self.probe, EmulateCommand: self.emulate, ExitCommand: self.exit,
            ExcludeCommand: self.exclude}

    def handle(self, raw: Any) -> Ack:
        """Read the command ``raw`` (its JSON) and carry it out (or start it); its ack."""
        ident, name = (raw.get("id"), raw.get("command")) if isinstance(raw, dict) else (None,
                                                                                          None)
        refusal = Ack(id=ident if isinstance(ident, str) and 0 < len(ident) <= 64 else None,
                      command=name[:64] if isinstance(name, str) and name else "unknown",
                      ok=False)
        try:
            name = command_name(raw)
            command = COMMANDS[name].from_json(raw)
        except ProtocolError as exc:
            log.warning("refused a malformed command: %s", exc)
            what = "" if exc.field == "command" else f"malformed {refusal.command}: "
            return _refused(refusal, f"{what}{exc}")
        refusal = Ack.to(command, ok=False)
        try:
            return self.table[type(command)](command)
        except (StageError, DataError, ValueError, KeyError, TypeError) as exc:
            log.warning("refused %s: %s", name, exc)
            return _refused(refusal, str(exc))

    @staticmethod
    def blocks(raw: Any) -> bool:
        return isinstance(raw, dict) and raw.get("command") in BLOCKING

    # ---- a run's stages

    def held(self, command: RunCommand | StartCommand) -> list[Deployment]:
        """The run's stages here, of the command's generation when it names one."""
        held = self.deployments.of_run(command.run)
        if not held:
            raise StageError(f"no stage of run {command.run} is deployed here")
        generation = command.generation
        if generation is not None and any(d.spec.generation != generation for d in held):
            raise StageError(f"run {command.run}'s stage here is of generation "
                             f"{held[0].spec.generation}, not {generation}")
        return held

    def start(self, command: StartCommand) -> Ack:
        return self.launcher.start(command, self.held(command))

    def pause(self, command: PauseCommand) -> Ack:
        for deployment in self.held(command):
            deployment.running.clear()
        return Ack.to(command)

    def resume(self, command: ResumeCommand) -> Ack:
        for deployment in self.held(command):
            deployment.running.set()
        return Ack.to(command)

    def exclude(self, command: ExcludeCommand) -> Ack:
        """The run goes on without some of its pipelines (a device of theirs was lost): this
        agent's stages of them end (quietly: the server counts them out), the others leave
        their members, and a helper's turns skip theirs."""
        gone = frozenset(command.pipelines)
        for deployment in self.held(command):
            if deployment.spec.pipeline in gone:
                deployment.end()
                self.deployments.drop_unstarted(deployment.key)
            else:
                deployment.executor.exclude(gone, uploader=command.uploader)
        for (run, _), turnstile in list(self.launcher.turnstiles.items()):
            if run == command.run:
                turnstile.drop(gone)
        return Ack.to(command)

    def stop(self, command: StopCommand) -> Ack:
        """End the run here (stopping twice is harmless); a stage not started goes at once,
        a running one when its thread ends."""
        for deployment in self.deployments.of_run(command.run):
            deployment.end()
            self.deployments.drop_unstarted(deployment.key)
        self.weights.forget(command.run)
        self.plane.revoke(run_grant(command.run))  # its peers may no longer reach this agent
        return Ack.to(command)

    def halt(self, command: HaltCommand) -> Ack:
        """Stop the run's stages for a recovery and wait for them; keep every weight held,
        drop what they received; report the weights."""
        ended = self.deployments.take_run(command.run)
        for deployment in ended:
            deployment.end()
            if deployment.thread is not None:
                deployment.thread.join(timeout=30)
        self.plane.discard(command.run)
        applied = min((d.executor.applied for d in ended), default=None)
        log.info("run %s halted for generation %s (at %s updates)", command.run,
                 command.generation, applied)
        return Ack.to(command, generation=command.generation,
                      holdings=self.weights.holdings(command.run), applied=applied)

    def probe(self, command: ProbeCommand) -> Ack:
        held = self.deployments.of_run(command.run)
        return Ack.to(command, holds=bool(held),
                      generation=held[0].spec.generation if held else None,
                      applied=held[0].executor.applied if held else None)

    # ---- the device

    def profile(self, command: ProfileCommand) -> Ack:
        data = self.dataset(command.dataset)
        model = build_model(command.model, input_shape=data.input_shape,
                            num_classes=data.num_classes)
        slowdown = self.slowdown

        def work() -> None:
            last = [-math.inf]

            def progress(done: int, total: int) -> None:
                # a step per layer, then one per timed sweep (hundreds for a small model):
                # the server hears of them at most every PROGRESS_EVERY_S, and of the last
                now = time.monotonic()
                if done < total and now - last[0] < PROGRESS_EVERY_S:
                    return
                last[0] = now
                self.connection.post(ProfileProgress(model=command.model, done=done,
                                                     total=total))

            try:
                profile = profile_model(model, batch_size=command.batch_size,
                                        reference=self.uid, dataset=command.dataset,
                                        slowdown=slowdown, progress=False, on_layer=progress)
            except (RuntimeError, ValueError) as exc:
                self.connection.post(ProfileFailed(model=command.model,
                                                   error=str(exc)[:4000] or "failed"))
                return
            self.warm.keep((command.model, command.dataset, command.batch_size),
                           warm_times(profile, slowdown=slowdown))
            self.connection.post(ProfileResult(
                model_spec=ModelSpecRef(model=command.model, dataset=command.dataset,
                                        batch_size=command.batch_size),
                profile=profile.to_json()))

        spawn(work, f"profile-{command.model}", threads=self.threads)
        return Ack.to(command)

    def emulate(self, command: EmulateCommand) -> Ack:
        """Change the emulated slowdown now (a device heating up, for tests and demos): the
        stages running here slow down from their next pass; profiles taken later see it."""
        self.slowdown = command.slowdown
        for deployment in self.deployments.all():
            deployment.executor.set_slowdown(command.slowdown)
        log.warning("now emulating a device %gx slower", command.slowdown)
        return Ack.to(command, slowdown=command.slowdown)

    def exit(self, command: ExitCommand) -> Ack:
        log.warning("told to exit by the server (fault injection): exiting now")
        logging.shutdown()
        os._exit(70)

    def measure(self, command: MeasureCommand) -> Ack:
        """Measure the links to the command's peers, admitted (instead of an earlier
        measurement's) until MEASURE_GRACE_S after this agent's own measurements: the peers
        measure their links to it meanwhile."""
        others = {uid: address for uid, address in command.peers.items() if uid != self.uid}
        self.plane.admit(MEASURE_GRANT, {uid: command.keys[uid] for uid in others})
        for uid, address in others.items():
            self.plane.connect(uid, address, command.keys[uid], admit=False)

        def work() -> None:
            links = []
            # a link that timed out is tried once more after the others: by then its peer has
            # had its own measure command and its own measurements are further along
            todo = sorted(others)
            for attempt in range(MEASURE_ATTEMPTS):
                missed = []
                for uid in todo:
                    try:
                        bandwidth, latency = self.plane.measure_link(uid)
                    except TimeoutError as exc:
                        last = attempt == MEASURE_ATTEMPTS - 1
                        log.warning("could not measure the link to %s%s: %s", uid,
                                    "" if last else " (trying again after the others)", exc)
                        missed.append(uid)
                        continue
                    links.append(MeasuredLink(peer=uid, bandwidth_bps=bandwidth,
                                              latency_s=min(60.0, latency)))
                    log.info("link to %s: %.1f MB/s, %.2f ms", uid, bandwidth / 1e6,
                             latency * 1e3)
                todo = missed
            self.connection.post(LinksReport(links=tuple(links)))
            self.plane.revoke(MEASURE_GRANT, after_s=MEASURE_GRACE_S)

        spawn(work, "measure", threads=self.threads)
        return Ack.to(command)


def _refused(ack: Ack, error: str) -> Ack:
    return replace(ack, ok=False, error=error[:4000])
