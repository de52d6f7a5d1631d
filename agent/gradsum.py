"""A synchronous schedule's gradients summed over a batch (GPipe, 1F1B with a flush): what the
flush's single update averages.

A backward on the live parameters sums their gradients where torch's own backward does, in
each parameter's ``.grad`` (autograd's AccumulateGrad: the first micro-batch's gradient kept
as it came, each next one added in place). Returning every micro-batch's gradients and adding
them in Python cost an allocation and a kernel call per parameter and micro-batch, and a
backward of the two-stage VGG-5's first stage 3-9% more than torch's (docs/benchmarks.md).
The sum is the same, bit for bit: the same additions in the same order. A backward on other
tensors (a stashed snapshot, a pass in parts) hands its gradients over instead
(:meth:`GradientSum.add`), and the total is both.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class GradientSum:
    """The gradients of ``params`` summed over the micro-batches since the last :meth:`take`,
    and how many micro-batches they hold."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.params = list(params)
        self.count = 0
        self._apart: list[torch.Tensor] | None = None  # handed over by add()
        self._in_params = False  # some are in the parameters' .grad
        for p in self.params:
            p.grad = None

    def backward(self, output: torch.Tensor, upstream: torch.Tensor | None,
                 inputs: torch.Tensor | None) -> torch.Tensor | None:
        """Differentiate ``output`` (with ``upstream``, the gradient of it, or a scalar loss
        with None), summing into the parameters' ``.grad``; returns the gradient of
        ``inputs`` (a leaf tensor; zeros where the output does not depend on it), or None
        without them."""
        wrt = ([] if inputs is None else [inputs]) + self.params
        if inputs is not None:
            inputs.grad = None
        if wrt:  # a first stage without parameters has nothing to differentiate
            torch.autograd.backward(output, grad_tensors=upstream, inputs=wrt)
        self._in_params = True
        self.count += 1
        if inputs is None:
            return None
        return inputs.grad if inputs.grad is not None else torch.zeros_like(inputs)

    def add(self, grads: Sequence[torch.Tensor]) -> None:
        """One micro-batch's gradients computed elsewhere, one per parameter."""
        if len(grads) != len(self.params):
            raise ValueError(f"{len(grads)} gradients for {len(self.params)} parameters")
        self._apart = (list(grads) if self._apart is None
                       else [a + g for a, g in zip(self._apart, grads, strict=True)])
        self.count += 1

    @property
    def total(self) -> list[torch.Tensor] | None:
        """The sum so far, one tensor per parameter (None before the first micro-batch)."""
        if not self._in_params:
            return self._apart
        held = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        if self._apart is None:
            return held
        return [a + b for a, b in zip(held, self._apart, strict=True)]

    def replace(self, grads: list[torch.Tensor], count: int) -> None:
        """The sum becomes ``grads`` over ``count`` micro-batches (the replicas' all-reduced
        sum)."""
        self._clear()
        self._apart, self.count = grads, count

    def take(self) -> list[torch.Tensor] | None:
        """The batch's average gradients (None if it had no micro-batch), and a new sum."""
        total, count = self.total, self.count
        self._clear()
        if total is None:
            return None
        return [g / count for g in total]

    def _clear(self) -> None:
        if self._in_params:
            for p in self.params:
                p.grad = None
        self._apart, self._in_params, self.count = None, False, 0
