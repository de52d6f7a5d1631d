"""Layer-by-layer profiling of a zoo model on this device: the model profile of
docs/architecture.md.

For each cuttable layer, on a micro-batch of ``batch_size`` samples of the model's input shape:
forward and backward time (after warm-up runs, the median of repeats; the backward includes the
layer's SGD update, as the shared testbed profiles count it, less the fixed cost of one
optimizer call, which a stage pays once per micro-batch, not once per layer, and which
:func:`measure_overhead` counts in the device's ``overhead_s``), the output's bytes, the
parameters' bytes, and the activation bytes the layer keeps for its backward pass, counted
exactly as the tensors autograd saves (``torch.autograd.graph.saved_tensors_hooks``), each
storage once and the layer's own parameters not at all (the cost model counts them as P).
``slowdown`` scales the times, so an agent emulating a slower device reports the device it
emulates.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from tqdm import tqdm

from agent.zoo import ZooModel
from orchestrator.formats import Layer, ModelProfile


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
    param = torch.zeros(1, requires_grad=True)
    param.grad = torch.zeros(1)
    optimizer = torch.optim.SGD([param], lr=1e-6)
    return _median_s(optimizer.step, warmup=warmup, repeats=repeats)


def profile_model(model: ZooModel, *, batch_size: int, reference: str, dataset: str | None = None,
                  warmup: int = 2, repeats: int = 5, slowdown: float = 1.0, seed: int = 0,
                  progress: bool = True,
                  on_layer: Callable[[int, int], None] | None = None) -> ModelProfile:
    """Profile every layer of ``model``; ``on_layer(done, total)`` reports progress."""
    if batch_size < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need batch_size >= 1, repeats >= 1, warmup >= 0; got {batch_size}, "
                         f"{repeats}, {warmup}")
    if slowdown < 1:
        raise ValueError(f"slowdown must be at least 1, got {slowdown}")
    generator = torch.Generator().manual_seed(seed)
    step_call_s = optimizer_call_s()
    x = torch.randn((batch_size, *model.input_shape), generator=generator)
    layers = []
    bar = tqdm(model.layers, desc=f"profiling {model.name}", unit="layer", disable=not progress)
    for i, zoo_layer in enumerate(bar):
        module = zoo_layer.module.train()
        params = [p for p in module.parameters() if p.requires_grad]
        inputs = x.detach().requires_grad_(i > 0)
        out, activation_bytes = _saved_bytes(module, inputs)
        grad = torch.randn(out.shape, generator=generator)
        wrt = ([inputs] if i > 0 else []) + params

        def forward(module: nn.Module = module, inputs: torch.Tensor = inputs) -> object:
            return module(inputs)

        optimizer = torch.optim.SGD(params, lr=1e-6) if params else None

        def backward(module: nn.Module = module, inputs: torch.Tensor = inputs,
                     grad: torch.Tensor = grad, wrt: list[torch.Tensor] = wrt,
                     params: list[torch.Tensor] = params,
                     optimizer: torch.optim.Optimizer | None = optimizer) -> object:
            y = module(inputs)
            start = time.perf_counter()
            grads = torch.autograd.grad(y, wrt, grad_outputs=grad, allow_unused=True)
            if optimizer is not None:
                for p, g in zip(params, grads[len(wrt) - len(params):], strict=True):
                    p.grad = g
                optimizer.step()
            return time.perf_counter() - start

        forward_s = _median_s(forward, warmup=warmup, repeats=repeats)
        # time only the backward pass: the forward that builds its graph is not counted
        for _ in range(warmup):
            backward()
        backward_s = statistics.median(float(backward()) for _ in range(repeats))  # type: ignore[arg-type]
        if params:
            backward_s = max(0.0, backward_s - step_call_s)
        layers.append(Layer(
            name=zoo_layer.name, kind=zoo_layer.kind, forward_s=forward_s * slowdown,
            backward_s=backward_s * slowdown,
            output_bytes=out.numel() * out.element_size(),
            param_bytes=sum(p.numel() * p.element_size() for p in module.parameters()),
            activation_bytes=activation_bytes))
        x = out.detach()
        if on_layer is not None:
            on_layer(i + 1, model.num_layers)
    return ModelProfile(model=model.name, batch_size=batch_size, reference=reference,
                        layers=tuple(layers), dataset=dataset,
                        source=f"edgepipe agent profiler, torch {torch.__version__}")


def measure_overhead(*, slowdown: float = 1.0, microbatches: int = 200) -> float:
    """The fixed time a micro-batch costs a stage on this device beyond its layers' compute
    (the executor's own work: loss, optimizer call, events), as the cost model's ``overhead_s``.

    It runs the real executor on a one-layer stage over the digits and subtracts the layer's
    profiled compute; like the profile, it counts the emulated slowdown.
    """
    import time as clock

    from agent.data import digits
    from agent.executor import Clock, StageExecutor, StageSpec
    from agent.transport import DataPlane
    from agent.zoo import ZooLayer, ZooModel

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
        executor = StageExecutor(spec, module=layer, plane=plane, clock=Clock(clock.time()),
                                 dataset=digits(), slowdown=slowdown)
        started = clock.perf_counter()
        executor.run()
        per_microbatch = (clock.perf_counter() - started) / microbatches
    finally:
        plane.close()
    return max(0.0, per_microbatch - layer_s)
