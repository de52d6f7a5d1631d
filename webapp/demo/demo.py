"""The demo (``manage.py demo``, USER_JOURNEYS.md journey 1): the local testbed, a model
profiled on it, every planner's plan compared, one plan trained, and the faults asked for
injected on the way."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.formats import synchronous
from orchestrator.schedule import MAX_MICROBATCHES
from webapp.demo.client import DemoError
from webapp.demo.scenario import (
    DEFAULT_AGENTS,
    DEFAULT_ALGORITHMS,
    FINAL_STATES,
    DemoAgent,
    LocalTestbed,
    chosen_plan,
)
from webapp.demo.triggers import When
from webapp.runs.models import AGGREGATE_EVERY_MAX, LR_MAX, MOMENTUM_MAX

HEADLESS_BATCHES = 100  # a headless demo's run, without --batches
# the learning rate of an asynchronous 1F1B demo run with vertical sync (the run's default)
# and without --lr. Under vertical sync every stage forwards on stage 0's weights, stale by
# the pipeline's lag less one (4 updates on the demo's FTPipeHD plan, in flight 5, 3, 1); at
# the runs' default, 0.1, VGG-5 never learned there (its loss rose to 5, then stayed at
# ln 10), at 0.02 it reached 87% in 30 s (docs/benchmarks.md, "The demo's learning rate")
ASYNC_LR = 0.02


@dataclass(frozen=True)
class DemoOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "vgg5"
    dataset: str = "synthetic-cifar"
    batch_size: int = 32
    microbatches: int = 8
    batches: int | None = None  # None: 100 headless, else the most a run may train
    schedule: str = "1f1b"
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    plan: str = "ftpipehd"
    agents: tuple[DemoAgent, ...] = DEFAULT_AGENTS
    headless: bool = False
    run_timeout_s: float = 900.0
    repartition_every: int | None = None  # batches between dynamic re-partitions (0: off)
    chain_every: int | None = None  # batches between chain replicas (None: the run's default)
    global_every: int | None = None  # batches between global replicas (None: the default)
    kill_agent_at: float | None = None  # seconds into the run: SIGKILL agents (a fault)
    kill_agent_at_batch: int | None = None  # or once the run has trained this many batches
    kill_agents: tuple[str, ...] = ()  # which (default: the device of the plan's middle stage)
    pause_at: float | None = None  # seconds into the run: pause it (through the API)
    pause_at_batch: int | None = None  # or once the run has trained this many batches
    pause_for: float = 2.0  # seconds it stays paused, then it is resumed
    slow_agent_at: float | None = None  # seconds into the run: slow an agent down (heat)
    slow_agent: str = ""  # which (default: the device of the plan's middle stage)
    slow_to: float = 20.0  # how many times slower than this machine
    # SGD learning rate of the run (None: ASYNC_LR under 1F1B with vertical sync, else the
    # run's default, 0.1)
    lr: float | None = None
    momentum: float | None = None  # SGD momentum of the run (None: the run's default, 0)
    vertical_sync: bool | None = None  # 1F1B's vertical sync (None: the run's default, on)
    aggregate_every: int | None = None  # 1F1B's weight aggregation (None: the default, 0: off)

    def run_lr(self) -> float | None:
        """--lr, else ASYNC_LR under the asynchronous 1F1B with vertical sync, else the run's
        default."""
        if self.lr is not None or synchronous(self.schedule) or self.vertical_sync is False:
            return self.lr
        return ASYNC_LR

    def batches_to_train(self) -> int:
        """--batches, else 100 headless, else as many as a run may train
        (orchestrator.schedule.MAX_MICROBATCHES): until Ctrl-C, for all a user watches."""
        if self.batches is not None:
            return self.batches
        return HEADLESS_BATCHES if self.headless else MAX_MICROBATCHES // self.microbatches

    def kill_when(self) -> When | None:
        """When the agents are killed. At the batch the run is paused at, once it is paused:
        the pause takes effect a moment after it is asked for, and the device is to be lost
        while the run is paused."""
        if self.kill_agent_at is not None:
            return When(seconds=self.kill_agent_at)
        if self.kill_agent_at_batch is not None:
            return When(batches=self.kill_agent_at_batch,
                        paused=self.kill_agent_at_batch == self.pause_at_batch)
        return None

    def pause_when(self) -> When | None:
        """When the run is paused (for pause_for seconds)."""
        if self.pause_at is not None:
            return When(seconds=self.pause_at)
        if self.pause_at_batch is not None:
            return When(batches=self.pause_at_batch)
        return None


def stop_run(testbed: LocalTestbed, run_id: int, say: Callable[[str], None]) -> None:
    """Ctrl-C: the run is stopped (cancelled) before its agents are, so that it does not read
    "failed: every device of the run was lost" when the demo starts again."""
    try:
        run = testbed.api.get(f"/api/runs/{run_id}/")
        if run["state"] not in FINAL_STATES:
            testbed.api.post(f"/api/runs/{run_id}/stop/")
            say(f"run {run_id} stopped")
    except (DemoError, OSError) as exc:
        say(f"could not stop run {run_id}: {exc}")


def timed(say: Callable[[str], None]) -> Callable[[str], None]:
    """Each line with the seconds since the demo began: where its start-up goes shows."""
    began = time.monotonic()
    return lambda line: say(f"[{time.monotonic() - began:5.1f} s] {line}")


def _check_fault_times(o: DemoOptions) -> None:
    """A fault comes at SECONDS or after N batches, not both, and N is a batch the run trains
    (so --microbatches and --batches are checked first)."""
    for option, seconds, batch in (("--kill-agent-at", o.kill_agent_at, o.kill_agent_at_batch),
                                   ("--pause-at", o.pause_at, o.pause_at_batch)):
        if seconds is not None and batch is not None:
            raise DemoError(f"{option} SECONDS and {option}-batch N: give one of them, not both")
        if batch is not None and not 1 <= batch <= o.batches_to_train():
            raise DemoError(f"{option}-batch must be from 1 to {o.batches_to_train():,} (the "
                            f"batches the run trains), got {batch}")
    if o.kill_agents and o.kill_when() is None:
        raise DemoError("--kill-agent: say when with --kill-agent-at SECONDS or "
                        "--kill-agent-at-batch N")


def run_demo(options: DemoOptions, *, say: Callable[[str], None] = print
             ) -> dict[str, Any] | None:
    """The demo: the testbed, a model profiled on it, every planner's plan compared, one plan
    trained. Headless, it returns the run's summary; otherwise it runs until interrupted."""
    o = options
    for name in o.kill_agents:
        if name not in {a.name for a in o.agents}:
            raise DemoError(f"--kill-agent: no agent named {name!r}; the agents: "
                            f"{', '.join(a.name for a in o.agents)}")
    if o.slow_agent and o.slow_agent not in {a.name for a in o.agents}:
        raise DemoError(f"--slow-agent: no agent named {o.slow_agent!r}; the agents: "
                        f"{', '.join(a.name for a in o.agents)}")
    if o.slow_agent and o.slow_agent_at is None:
        raise DemoError("--slow-agent: say when with --slow-agent-at SECONDS")
    if not 1 <= o.microbatches <= 1024:
        raise DemoError(f"--microbatches must be from 1 to 1024, got {o.microbatches}")
    if o.batches is not None and o.batches < 1:
        raise DemoError(f"--batches must be at least 1, got {o.batches}")
    if o.batches_to_train() * o.microbatches > MAX_MICROBATCHES:
        raise DemoError(f"--batches: {o.batches_to_train():,} batches of {o.microbatches} "
                        f"micro-batches make {o.batches_to_train() * o.microbatches:,}; a run "
                        f"trains at most {MAX_MICROBATCHES:,}")
    _check_fault_times(o)
    if not 1 <= o.slow_to <= 1000:
        raise DemoError(f"--slow-to must be from 1 to 1000, got {o.slow_to:g}")
    if o.lr is not None and not 0 < o.lr <= LR_MAX:
        raise DemoError(f"--lr must be above 0 and at most {LR_MAX:g}, got {o.lr:g}")
    if o.momentum is not None and not 0 <= o.momentum <= MOMENTUM_MAX:
        raise DemoError(f"--momentum must be from 0 to {MOMENTUM_MAX}, got {o.momentum:g}")
    if o.aggregate_every is not None and not 0 <= o.aggregate_every <= AGGREGATE_EVERY_MAX:
        raise DemoError(f"--aggregate-every must be from 0 to {AGGREGATE_EVERY_MAX}, got "
                        f"{o.aggregate_every}")
    if o.aggregate_every and synchronous(o.schedule):
        raise DemoError(f"--aggregate-every is for --schedule 1f1b (asynchronous), not "
                        f"{o.schedule}")
    say = timed(say)
    with LocalTestbed(agents=o.agents, host=o.host, port=o.port, say=say) as testbed:
        links = testbed.measure_links()
        say(f"{len(testbed.devices)} devices online, {len(links)} links measured; profiling "
            f"{o.model} on {o.dataset}")
        spec = testbed.model_spec(model=o.model, dataset=o.dataset, batch_size=o.batch_size)
        # the plan asked for is planned too (--plan duanwu with the default planners)
        algorithms = (o.algorithms if o.plan == "best" or o.plan in o.algorithms
                      else (*o.algorithms, o.plan))
        say(f"planning with {', '.join(algorithms)}")
        compared = testbed.plan(
            spec, devices=testbed.devices, algorithms=algorithms, schedule=o.schedule,
            name=f"demo: {o.model} on {o.dataset} over {len(testbed.devices)} devices",
            microbatches=o.microbatches, batches=o.batches_to_train(),
            repartition_every=o.repartition_every, lr=o.run_lr(), momentum=o.momentum,
            vertical_sync=o.vertical_sync, aggregate_every=o.aggregate_every,
            chain_every=o.chain_every, global_every=o.global_every)
        say(f"  {compared['reason']}")
        row = chosen_plan(compared, o.plan)
        say(f"starting the {row['algorithm']} plan ({row['stages']} stages, predicted "
            f"{row['throughput_sps']:.4g} samples/s)")
        testbed.start(compared["run"], row["plan"])
        say(f"training: open {testbed.url}/runs/{compared['run']}/ to watch it live")
        kill_when, pause_when = o.kill_when(), o.pause_when()
        if kill_when is not None:
            victims = ([testbed.agent_named(name) for name in o.kill_agents] if o.kill_agents
                       else [testbed.agent_of_stage(compared["run"], row["plan"])])
            say(f"fault injection: {', '.join(v.name for v in victims)} will be killed "
                f"{kill_when.describe()}")
            testbed.kill_agent_at(compared["run"], victims, kill_when)
        if pause_when is not None:
            say(f"the run will be paused {pause_when.describe('it')}, for {o.pause_for:g} s")
            testbed.pause_at(compared["run"], pause_when, o.pause_for)
        if o.slow_agent_at is not None:
            slowed = (testbed.agent_named(o.slow_agent) if o.slow_agent
                      else testbed.agent_of_stage(compared["run"], row["plan"]))
            say(f"{slowed.name} will slow down to {o.slow_to:g}x {o.slow_agent_at:g} s into the "
                "run (the dynamic re-partition should move layers away from it)")
            testbed.slow_agent_at(compared["run"], slowed, o.slow_agent_at, o.slow_to)
        if o.headless:
            return testbed.finish(compared["run"], timeout_s=o.run_timeout_s)
        say("Ctrl-C stops the demo" if o.batches is not None else
            f"it trains {o.batches_to_train():,} batches, or until Ctrl-C stops the demo "
            "(--batches N: N batches)")
        try:
            while True:
                testbed.check_children()
                time.sleep(1.0)
        except KeyboardInterrupt:
            stop_run(testbed, compared["run"], say)
            raise
