"""Data planes linked as the server would link them, and a bare authenticated socket: what the
data-plane tests share."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import zmq

from agent.security import DataKeys
from agent.transport import DataPlane


def link(a: DataPlane, b: DataPlane) -> None:
    """``a`` sends to ``b`` (as "b"), and ``b`` admits ``a`` (as "a")."""
    a.connect("b", b.address, b.public_key)
    b.connect("a", a.address, a.public_key)


@contextlib.contextmanager
def linked_planes(sender: Mapping[str, Any] | None = None,
                  **receiver: Any) -> Iterator[tuple[DataPlane, DataPlane]]:
    """Two planes on 127.0.0.1, ``a`` linked to ``b`` (:func:`link`; ``sender`` and
    ``receiver``: more of ``a``'s and ``b``'s DataPlane arguments), both closed at the end."""
    a = DataPlane(bind="tcp://127.0.0.1:0", **(sender or {}))
    b = DataPlane(bind="tcp://127.0.0.1:0", **receiver)
    try:
        link(a, b)
        yield a, b
    finally:
        a.close()
        b.close()


def curve_socket(keys: DataKeys, to: DataPlane) -> zmq.Socket[bytes]:
    """A bare PUSH socket to ``to``'s inbox, authenticated with ``keys``: a peer that sends
    whatever it likes."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.curve_secretkey, sock.curve_publickey = keys.secret, keys.public
    sock.curve_serverkey = to.public_key
    sock.linger = 0
    sock.connect(to.address)
    return sock


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Whether ``condition`` came true within ``timeout_s`` (polled every 10 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
