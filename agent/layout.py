"""The memory format a stage's convolutions run in, chosen by timing them on this device.

A 2-D convolution's weights and activations may be laid out channels first (NCHW, torch's
default) or channels last (NHWC). oneDNN, which runs torch's convolutions on a CPU, is faster
in one or the other depending on the layers, the input size and the machine: on this project's
test machine, one torch thread, VGG-5 and MobileNetV2 on 32x32 images train 30-35% faster
channels last, ResNet-18 on the digits 20-40% slower (bench/layout.py, docs/benchmarks.md).
So neither is a safe default. A stage with a convolution times a forward and backward of a copy of
itself in both, on an input of its micro-batch's shape, and takes channels last only when it
is clearly faster; a stage without one keeps NCHW without timing anything.

Only the parameters change layout (the 4-D ones, as ``module.to(memory_format=...)`` does):
a convolution whose weights have channels-last strides computes in that layout whatever its
input's, and its output carries it to the next layer (the strides are set even where the
format is ambiguous, a weight of one input channel: :func:`to_format`). Tensors that leave
the stage (sent activations and gradients, checkpoints, weight transfers) are made
contiguous where they are encoded, as before. Results are those of the same model up to
floating-point rounding: the two layouts sum in different orders.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import torch
from torch import nn

FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}
# channels last is taken only when its fastest pass beats NCHW's by this share: within it the
# two are a tie, and NCHW is what every other part of torch expects
MARGIN = 0.05
# how long the timing may take (both formats): between MIN_ROUNDS and MAX_ROUNDS rounds
BUDGET_S = 1.0
MIN_ROUNDS, MAX_ROUNDS = 3, 10


def has_conv2d(module: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in module.modules())


def to_format(module: nn.Module, name: str) -> nn.Module:
    """``module`` with its 4-D parameters in format ``name`` (in place; returned)."""
    if name not in FORMATS:
        raise ValueError(f"unknown memory format {name!r}; known: {sorted(FORMATS)}")
    layout = FORMATS[name]
    for param in module.parameters():  # as module.to(memory_format=...) does, the same tensors
        if param.dim() == 4:
            # .to, not .contiguous: a weight of one input channel is contiguous in both
            # formats, and .contiguous(memory_format=...) left it with NCHW's strides, from
            # which torch chose NCHW for its convolution (and the block after it, the output
            # converted at the next convolution: a quarter of VGG-5's first stage on the
            # digits); .to sets the format's strides, and returns a tensor already in it
            param.data = param.data.to(memory_format=layout)
    return module


def _pass_s(module: nn.Module, params: Sequence[torch.Tensor], example: torch.Tensor) -> float:
    """One forward and backward (gradients of every parameter), timed."""
    began = time.perf_counter()
    out = module(example)
    torch.autograd.grad(out, params, grad_outputs=torch.ones_like(out), allow_unused=True)
    return time.perf_counter() - began


def faster_format(module: nn.Module, example: torch.Tensor, *, margin: float = MARGIN,
                  budget_s: float = BUDGET_S) -> str:
    """``"channels_last"`` when a forward and backward of ``module`` on ``example`` (an input
    of its micro-batch's shape) is faster by more than ``margin`` with its parameters channels
    last, else ``"contiguous"``. Times a copy (in train mode, its batch norms' statistics
    move), alternating the formats, and compares each one's fastest pass; ``module`` itself is
    left as it was. Without a 2-D convolution: ``"contiguous"``, untimed."""
    if not has_conv2d(module):
        return "contiguous"
    probe = copy.deepcopy(module).train()
    params = [p for p in probe.parameters() if p.requires_grad]
    if not params:
        return "contiguous"
    warm = []
    for name in FORMATS:  # each format's first pass pays its lazy set-up: not counted
        to_format(probe, name)
        warm.append(_pass_s(probe, params, example))
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(budget_s / max(sum(warm), 1e-9))))
    fastest = dict.fromkeys(FORMATS, float("inf"))
    for _ in range(rounds):
        for name in FORMATS:
            to_format(probe, name)
            fastest[name] = min(fastest[name], _pass_s(probe, params, example))
    return ("channels_last" if fastest["channels_last"] < (1 - margin) * fastest["contiguous"]
            else "contiguous")


def stage_example(layers: Sequence[nn.Module], input_shape: Sequence[int], batch_size: int,
                  first: int) -> torch.Tensor:
    """An input of layer ``first``'s shape for a micro-batch of ``batch_size``: zeros through
    copies of the layers before it (in eval mode, without gradients)."""
    x = torch.zeros((batch_size, *input_shape))
    with torch.no_grad():
        for layer in layers[:first]:
            x = copy.deepcopy(layer).eval()(x)
    return x
