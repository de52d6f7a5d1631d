"""The data plane's message format: tensors as ZeroMQ multipart messages [JSON header, raw
bytes] (an activation may carry its micro-batch's labels as a third frame).

Nothing received is unpickled. A header must be a JSON object with exactly the known fields
(``run``, ``kind``, ``microbatch``, ``version``, ``dtype``, ``shape``; optionally ``name`` for a
weight tensor, ``sent_at``, the server's epoch time when the sender started sending, and
``labels``, the number of int64 labels in the third frame), its dtype must be one of a fixed
set, and the payload must be exactly shape x itemsize bytes (the labels' frame 8 bytes a
label) and no larger than the configured limit; anything else is rejected with a
:class:`TransportError` that says why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}
_ITEMSIZE = {name: torch.empty((), dtype=dtype).element_size() for name, dtype in DTYPES.items()}
KINDS = ("activation", "gradient", "weights", "probe", "grads")
MAX_HEADER_BYTES = 4096
MAX_FRAMES = 3  # header, payload and an activation's labels
_REQUIRED = frozenset(("run", "kind", "microbatch", "version", "dtype", "shape"))
_FIELDS = _REQUIRED | {"name", "sent_at", "labels"}
MAX_DIMENSION = 2**31 - 1  # a tensor's size along one axis (torch's shapes overflow at 2**63)
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024


class TransportError(ValueError):
    """A message that does not follow the data-plane format."""


@dataclass(frozen=True)
class Header:
    run: int
    kind: str
    microbatch: int
    version: int
    dtype: str
    shape: tuple[int, ...]
    name: str | None = None
    sent_at: float | None = None
    labels: int | None = None  # int64 labels in a third frame (an activation's micro-batch's)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "kind": self.kind, "microbatch": self.microbatch,
                               "version": self.version, "dtype": self.dtype,
                               "shape": list(self.shape)}
        if self.name is not None:
            out["name"] = self.name
        if self.sent_at is not None:
            out["sent_at"] = self.sent_at
        if self.labels is not None:
            out["labels"] = self.labels
        return out

    def to_bytes(self) -> bytes:
        """The header on the wire: the bytes ``json.dumps(self.to_json())`` writes, put
        together directly (json.dumps of the dict was a fifth of encoding a message)."""
        if (self.kind not in KINDS or self.dtype not in DTYPES or not all(
                type(v) is int for v in (self.run, self.microbatch, self.version, *self.shape))
                or not (self.sent_at is None or (type(self.sent_at) is float
                                                 and math.isfinite(self.sent_at)))
                or not (self.labels is None or type(self.labels) is int)):
            return json.dumps(self.to_json()).encode()  # as json.dumps writes the unusual
        text = (f'{{"run": {self.run}, "kind": "{self.kind}", "microbatch": {self.microbatch}, '
                f'"version": {self.version}, "dtype": "{self.dtype}", '
                f'"shape": [{", ".join(map(str, self.shape))}]')
        if self.name is not None:
            text += f', "name": {json.dumps(self.name)}'
        if self.sent_at is not None:
            text += f', "sent_at": {self.sent_at!r}'
        if self.labels is not None:
            text += f', "labels": {self.labels}'
        return (text + "}").encode()


@dataclass(frozen=True)
class Message:
    header: Header
    tensor: torch.Tensor
    arrived_at: float = 0.0
    labels: torch.Tensor | None = None  # the micro-batch's labels an activation carries
    sender: str = ""  # the peer's device uid, as the data plane authenticated it

    @property
    def nbytes(self) -> int:
        extra = 0 if self.labels is None else self.labels.numel() * 8
        return self.tensor.numel() * self.tensor.element_size() + extra


def encode(*, run: int, kind: str, microbatch: int, version: int, tensor: torch.Tensor,
           name: str | None = None, sent_at: float | None = None) -> list[bytes]:
    """[header, payload] for a tensor (copied to contiguous CPU memory)."""
    return encode_message(run=run, kind=kind, microbatch=microbatch, version=version,
                          tensor=tensor, name=name, sent_at=sent_at)[1]


def encode_message(*, run: int, kind: str, microbatch: int, version: int, tensor: torch.Tensor,
                   name: str | None = None, sent_at: float | None = None,
                   labels: torch.Tensor | None = None) -> tuple[Header, list[bytes]]:
    """:func:`encode`, with the header it wrote (what :meth:`DataPlane.send` takes to skip
    reading it back). ``labels``: an activation's micro-batch's labels, carried along as a
    third frame of int64 (the last stage needs them; they ride with the activations instead
    of travelling as a message of their own)."""
    if kind not in KINDS:
        raise TransportError(f"unknown message kind {kind!r}")
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype not in _NAMES:
        raise TransportError(f"dtype {t.dtype} cannot be sent")
    carried = None
    if labels is not None:
        if kind != "activation":
            raise TransportError(f"labels ride with activations, not with {kind}")
        carried = labels.detach()
        if not (carried.dtype is torch.int64 and carried.dim() == 1 and carried.is_cpu
                and carried.is_contiguous()):  # a data set's labels are, and cost 2 us so
            carried = carried.to("cpu", torch.int64).reshape(-1).contiguous()
    header = Header(run=run, kind=kind, microbatch=microbatch, version=version,
                    dtype=_NAMES[t.dtype], shape=tuple(t.shape), name=name, sent_at=sent_at,
                    labels=None if carried is None else int(carried.numel()))
    payload = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    frames = [header.to_bytes(), payload]
    if carried is not None:
        frames.append(carried.numpy().tobytes())
    return header, frames


def _int(obj: dict[str, Any], key: str, minimum: int = 0) -> int:
    value = obj[key]
    if type(value) is not int or value < minimum:  # json.loads gives int, bool or float
        raise TransportError(f"header field {key!r} must be an integer >= {minimum}, "
                             f"got {value!r}")
    return value


def parse_header(raw: bytes) -> Header:
    if len(raw) > MAX_HEADER_BYTES:
        raise TransportError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, an integer of thousands of digits
        raise TransportError(f"header is not JSON: {exc}") from None
    except RecursionError:  # arrays nested a thousand deep fit in the header's 4 KB
        raise TransportError("header is nested too deeply") from None
    if not isinstance(obj, dict):
        raise TransportError("header must be a JSON object")
    keys = obj.keys()
    if not keys >= _REQUIRED:
        raise TransportError(f"header lacks {sorted(_REQUIRED - keys)}")
    if not keys <= _FIELDS:
        raise TransportError(f"header has unknown fields {sorted(keys - _FIELDS)}")
    if not isinstance(obj["kind"], str) or obj["kind"] not in KINDS:
        raise TransportError(f"unknown message kind {obj['kind']!r}")
    if not isinstance(obj["dtype"], str) or obj["dtype"] not in DTYPES:
        raise TransportError(f"dtype {obj['dtype']!r} is not one of {', '.join(DTYPES)}")
    shape = obj["shape"]
    if not isinstance(shape, list) or len(shape) > 8 or not all(
            type(s) is int for s in shape) or (shape and not 0 <= min(shape) <= max(shape)
                                               <= MAX_DIMENSION):
        raise TransportError(f"shape must be a list of at most 8 integers from 0 to "
                             f"{MAX_DIMENSION}, got {shape!r}"[:300])
    name = obj.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 256):
        raise TransportError("name must be a string of at most 256 characters")
    sent_at = obj.get("sent_at")
    if sent_at is not None and (isinstance(sent_at, bool) or not isinstance(sent_at, (int, float))
                                or not math.isfinite(sent_at)):
        raise TransportError(f"sent_at must be a finite number, got {sent_at!r}")
    labels = None
    if "labels" in obj:
        if obj["kind"] != "activation":
            raise TransportError(f"labels ride with activations, not with {obj['kind']}")
        labels = _int(obj, "labels")
    return Header(run=_int(obj, "run"), kind=obj["kind"], microbatch=_int(obj, "microbatch"),
                  version=_int(obj, "version"), dtype=obj["dtype"], shape=tuple(shape),
                  name=name, sent_at=None if sent_at is None else float(sent_at),
                  labels=labels)


def decode(frames: Sequence[bytes | memoryview], *, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
           arrived_at: float = 0.0, sender: str = "") -> Message:
    """Validate and decode [header, payload] (and an activation's labels' frame); raises
    TransportError on any mismatch."""
    if not 2 <= len(frames) <= MAX_FRAMES:
        got = f"more than {MAX_FRAMES}" if len(frames) > MAX_FRAMES else str(len(frames))
        raise TransportError(f"expected 2 frames [header, payload] (3 with labels), got {got}")
    header = parse_header(bytes(frames[0]))
    if (header.labels is not None) != (len(frames) == 3):
        raise TransportError("a labels frame comes with a header's labels count, and only "
                             "with it")
    payload = frames[1]
    dtype = DTYPES[header.dtype]
    count = math.prod(header.shape)
    expected = count * _ITEMSIZE[header.dtype]
    labels_bytes = 8 * (header.labels or 0)
    if expected + labels_bytes > max_bytes:
        raise TransportError(f"message of {expected + labels_bytes} bytes exceeds the limit "
                             f"of {max_bytes}")
    if len(payload) != expected:
        raise TransportError(f"payload has {len(payload)} bytes but the header's shape "
                             f"{list(header.shape)} of {header.dtype} needs {expected}")
    if count == 0:
        tensor = torch.empty(header.shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(bytearray(payload), dtype=dtype).reshape(header.shape)
    labels = None
    if header.labels is not None:
        if len(frames[2]) != labels_bytes:
            raise TransportError(f"labels frame has {len(frames[2])} bytes but {header.labels} "
                                 f"int64 labels need {labels_bytes}")
        labels = (torch.frombuffer(bytearray(frames[2]), dtype=torch.int64) if header.labels
                  else torch.empty(0, dtype=torch.int64))
    return Message(header=header, tensor=tensor, arrived_at=arrived_at, labels=labels,
                   sender=sender)
