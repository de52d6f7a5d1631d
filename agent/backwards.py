"""A stage's backward whose gradients come back as tensors, for the stage executor: on a
stashed snapshot, in parts (a preempted helper's, agent.layered), or under asynchronous 1F1B,
whose update takes each micro-batch's own. Under a synchronous schedule they join the batch's
sum (agent.gradsum); the executor's own backward on the live parameters sums them in their
``.grad`` instead. A mixin of :class:`agent.executor.StageExecutor`, as agent.stageio is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from agent.gradsum import GradientSum
from agent.layered import backward_layers


@dataclass
class InFlight:
    """A forward's state until its backward."""

    version: int
    header_version: int
    inputs: torch.Tensor
    output: torch.Tensor  # the loss on the last stage
    params: list[torch.Tensor]
    layer_outputs: list[torch.Tensor] | None = None  # each layer's, for a backward in parts


class Host(Protocol):
    """What of the executor these methods read and change."""

    layered: bool
    synchronous: bool
    parts: dict[str, list[tuple[int, int]]]
    param_layers: list[int]
    gradient_sum: GradientSum
    grads: dict[int, list[torch.Tensor]]

    def _timed(self, kind: str, microbatch: int, version: int, work: Callable[[], Any], *,
               part: int = 0, layers: tuple[int, int] | None = None) -> Any: ...
    def _send(self, kind: str, stage: int, microbatch: int, version: int,
              tensor: torch.Tensor, labels: torch.Tensor | None = None) -> None: ...
    def _backward_in_parts(self, flight: InFlight, upstream: torch.Tensor, m: int,
                           needs_input_grad: bool) -> tuple[torch.Tensor | None, ...]: ...


class Backwards:
    """The executor's backwards apart from the batch's sum in ``.grad``."""

    def _backward_apart(self: Host, flight: InFlight, upstream: torch.Tensor | None, k: int,
                        m: int, needs_input_grad: bool) -> None:
        """A backward whose gradients come back as tensors: on a stashed snapshot, in parts, or
        under asynchronous 1F1B, whose update takes each micro-batch's own."""
        wrt = flight.params

        def work() -> tuple[torch.Tensor | None, ...]:
            inputs = ([flight.inputs] if needs_input_grad else []) + wrt
            return torch.autograd.grad(flight.output, inputs, grad_outputs=upstream,
                                       allow_unused=True)

        if self.layered:
            assert upstream is not None and flight.layer_outputs is not None
            grads = self._backward_in_parts(flight, upstream, m, needs_input_grad)
        else:
            grads = self._timed("backward", m, flight.header_version, work)
        param_grads = [torch.zeros_like(p) if g is None else g
                       for g, p in zip(grads[int(needs_input_grad):], wrt, strict=True)]
        if needs_input_grad:
            input_grad = grads[0] if grads[0] is not None else torch.zeros_like(flight.inputs)
            self._send("gradient", k - 1, m, flight.header_version, input_grad)
        if self.synchronous:
            self.gradient_sum.add(param_grads)
        else:
            self.grads[m] = param_grads

    def _backward_in_parts(self: Host, flight: InFlight, upstream: torch.Tensor, m: int,
                           needs_input_grad: bool) -> tuple[torch.Tensor | None, ...]:
        """A backward in parts, each in its turn: the input's gradient (when needed) and each
        parameter's, as one backward of the whole stage returns them."""
        assert flight.layer_outputs is not None
        got: dict[int, torch.Tensor | None] = {}
        grad: torch.Tensor | None = upstream
        for part, layers in enumerate(self.parts["backward"]):
            assert grad is not None  # only the last part's input may need none
            below, mine = self._timed("backward", m, flight.header_version, functools.partial(
                backward_layers, outputs=flight.layer_outputs, inputs=flight.inputs,
                params=flight.params, param_layers=self.param_layers, grad=grad,
                first=layers[0], last=layers[1], input_grad=needs_input_grad),
                part=part, layers=layers)
            got.update(mine)
            grad = below
        params = tuple(got.get(i) for i in range(len(flight.params)))
        return ((grad,) if needs_input_grad else ()) + params
