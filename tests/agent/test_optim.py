"""The stage's SGD computes what torch.optim.SGD computes, bit for bit."""

from __future__ import annotations

import pytest
import torch

from agent.optim import SGD


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_matches_torch_optim_sgd_bit_for_bit(momentum: float) -> None:
    generator = torch.Generator().manual_seed(0)
    shapes = [(16, 8), (16,), (4, 16), (4,)]
    ours = [torch.randn(s, generator=generator) for s in shapes]
    theirs = [p.clone().requires_grad_(True) for p in ours]
    reference = torch.optim.SGD(theirs, lr=0.05, momentum=momentum)
    optimizer = SGD(ours, lr=0.05, momentum=momentum)
    for _ in range(5):
        grads = [torch.randn(s, generator=generator) for s in shapes]
        for p, g in zip(theirs, grads, strict=True):
            p.grad = g.clone()
        reference.step()
        optimizer.step(grads)
        for mine, ref in zip(ours, theirs, strict=True):
            assert torch.equal(mine, ref.detach())


def test_sgd_refuses_a_gradient_count_that_does_not_match() -> None:
    optimizer = SGD([torch.zeros(2), torch.zeros(3)], lr=0.1)
    with pytest.raises(ValueError, match="1 gradients for 2 parameters"):
        optimizer.step([torch.zeros(2)])


def test_sgd_refuses_a_negative_rate() -> None:
    with pytest.raises(ValueError, match="lr and momentum"):
        SGD([torch.zeros(1)], lr=-0.1)
