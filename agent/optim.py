"""The stage's optimizer: stochastic gradient descent with momentum, computed as
``torch.optim.SGD`` computes it (no dampening, no Nesterov, no weight decay), bit for bit.

A stage updates its weights once per micro-batch, so the call's fixed cost counts as much as
its arithmetic on small stages, and most of ``torch.optim.SGD.step``'s time on a small stage
goes to its wrapper (profiler hooks, grad mode, the choice between its implementations), not
to the arithmetic. This one does the arithmetic alone and takes the gradients as arguments, so
nothing is written to ``.grad`` either.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class SGD:
    """``p -= lr * b`` with ``b = momentum * b + g`` (``b = g`` at the first step; with no
    momentum, ``p -= lr * g``), as ``torch.optim.SGD(params, lr=lr, momentum=momentum)``."""

    def __init__(self, params: Sequence[torch.Tensor], *, lr: float,
                 momentum: float = 0.0) -> None:
        if lr < 0 or momentum < 0:
            raise ValueError(f"lr and momentum must be at least 0, got {lr} and {momentum}")
        self.params = list(params)
        self.lr = lr
        self.momentum = momentum
        self.buffers: list[torch.Tensor] | None = None  # created by the first step

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor]) -> None:
        if len(grads) != len(self.params):
            raise ValueError(f"{len(grads)} gradients for {len(self.params)} parameters")
        if self.momentum == 0:
            for p, g in zip(self.params, grads, strict=True):
                p.add_(g, alpha=-self.lr)
            return
        if self.buffers is None:
            self.buffers = [g.detach().clone() for g in grads]
        else:
            for b, g in zip(self.buffers, grads, strict=True):
                b.mul_(self.momentum).add_(g)
        for p, b in zip(self.params, self.buffers, strict=True):
            p.add_(b, alpha=-self.lr)
