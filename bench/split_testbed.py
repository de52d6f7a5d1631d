"""The testbed bench/split_runtime.py trains on: six clients and two helpers this machine
emulates (slower compute, shaped links, memory), the study's instance built from what the
executors will emulate, and the schedule's order replayed with the instance's unrounded
times. See bench/split_runtime.py's docstring for the reasons behind each figure."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from agent.data import Dataset, load_dataset
from agent.profiler import measure_message_cost, measure_overhead, profile_model
from agent.transport import Shaping
from agent.zoo import build_model
from orchestrator.cost import build_cost_model
from orchestrator.formats import Device, DeviceSet, LayerTimes, ModelProfile
from orchestrator.sl import runtime as sl
from orchestrator.sl.formats import Instance, Schedule

MODEL, DATASET, BATCH_SIZE = "vgg5", "synthetic-cifar", 8
CUTS = sl.SplitCuts(sigma1=0, sigma2=3)  # part-1 conv1; part-2 conv2, conv3, fc1; part-3 fc2
MB = 1_000_000


@dataclass(frozen=True)
class Emulated:
    """A device this machine emulates: ``slowdown`` times slower, its line shaped to
    ``bandwidth_mbps`` (10^6 bytes a second; None: unshaped) and ``latency_ms``."""

    id: str
    slowdown: float
    memory_mb: int
    bandwidth_mbps: float | None = None
    latency_ms: float = 0.0

    @property
    def shaping(self) -> Shaping:
        return Shaping(bandwidth_bps=None if self.bandwidth_mbps is None
                       else self.bandwidth_mbps * MB, latency_s=self.latency_ms / 1000)


CLIENTS = (Emulated("c0", 12.0, 2000, 40.0, 2.0), Emulated("c1", 16.0, 2000, 20.0, 4.0),
           Emulated("c2", 20.0, 2000, 30.0, 3.0), Emulated("c3", 24.0, 2000, 15.0, 5.0),
           Emulated("c4", 28.0, 2000, 25.0, 2.0), Emulated("c5", 18.0, 2000, 12.0, 6.0))
# a helper's memory holds three clients' part-2 (14 MB each by the cost model), the second's
# four: the assignment is constrained, as in the paper
HELPERS = (Emulated("h0", 6.0, 45), Emulated("h1", 8.0, 60))
HELPER_LINE_BPS = 1e10  # a helper's own line: the client's end of a link is the narrow one


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the testbed


@dataclass(frozen=True)
class Testbed:
    profile: ModelProfile  # this machine's, one torch thread
    warm: LayerTimes  # what the executors pace by
    devices: DeviceSet
    clients: tuple[Emulated, ...]
    helpers: tuple[Emulated, ...]
    instance: Instance
    data: Dataset

    @property
    def client_ids(self) -> list[str]:
        return [c.id for c in self.clients]

    @property
    def helper_ids(self) -> list[str]:
        return [h.id for h in self.helpers]


def emulated_device(dev: Emulated, *, warm: LayerTimes, overhead_s: float, message_s: float,
                    bandwidth_bps: float) -> Device:
    """The device the executors emulate: this machine's warm times ``slowdown`` times over,
    the executor's fixed costs (not slowed down: they are this machine's Python)."""
    return Device(id=dev.id, speed=1.0 / dev.slowdown, memory_bytes=dev.memory_mb * MB,
                  bandwidth_bps=bandwidth_bps, latency_s=dev.latency_ms / 1000,
                  layer_times=LayerTimes(
                      forward_s=tuple(t * dev.slowdown for t in warm.forward_s),
                      backward_s=tuple(t * dev.slowdown for t in warm.backward_s)),
                  overhead_s=overhead_s, message_s=message_s)


def build_testbed(*, clients: int, slot_ms: float) -> Testbed:
    """Profile this machine once and build the study the executors will emulate."""
    data = load_dataset(DATASET)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each stage's thread runs
    try:
        say(f"profiling {MODEL} on {DATASET}, batches of {BATCH_SIZE}, one torch thread")
        model = build_model(MODEL, input_shape=data.input_shape, num_classes=data.num_classes)
        profile = profile_model(model, batch_size=BATCH_SIZE, reference="this machine",
                                dataset=DATASET, progress=False)
        base = min(c.slowdown for c in CLIENTS[:clients])
        overhead_s = measure_overhead(slowdown=base)
        message_s = measure_message_cost()
    finally:
        torch.set_num_threads(threads)
    warm = LayerTimes(forward_s=tuple(la.forward_s for la in profile.layers),
                      backward_s=tuple(la.backward_s for la in profile.layers))
    say(f"warm forward {sum(warm.forward_s) * 1e3:.2f} ms, backward "
        f"{sum(warm.backward_s) * 1e3:.2f} ms; fixed costs {overhead_s * 1e3:.2f} ms a "
        f"micro-batch, {message_s * 1e3:.2f} ms a message")
    chosen = CLIENTS[:clients]
    devices = DeviceSet(devices=tuple(
        emulated_device(d, warm=warm, overhead_s=overhead_s, message_s=message_s,
                        bandwidth_bps=HELPER_LINE_BPS if d.bandwidth_mbps is None
                        else d.bandwidth_mbps * MB)
        for d in (*chosen, *HELPERS)))
    instance = sl.instance_from_measurements(
        profile=profile, devices=devices, clients=[c.id for c in chosen],
        helpers=[h.id for h in HELPERS], cuts=CUTS, slot_ms=slot_ms,
        name=f"{MODEL}-{DATASET}-K{clients}-H{len(HELPERS)}-this-machine")
    return Testbed(profile=profile, warm=warm, devices=devices, clients=chosen,
                   helpers=HELPERS, instance=instance, data=data)


def replayed_s(bed: Testbed, schedule: Schedule) -> float:
    """The makespan of ``schedule``'s order on each helper with the instance's times before
    rounding (seconds), every task whole and started as soon as its turn and input come."""
    cm = build_cost_model(bed.profile, bed.devices)
    ids, hids = bed.client_ids, bed.helper_ids
    times = [sl.batch_times_s(cm, client=c, helper=hids[schedule.assignment[j]], cuts=CUTS)
             for j, c in enumerate(ids)]
    completion = [0.0] * len(ids)
    for i in range(len(hids)):
        free = 0.0
        forward_end: dict[int, float] = {}
        for task in sl.helper_task_order(instance=bed.instance, schedule=schedule, helper=i):
            t = times[task.client]
            if task.kind == "forward":
                free = max(free, t["r"]) + t["p"]
                forward_end[task.client] = free
            else:
                free = max(free, forward_end[task.client] + t["l"] + t["lp"]) + t["pp"]
                completion[task.client] = free + t["rp"]
    return max(completion)


def preempted(bed: Testbed, schedule: Schedule) -> int:
    """How many tasks the schedule cuts in more than one run of slots."""
    return sum(len(task.segments) > 1 for i in range(len(bed.helpers))
               for task in sl.helper_task_order(instance=bed.instance, schedule=schedule,
                                                helper=i))
