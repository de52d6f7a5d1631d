"""Instance builders and hypothesis strategies for planner tests."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from orchestrator.cost import CostModel, build_cost_model
from orchestrator.formats import Device, DeviceSet, Layer, LayerTimes, ModelProfile, Resource


def make_profile(times: list[tuple[float, float]], *, output_bytes: list[int] | None = None,
                 param_bytes: list[int] | None = None, activation_bytes: list[int] | None = None,
                 batch_size: int = 32) -> ModelProfile:
    n = len(times)
    out = output_bytes or [0] * n
    par = param_bytes or [0] * n
    act = activation_bytes or [0] * n
    layers = tuple(Layer(f"l{i}", "layer", f, b, out[i], par[i], act[i])
                   for i, (f, b) in enumerate(times))
    return ModelProfile(model="test", batch_size=batch_size, reference="ref", layers=layers)


def make_device(name: str, speed: float = 1.0, *, memory_bytes: int = 10**12,
                bandwidth_bps: float = 1e9, latency_s: float = 0.0,
                resources: tuple[Resource, ...] = (),
                layer_times: LayerTimes | None = None, overhead_s: float = 0.0,
                message_s: float = 0.0) -> Device:
    return Device(id=name, speed=speed, memory_bytes=memory_bytes, bandwidth_bps=bandwidth_bps,
                  latency_s=latency_s, resources=resources, layer_times=layer_times,
                  overhead_s=overhead_s, message_s=message_s)


def random_instance(rng: random.Random, *, layers: int, devices: int,
                    measured: bool = False, memory_pressure: bool = True) -> CostModel:
    """A random heterogeneous testbed: speeds spanning 100x, links from Wi-Fi to Ethernet,
    optional measured layer times, and memory that sometimes binds."""
    times = [(rng.uniform(0.0, 1.0), rng.uniform(0.0, 2.0)) for _ in range(layers)]
    profile = make_profile(
        times,
        output_bytes=[rng.randint(0, 4_000_000) for _ in range(layers)],
        param_bytes=[rng.randint(0, 2_000_000) for _ in range(layers)],
        activation_bytes=[rng.randint(0, 2_000_000) for _ in range(layers)],
    )
    devs = []
    for i in range(devices):
        speed = rng.choice([0.05, 0.2, 0.5, 1.0, 2.0, 5.0])
        memory = (rng.randint(4_000_000, 60_000_000) if memory_pressure else 10**12)
        layer_times = None
        if measured and rng.random() < 0.5:
            layer_times = LayerTimes(
                forward_s=tuple(f / speed * rng.uniform(0.5, 2.0) for f, _ in times),
                backward_s=tuple(b / speed * rng.uniform(0.5, 2.0) for _, b in times))
        devs.append(make_device(f"d{i}", speed, memory_bytes=memory,
                                bandwidth_bps=rng.choice([1e6, 1e7, 1e8, 1e9]),
                                latency_s=rng.choice([0.0, 0.001, 0.01]),
                                layer_times=layer_times,
                                overhead_s=rng.choice([0.0, 0.0, 0.05, 0.5]) if measured
                                else 0.0,
                                message_s=rng.choice([0.0, 0.0, 0.02, 0.3]) if measured
                                else 0.0))
    return build_cost_model(profile, DeviceSet(devices=tuple(devs)))


def instances(*, max_layers: int, max_devices: int, measured: bool = True,
              memory_pressure: bool = True) -> st.SearchStrategy[CostModel]:
    return st.builds(
        lambda seed, layers, devices: random_instance(
            random.Random(seed), layers=layers, devices=devices, measured=measured,
            memory_pressure=memory_pressure),
        st.integers(0, 2**32 - 1), st.integers(1, max_layers), st.integers(1, max_devices))
