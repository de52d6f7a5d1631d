"""A stage's passes in parts, between layers: what a split-learning helper runs when its
schedule preempts a client's task (agent.turns, orchestrator.sl.turns).

The forward runs the stage's layers one at a time and keeps each layer's output (autograd
keeps them anyway); a backward part over layers a..e differentiates the output of layer e
with respect to the output of layer a - 1 (the stage's input for the first layer) and the
parameters of layers a..e only, so the parts of a backward may cut the layers elsewhere than
the parts of the forward did, and together compute what one backward of the whole stage
computes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def layers_of_parameters(module: nn.Module, owners: Sequence[nn.Module]) -> list[int]:
    """For each parameter's owning module (in the stage's parameter order), the index of the
    stage's layer (its child, in order) that holds it."""
    where = {id(sub): index for index, child in enumerate(module.children())
             for sub in child.modules()}
    return [where[id(owner)] for owner in owners]


def forward_layers(module: nn.Module, x: torch.Tensor, first: int, last: int
                   ) -> list[torch.Tensor]:
    """The outputs of the stage's layers (its children, in order) first..last on ``x``."""
    outputs = []
    for layer in list(module.children())[first:last + 1]:
        x = layer(x)
        outputs.append(x)
    return outputs


def backward_layers(*, outputs: Sequence[torch.Tensor], inputs: torch.Tensor,
                    params: Sequence[torch.Tensor], param_layers: Sequence[int],
                    grad: torch.Tensor, first: int, last: int, input_grad: bool
                    ) -> tuple[torch.Tensor | None, dict[int, torch.Tensor | None]]:
    """The backward over the stage's layers first..last: ``grad`` is the gradient of layer
    ``last``'s output. Returns the gradient of the part's input (layer ``first - 1``'s
    output, or the stage's input when ``first`` is 0 and ``input_grad``; else None) and each
    of the part's parameters' gradients, by its index in ``params``."""
    below = inputs if first == 0 else outputs[first - 1]
    wants_below = first > 0 or input_grad
    mine = [i for i, layer in enumerate(param_layers) if first <= layer <= last]
    wrt = ([below] if wants_below else []) + [params[i] for i in mine]
    grads = torch.autograd.grad(outputs[last], wrt, grad_outputs=grad, allow_unused=True)
    taken = 1 if wants_below else 0
    return (grads[0] if wants_below else None,
            dict(zip(mine, grads[taken:], strict=True)))
