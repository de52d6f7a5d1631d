"""A synchronous schedule's gradients summed over a batch in the parameters' .grad
(agent.gradsum), against the gradients autograd hands back, added in Python."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agent.gradsum import GradientSum


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(1)
    return [(torch.randn(4, 6), torch.randn(4, 3)) for _ in range(count)]


def summed_apart(module: nn.Module, parts: list[tuple[torch.Tensor, torch.Tensor]]
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What the executor summed before agent.gradsum: autograd.grad's tensors, added in
    order, and each micro-batch's input gradient."""
    params = list(module.parameters())
    total: list[torch.Tensor] | None = None
    inputs = []
    for x, upstream in parts:
        given = x.clone().requires_grad_(True)
        grads = torch.autograd.grad(module(given), [given, *params], grad_outputs=upstream)
        inputs.append(grads[0])
        total = list(grads[1:]) if total is None else [a + g for a, g in
                                                      zip(total, grads[1:], strict=True)]
    assert total is not None
    return total, inputs


def test_the_sum_in_grad_is_the_sum_added_apart_bit_for_bit() -> None:
    module = net()
    parts = batches(5)
    expected, expected_inputs = summed_apart(module, parts)
    summed = GradientSum(list(module.parameters()))
    for (x, upstream), want in zip(parts, expected_inputs, strict=True):
        given = x.clone().requires_grad_(True)
        got = summed.backward(module(given), upstream, given)
        assert got is not None and torch.equal(got, want)
    assert summed.count == 5
    total = summed.total
    assert total is not None
    assert all(torch.equal(a, b) for a, b in zip(total, expected, strict=True))
    averaged = summed.take()
    assert averaged is not None
    assert all(torch.equal(a, b / 5) for a, b in zip(averaged, expected, strict=True))
    # a new batch starts from nothing: the parameters' .grad went with the take
    assert summed.total is None and summed.count == 0
    assert all(p.grad is None for p in module.parameters())


def test_a_backward_without_an_input_gradient_or_parameters() -> None:
    module = net()
    summed = GradientSum(list(module.parameters()))
    x, upstream = batches(1)[0]
    assert summed.backward(module(x), upstream, None) is None
    empty = GradientSum([])
    given = torch.randn(4, 6, requires_grad=True)
    assert empty.backward((given * 2).sum(), None, None) is None  # nothing to differentiate
    assert empty.count == 1 and empty.take() == []
    # an input the output does not depend on gets a zero gradient, not None
    unused = torch.randn(2, requires_grad=True)
    got = summed.backward(module(x).sum(), None, unused)
    assert got is not None and torch.equal(got, torch.zeros(2))


def test_gradients_handed_over_join_the_sum() -> None:
    module = net()
    parts = batches(3)
    expected, _ = summed_apart(module, parts)
    summed = GradientSum(list(module.parameters()))
    x, upstream = parts[0]
    summed.backward(module(x), upstream, None)
    _, (x1, u1), (x2, u2) = parts
    for x_, u_ in ((x1, u1), (x2, u2)):  # as a stashed forward's backward hands them
        summed.add(list(torch.autograd.grad(module(x_), list(module.parameters()),
                                            grad_outputs=u_)))
    total = summed.total
    assert total is not None and summed.count == 3
    assert all(torch.allclose(a, b) for a, b in zip(total, expected, strict=True))
    with pytest.raises(ValueError, match="2 gradients for 4 parameters"):
        summed.add(total[:2])


def test_the_replicas_sum_replaces_the_own() -> None:
    module = net()
    summed = GradientSum(list(module.parameters()))
    x, upstream = batches(1)[0]
    summed.backward(module(x), upstream, None)
    shared = [torch.full_like(p, 6.0) for p in module.parameters()]
    summed.replace(shared, 3)
    assert all(p.grad is None for p in module.parameters())
    averaged = summed.take()
    assert averaged is not None
    assert all(torch.equal(a, torch.full_like(a, 2.0)) for a in averaged)
