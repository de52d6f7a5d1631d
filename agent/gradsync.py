"""Gradients shared among the replicas of a stage, over the data plane (raw bytes, never
pickle): docs/architecture.md, "Replicated stages".

- Under 1F1B a replica sends each of its micro-batches' gradients to every other replica
  (:func:`send_gradients`), and every replica applies every micro-batch's update in order;
  a replica's update of a micro-batch another one owns takes that message
  (:func:`receive_gradients`).
- Under GPipe the replicas ring-all-reduce (:func:`ring_all_reduce`) what each accumulated
  over the batch, and the number of micro-batches it holds, then apply the average: reduce-
  scatter, each chunk summed around the ring starting at a different replica, then
  all-gather, so that every replica ends with the same bytes (2 (n - 1) / n of the stage's
  gradients sent by each, the cost model's Y).

A stage's gradients travel as one flat tensor in the order of its parameters, in the dtype of
the first parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from agent.transport import DataPlane
from agent.wire import encode_message


def flatten(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """One contiguous 1-D tensor of ``tensors`` in order (empty for none)."""
    if not tensors:
        return torch.zeros(0, dtype=dtype or torch.float32)
    kind = dtype or tensors[0].dtype
    return torch.cat([t.detach().reshape(-1).to(kind) for t in tensors])


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` cut back into tensors shaped and typed as ``like``; a ValueError when the
    sizes do not add up (a peer's message for another stage or model)."""
    sizes = [t.numel() for t in like]
    if flat.dim() != 1 or flat.numel() != sum(sizes):
        raise ValueError(f"gradients of {flat.numel()} values for parameters of {sum(sizes)}")
    parts = torch.split(flat, sizes)
    return [part.view_as(t).to(t.dtype) for part, t in zip(parts, like, strict=True)]


def send_gradients(plane: DataPlane, *, run: int, name: str, microbatch: int, version: int,
                   grads: Sequence[torch.Tensor], peers: Sequence[str],
                   sent_at: Callable[[], float]) -> int:
    """Send a micro-batch's gradients to every peer, encoded once (the same frames go to
    each: every copy of a large gradient costs the stage time); returns the bytes sent."""
    header, frames = encode_message(run=run, kind="grads", microbatch=microbatch,
                                    version=version, tensor=flatten(grads), name=name,
                                    sent_at=sent_at())
    for peer in peers:
        plane.send(peer, frames, header=header)
    return len(frames[1]) * len(peers)


def ring_all_reduce(flat: torch.Tensor, *, group: Sequence[str], me: str, send: Callable[
        [str, str, torch.Tensor], None], receive: Callable[[str], torch.Tensor]
                    ) -> tuple[torch.Tensor, int]:
    """The sum of every replica's ``flat`` (same size on each), by ring all-reduce over
    ``group`` (replicas in ring order); returns it and the bytes this replica sent.
    ``send(peer, step_name, tensor)`` and ``receive(step_name)`` carry one chunk; step names
    are unique within one all-reduce."""
    n = len(group)
    if n == 1:
        return flat.clone(), 0
    i = group.index(me)
    successor = group[(i + 1) % n]
    chunks = list(flat.clone().tensor_split(n))
    sent = 0
    for step in range(n - 1):  # reduce-scatter: chunk (i - step) goes on, grows by one
        out = (i - step) % n
        send(successor, f"rs{step}", chunks[out])
        sent += chunks[out].numel() * chunks[out].element_size()
        incoming = (i - step - 1) % n
        chunks[incoming] = chunks[incoming] + _sized(receive(f"rs{step}"), chunks[incoming])
    for step in range(n - 1):  # all-gather: replica i holds the sum of chunk (i + 1)
        out = (i + 1 - step) % n
        send(successor, f"ag{step}", chunks[out])
        sent += chunks[out].numel() * chunks[out].element_size()
        incoming = (i - step) % n
        chunks[incoming] = _sized(receive(f"ag{step}"), chunks[incoming])
    return torch.cat(chunks), sent


def _sized(got: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if got.shape != like.shape:
        raise ValueError(f"an all-reduce chunk of shape {list(got.shape)} where "
                         f"{list(like.shape)} was expected")
    return got.to(like.dtype)
