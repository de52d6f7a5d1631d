"""The names of the weight messages agents send each other on the data plane: a chain
replica, a fetch and its answer (:func:`parse_weight_name`).

Weights between agents travel as data-plane ``weights`` messages (agent.transport) whose
``name`` says what they are; ``microbatch`` is the weights' applied, ``version`` the
generation. These are the names, typed.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.protocol.fields import address, fail, layer_range, read_int, slug


def _layers_text(text_: str, name: str) -> tuple[int, int]:
    first, sep, last = text_.partition("-")
    if not (sep and first.isdigit() and last.isdigit()):
        raise fail(name, "must be <first>-<last>", text_)
    return layer_range([int(first), int(last)], name)


@dataclass(frozen=True)
class ChainReplica:
    """``replica:<first>-<last>``: a stage's checkpoint, for the next stage's device to keep."""

    layers: tuple[int, int]

    def __post_init__(self) -> None:
        layer_range(list(self.layers), "layers")

    def to_name(self) -> str:
        return f"replica:{self.layers[0]}-{self.layers[1]}"


@dataclass(frozen=True)
class WeightFetch:
    """``fetch:<token>:<first>-<last>:<requester>=<its data address>``: a recovering stage
    asks for layers at the header's applied; the address, because the holder (a survivor the
    new plan leaves out) may not know the requester."""

    token: int
    layers: tuple[int, int]
    requester: str
    reply_to: str

    def __post_init__(self) -> None:
        read_int(self.token, "token", minimum=1)
        layer_range(list(self.layers), "layers")
        slug(self.requester, "requester")
        address(self.reply_to, "reply_to")

    def to_name(self) -> str:
        first, last = self.layers
        return f"fetch:{self.token}:{first}-{last}:{self.requester}={self.reply_to}"

    def reply(self) -> FetchReply:
        return FetchReply(self.token)


@dataclass(frozen=True)
class FetchReply:
    """``fetched:<token>``: the answer to a fetch, the weights' safetensors bytes (empty when
    the holder has no such copy)."""

    token: int

    def __post_init__(self) -> None:
        read_int(self.token, "token", minimum=1)

    def to_name(self) -> str:
        return f"fetched:{self.token}"


WeightName = ChainReplica | WeightFetch | FetchReply


def parse_weight_name(name: str | None) -> WeightName:
    """Read a weights message's name (ProtocolError naming the part that is wrong)."""
    kind, _, rest = (name or "").partition(":")
    if kind == "replica":
        return ChainReplica(_layers_text(rest, "layers"))
    if kind == "fetched":
        if not rest.isdigit():
            raise fail("token", "must be a positive integer", rest)
        return FetchReply(int(rest))
    if kind == "fetch":
        token, _, rest = rest.partition(":")
        layers, _, reply = rest.partition(":")
        requester, _, reply_to = reply.partition("=")
        if not token.isdigit():
            raise fail("token", "must be a positive integer", token)
        return WeightFetch(int(token), _layers_text(layers, "layers"), requester, reply_to)
    raise fail("name", "must be replica:, fetch: or fetched:", name)
