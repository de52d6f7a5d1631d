"""TAPP's two policy networks (torch): the feed-forward partition network and the attention
seq2seq allocation network (Mao et al., Applied Sciences 11(11):4785, 2021; the architecture of
the hierarchical device-placement planner it builds on, Mirhoseini et al., ICLR 2018).

Partition network: per layer, ``Linear -> tanh -> Linear`` from the layer's features to one
logit per group, squashed by the tanh constant (``C * tanh(logit)``). Groups must be contiguous
layer ranges to run as pipeline stages, so the softmax over groups is *masked* as the layers are
visited in order: layer 0 is in group 0 and layer l may only stay in the group g of layer l - 1
or open group g + 1 (if g + 1 < G); its probabilities are the softmax restricted to those two
logits. Every sample is therefore a valid partition, the log-probabilities are exact for the
distribution actually sampled from, and the networks' logits are still computed per layer by one
feed-forward pass. Used groups are always 0..S-1; S is the number of stages.

Allocation network: a bidirectional LSTM encodes the S groups (mean of their layers' features
plus their compute and memory shares, see :mod:`orchestrator.tapp_features`) in pipeline order;
an LSTM decoder then picks a device for group k = 0..S-1. Its input is the embedding of the
device picked for group k - 1 (a learned "go" embedding for k = 0) and the encoding of group k;
it attends (Bahdanau: ``v . tanh(W1 m_j + W2 h)``) over the group encodings and maps ``[h;
context]`` to one logit per device, squashed by the tanh constant. A device serves one stage:
a device that served an earlier stage is masked out, and picking the device of the previous
group again joins the two groups into one stage (they are adjacent, so the stage stays a
contiguous range); the allocation network can thus also use fewer stages than groups.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def squash(logits: Tensor, tanh_constant: float) -> Tensor:
    """``C * tanh(logits)``: bounded logits keep every action's probability above
    ``e^(-2C)`` of the best one, so the policy keeps exploring (C <= 0 leaves them as is)."""
    return tanh_constant * torch.tanh(logits) if tanh_constant > 0 else logits


class PartitionNet(nn.Module):
    """Feed-forward network from a layer's features to its logits over the groups."""

    def __init__(self, *, features: int, hidden: int, groups: int) -> None:
        super().__init__()
        self.groups = groups
        self.hidden = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, groups)

    def forward(self, features: Tensor) -> Tensor:
        """[L, F] -> [L, G] raw logits."""
        out: Tensor = self.out(torch.tanh(self.hidden(features)))
        return out


def sample_contiguous(logits: FloatArray, *, samples: int, rng: np.random.Generator | None
                      ) -> IntArray:
    """[K, L] group of every layer: K samples from the masked softmax (``rng``), or with
    ``rng=None`` the most probable allowed group at each layer (greedy, K copies)."""
    num_layers, groups = logits.shape
    out = np.zeros((samples, num_layers), dtype=np.int64)
    current = np.zeros(samples, dtype=np.int64)
    rows = np.arange(samples)
    for layer in range(1, num_layers):
        can_open = current + 1 < groups
        stay = logits[layer][current]
        opening = logits[layer][np.minimum(current + 1, groups - 1)]
        if rng is None:
            advance = can_open & (opening > stay)
        else:
            p_open = 1.0 / (1.0 + np.exp(np.clip(stay - opening, -60.0, 60.0)))
            advance = can_open & (rng.random(samples) < p_open)
        current = current + advance
        out[rows, layer] = current
    return out


def contiguous_log_prob(logits: Tensor, groups: IntArray) -> Tensor:
    """[K] log-probability of each sampled partition under the masked softmax."""
    samples, num_layers = groups.shape
    if num_layers < 2:
        return logits.new_zeros(samples)
    num_groups = logits.shape[1]
    prev = torch.from_numpy(groups[:, :-1])
    chosen = torch.from_numpy(groups[:, 1:])
    table = logits[1:].unsqueeze(0).expand(samples, -1, -1)  # [K, L-1, G]
    stay = table.gather(2, prev.unsqueeze(2)).squeeze(2)
    opening = table.gather(2, (prev + 1).clamp(max=num_groups - 1).unsqueeze(2)).squeeze(2)
    picked = table.gather(2, chosen.unsqueeze(2)).squeeze(2)
    free = (prev + 1) < num_groups
    step = torch.where(free, picked - torch.logaddexp(stay, opening), torch.zeros_like(picked))
    return step.sum(dim=1)


class AllocationNet(nn.Module):
    """Attention seq2seq from the groups, in pipeline order, to one device per group."""

    def __init__(self, *, features: int, hidden: int, devices: int) -> None:
        super().__init__()
        if hidden % 2:
            raise ValueError(f"hidden must be even (a bidirectional encoder), got {hidden}")
        self.devices = devices
        self.encoder = nn.LSTM(features, hidden // 2, batch_first=True, bidirectional=True)
        self.device_embedding = nn.Embedding(devices + 1, hidden)  # the last row is "go"
        self.decoder = nn.LSTMCell(2 * hidden, hidden)
        self.attn_memory = nn.Linear(hidden, hidden, bias=False)
        self.attn_query = nn.Linear(hidden, hidden, bias=False)
        self.attn_score = nn.Linear(hidden, 1, bias=False)
        self.out = nn.Linear(2 * hidden, devices)

    def forward(self, groups: Tensor, lengths: Tensor, *, tanh_constant: float,
                generator: torch.Generator | None, forced: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        """``groups`` [K, G, F] (rows past ``lengths`` [K] are padding) -> (devices [K, G] with
        -1 past each length, log-probability [K]). Samples with ``generator``, greedy without;
        rows of ``forced`` [K, G] that are not -1 replay those devices instead."""
        samples, width, _ = groups.shape
        packed = nn.utils.rnn.pack_padded_sequence(groups, lengths, batch_first=True,
                                                   enforce_sorted=False)
        encoded, (h_n, c_n) = self.encoder(packed)
        memory, _ = nn.utils.rnn.pad_packed_sequence(encoded, batch_first=True,
                                                     total_length=width)  # [K, G, H]
        h = torch.cat([h_n[0], h_n[1]], dim=1)
        c = torch.cat([c_n[0], c_n[1]], dim=1)
        keys = self.attn_memory(memory)
        padding = torch.arange(width).unsqueeze(0) >= lengths.unsqueeze(1)  # [K, G]
        used = torch.zeros(samples, self.devices, dtype=torch.bool)  # by an earlier stage
        previous = torch.full((samples,), self.devices, dtype=torch.long)
        rows = torch.arange(samples)
        log_prob = groups.new_zeros(samples)
        picks = []
        for k in range(width):
            active = k < lengths
            step_in = torch.cat([self.device_embedding(previous), memory[:, k]], dim=1)
            h, c = self.decoder(step_in, (h, c))
            scores = self.attn_score(torch.tanh(keys + self.attn_query(h).unsqueeze(1)))
            weights = torch.softmax(scores.squeeze(2).masked_fill(padding, -torch.inf), dim=1)
            context = (weights.unsqueeze(2) * memory).sum(dim=1)
            logits = squash(self.out(torch.cat([h, context], dim=1)), tanh_constant)
            logp = torch.log_softmax(logits.masked_fill(used, -torch.inf), dim=1)
            if generator is None:
                pick = logp.argmax(dim=1)
            else:
                pick = torch.multinomial(logp.detach().exp(), 1, generator=generator).squeeze(1)
            if forced is not None:
                pick = torch.where(forced[:, k] >= 0, forced[:, k], pick)
            log_prob = log_prob + torch.where(active, logp[rows, pick], 0.0)
            if k > 0:  # the previous group's device closes its stage unless picked again
                closed = active & (pick != previous)
                used = used | (torch.nn.functional.one_hot(previous, self.devices + 1)[:, :-1]
                               .bool() & closed.unsqueeze(1))
            picks.append(torch.where(active, pick, -1))
            previous = torch.where(active, pick, previous)
        return torch.stack(picks, dim=1), log_prob


def group_features(layer_rows: Tensor, shares: Tensor, groups: IntArray, num_groups: int
                   ) -> tuple[Tensor, Tensor]:
    """[K, G, F + 2] mean features of each group's layers followed by its summed compute and
    memory shares (zeros for unused groups), and [K] the number of used groups."""
    member = torch.nn.functional.one_hot(torch.from_numpy(groups), num_groups).to(
        layer_rows.dtype)  # [K, L, G]
    counts = member.sum(dim=1).clamp(min=1.0).unsqueeze(2)  # [K, G, 1]
    mean = torch.einsum("klg,lf->kgf", member, layer_rows) / counts
    summed = torch.einsum("klg,lf->kgf", member, shares)
    lengths = torch.from_numpy(groups[:, -1] + 1)
    return torch.cat([mean, summed], dim=2), lengths
