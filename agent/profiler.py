"""Layer-by-layer profiling of a zoo model on this device: the model profile of
docs/architecture.md.

For each cuttable layer, on a micro-batch of ``batch_size`` samples of the model's input shape:
the output's bytes, the parameters' bytes, and the activation bytes the layer keeps for its
backward pass, counted exactly as the tensors autograd saves
(``torch.autograd.graph.saved_tensors_hooks``), each storage once and the layer's own
parameters not at all (the cost model counts them as P); and its forward and backward time.

Times are taken as a stage runs the layers: in sweeps of the whole model, every layer's forward
in order, then every layer's backward in reverse, each timed on its own (after warm-up sweeps,
the median over at least ``repeats`` sweeps and ``min_time_s`` of sweeping). Timing each layer
alone, over and over on the same tensors, finds it in a warm cache and measures it faster than
a stage runs it. The backward includes the layer's SGD update, as the shared
testbed profiles count it, less the fixed cost of one optimizer call, which a stage pays once
per micro-batch, not once per layer, and which :func:`measure_overhead` counts in the device's
``overhead_s``. The sweeps run back to back, so the times are this machine's warm ones (a stage
that waited for its input runs colder: :func:`measure_overhead` counts that penalty once per
pass, where it is paid). ``slowdown`` scales the times, so an agent emulating a slower device
reports the device it emulates, whose passes the executor paces to those scaled warm times
(agent/emulation.py).

The layers are timed in the memory format the whole model runs faster in here
(agent.layout: channels last for some convolutional models), as a stage of them would run;
the profile's ``source`` says when that is channels last.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from agent.layout import faster_format, to_format
from agent.optim import SGD
from agent.zoo import ZooModel
from orchestrator.formats import Layer, LayerTimes, ModelProfile


def _saved_bytes(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    seen: set[tuple[int, int]] = {(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes())
                                  for p in layer.parameters()}
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    return out, total


def _median_s(run: Callable[[], object], *, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def optimizer_call_s(*, warmup: int = 20, repeats: int = 101) -> float:
    """The fixed cost of one SGD step call, measured on a one-element parameter."""
    param, grads = torch.zeros(1), [torch.zeros(1)]
    optimizer = SGD([param], lr=1e-6)
    return _median_s(lambda: optimizer.step(grads), warmup=warmup, repeats=repeats)


MAX_SWEEPS = 2000


def timed_sweeps(warm_up_s: list[float], *, repeats: int, min_time_s: float) -> int:
    """How many sweeps ``min_time_s`` takes, by the fastest warm-up sweep, at least
    ``repeats`` (at most MAX_SWEEPS). The fastest, not the mean: the first torch work of a
    process pays autograd's lazy set-up, many times a warm sweep, and the mean counted far too
    few sweeps for ``min_time_s``."""
    per_sweep = min(warm_up_s, default=0.0)
    if per_sweep <= 0:
        return repeats
    return min(MAX_SWEEPS, max(repeats, int(min_time_s / per_sweep) + 1))


def _sweep(modules: list[nn.Module], optimizers: list[SGD | None],
           x: torch.Tensor, grad: torch.Tensor) -> tuple[list[float], list[float]]:
    """One forward and backward pass through every layer: each layer's forward and backward
    (with its update) seconds, as measured here."""
    inputs, outputs, forward = [], [], []
    h = x
    for i, module in enumerate(modules):
        inp = h.detach().requires_grad_(i > 0)
        start = time.perf_counter()
        out = module(inp)
        forward.append(time.perf_counter() - start)
        inputs.append(inp)
        outputs.append(out)
        h = out
    backward = [0.0] * len(modules)
    upstream = grad
    for i in reversed(range(len(modules))):
        params = [p for p in modules[i].parameters() if p.requires_grad]
        wrt = ([inputs[i]] if i > 0 else []) + params
        start = time.perf_counter()
        grads = torch.autograd.grad(outputs[i], wrt, grad_outputs=upstream, allow_unused=True)
        optimizer = optimizers[i]
        if optimizer is not None:
            optimizer.step([torch.zeros_like(p) if g is None else g
                            for p, g in zip(params, grads[len(wrt) - len(params):], strict=True)])
        backward[i] = time.perf_counter() - start
        if i > 0:
            upstream = grads[0]
    return forward, backward


def profile_model(model: ZooModel, *, batch_size: int, reference: str, dataset: str | None = None,
                  warmup: int = 2, repeats: int = 5, min_time_s: float = 0.25,
                  slowdown: float = 1.0, seed: int = 0, progress: bool = True,
                  on_layer: Callable[[int, int], None] | None = None) -> ModelProfile:
    """Profile every layer of ``model``. ``on_layer(done, total)`` reports progress in steps:
    one per layer sized, then one per timed sweep (``total`` grows once, when the warm-up
    shows how many sweeps ``min_time_s`` takes). ``model``'s layers are left in the memory
    format they were timed in."""
    if batch_size < 1 or repeats < 1 or warmup < 0 or min_time_s < 0:
        raise ValueError(f"need batch_size >= 1, repeats >= 1, warmup >= 0, min_time_s >= 0; "
                         f"got {batch_size}, {repeats}, {warmup}, {min_time_s}")
    if slowdown < 1:
        raise ValueError(f"slowdown must be at least 1, got {slowdown}")
    report = on_layer or (lambda done, total: None)
    generator = torch.Generator().manual_seed(seed)
    step_call_s = optimizer_call_s()
    x0 = torch.randn((batch_size, *model.input_shape), generator=generator)
    n = model.num_layers
    modules: list[nn.Module] = []
    sizes: list[tuple[int, int, int]] = []  # output, parameter and activation bytes
    bar = tqdm(total=n + repeats, desc=f"profiling {model.name}", unit="step",
               disable=not progress)
    x = x0
    for i, zoo_layer in enumerate(model.layers):
        module = zoo_layer.module.train()
        out, activation_bytes = _saved_bytes(module, x.detach().requires_grad_(i > 0))
        modules.append(module)
        sizes.append((out.numel() * out.element_size(),
                      sum(p.numel() * p.element_size() for p in module.parameters()),
                      activation_bytes))
        x = out.detach()
        bar.update()
        report(i + 1, n + repeats)
    grad = torch.randn(x.shape, generator=generator)
    # the layout the executor would run the whole model in here (a stage times its own)
    layout = faster_format(nn.Sequential(*modules), x0)
    for module in modules:
        to_format(module, layout)
    optimizers = [SGD(params, lr=1e-6) if params else None
                  for params in ([p for p in m.parameters() if p.requires_grad] for m in modules)]
    warm_up_s = []
    for _ in range(warmup):
        began = time.perf_counter()
        _sweep(modules, optimizers, x0, grad)
        warm_up_s.append(time.perf_counter() - began)
    sweeps = timed_sweeps(warm_up_s, repeats=repeats, min_time_s=min_time_s)
    bar.total = n + sweeps
    samples: list[tuple[list[float], list[float]]] = []
    for k in range(sweeps):
        samples.append(_sweep(modules, optimizers, x0, grad))
        bar.update()
        report(n + k + 1, n + sweeps)
    bar.close()
    layers = []
    for i, zoo_layer in enumerate(model.layers):
        forward_s = statistics.median(f[i] for f, _ in samples)
        backward_s = statistics.median(b[i] for _, b in samples)
        if optimizers[i] is not None:
            backward_s = max(0.0, backward_s - step_call_s)
        output_bytes, param_bytes, activation_bytes = sizes[i]
        layers.append(Layer(
            name=zoo_layer.name, kind=zoo_layer.kind, forward_s=forward_s * slowdown,
            backward_s=backward_s * slowdown, output_bytes=output_bytes,
            param_bytes=param_bytes, activation_bytes=activation_bytes))
    return ModelProfile(model=model.name, batch_size=batch_size, reference=reference,
                        layers=tuple(layers), dataset=dataset,
                        source=f"edgepipe agent profiler, torch {torch.__version__}"
                        + (", channels last" if layout == "channels_last" else ""))


def warm_times(profile: ModelProfile, *, slowdown: float) -> LayerTimes:
    """This machine's warm per-layer times behind a profile taken with ``slowdown``: what the
    executor paces an emulated device's passes by."""
    return LayerTimes(forward_s=tuple(la.forward_s / slowdown for la in profile.layers),
                      backward_s=tuple(la.backward_s / slowdown for la in profile.layers))


def measure_overhead(*, slowdown: float = 1.0, microbatches: int = 200,
                     pause_s: float = 0.002) -> float:
    """The fixed time a micro-batch costs a stage on this device beyond its layers' compute
    (the executor's own work: loss, optimizer call, events; and resuming after a wait), as the
    cost model's ``overhead_s``.

    It runs the real executor on a one-layer stage over the digits and subtracts the layer's
    profiled compute; like the profile, it counts the emulated slowdown. A pipeline stage starts
    each forward and backward after waiting for a neighbour, and work right after a pause runs
    slower than back to back (the caches are refilled), so the probe pauses ``pause_s`` before
    each forward and backward (not counted) and the overhead includes that penalty. An
    emulated slower device (``slowdown`` > 1) does not pause: its passes are paced to its warm
    times, and the penalty of a cold start is paid inside the emulated time (counted again in
    the overhead, it made the MLP train faster than predicted). The measurements behind both:
    docs/benchmarks.md, "Measurements behind choices in the agent".
    """
    from agent.data import digits
    from agent.executor import Clock, StageExecutor
    from agent.transport import DataPlane
    from agent.zoo import ZooLayer, ZooModel
    from orchestrator.protocol import StageSpec

    layer = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    model = ZooModel(name="overhead-probe", input_shape=(1, 8, 8), num_classes=10,
                     layers=(ZooLayer("probe", "dense", layer),))
    batch = 8
    profile = profile_model(model, batch_size=batch, reference="self", repeats=7,
                            slowdown=slowdown, progress=False)
    layer_s = sum(la.forward_s + la.backward_s for la in profile.layers)
    spec = StageSpec(run=0, device="self", stage=0, layers=(0, 0), model="overhead-probe",
                     dataset="digits", batch_size=batch, schedule="1f1b",
                     stage_devices=(("self",),), stage_times_s=((1.0,),),
                     microbatches=microbatches)
    plane = DataPlane(bind="tcp://127.0.0.1:0")
    try:
        executor = StageExecutor(spec, module=layer, plane=plane, clock=Clock(time.time()),
                                 dataset=digits(), slowdown=slowdown,
                                 warm=warm_times(profile, slowdown=slowdown))
        paused = [0.0]
        pause_s = pause_s if slowdown == 1 else 0.0

        def after_a_pause(handler: Callable[[Any], None]) -> Callable[[Any], None]:
            def run(action: Any) -> None:
                begun = time.perf_counter()
                time.sleep(pause_s)
                paused[0] += time.perf_counter() - begun
                handler(action)
            return run

        for name in ("forward", "backward"):  # the executor dispatches by method name
            setattr(executor, name, after_a_pause(getattr(executor, name)))
        started = time.perf_counter()
        try:
            executor.run()
        finally:  # the wrappers hold the executor's bound methods: no cycle left to freeze
            del executor.forward, executor.backward
        per_microbatch = (time.perf_counter() - started - paused[0]) / microbatches
    finally:
        plane.close()
    return max(0.0, per_microbatch - layer_s)


def measure_message_cost(*, messages: int = 200, pause_s: float = 0.002,
                         size_bytes: int = 4096) -> float:
    """The time a stage on this device spends on each message it sends, beyond the link's
    transfer, as the cost model's ``message_s``: encoding the tensor and handing it to ZeroMQ.

    It sends ``messages`` small tensors to this device's own inbox over a real data plane, as
    the executor does, each after a pause (a stage sends right after a pass, never back to
    back), and takes each back. Not counted: taking a message from the inbox (some
    microseconds, which the overhead counts) and what the data plane's threads do meanwhile,
    which the link's measured latency covers. A stage's runs measure it again
    (agent.runtime: ``stage_done`` reports ``message_s``)."""
    from agent.transport import DataPlane
    from agent.wire import encode_message

    plane = DataPlane(bind="tcp://127.0.0.1:0", identity="self")
    tensor = torch.zeros(size_bytes // 4, dtype=torch.float32)
    spent = 0.0
    try:
        plane.connect("self", plane.address, plane.public_key)
        for m in range(messages + 1):
            time.sleep(pause_s)
            begun = time.perf_counter()
            header, frames = encode_message(run=0, kind="activation", microbatch=m, version=0,
                                            tensor=tensor, name="calibrate",
                                            sent_at=time.time())
            plane.send("self", frames, header=header)
            if m:  # the first opened the socket
                spent += time.perf_counter() - begun
            plane.receive(0, "activation", m, name="calibrate", timeout_s=10.0)
    finally:
        plane.close()
    return spent / messages
