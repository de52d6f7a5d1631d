"""Who may talk to this agent's data plane: ZeroMQ's own CURVE security, nothing hand-made.

Every agent has a CURVE key pair (:class:`DataKeys`), kept as a ZeroMQ certificate in a
directory only its owner can read, beside the enrolment file (``data-keys/``). The agent says
its public key in ``hello``; the server gives each agent, with every peer's address, that
peer's public key (the ``keys`` of ``deploy`` and ``measure``). The data plane's inbox is a
CURVE server whose ZAP handler (:class:`PeerAuthenticator`, pyzmq's authenticator with a
callback) admits only the keys of the peers the server named, and stamps each message with
the sender's device uid; every message to a peer is encrypted to the key the server gave for
it, so a host that answers at a peer's address without its secret key gets nothing.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.certs import create_certificates, load_certificate
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from agent.config import ConfigError

log = logging.getLogger("edgepipe.agent.security")

CERTIFICATE = "data"  # data-keys/data.key (public) and data.key_secret


@dataclass(frozen=True)
class DataKeys:
    """A CURVE key pair, both halves in Z85 (40 ASCII characters each)."""

    public: bytes
    secret: bytes

    @classmethod
    def generate(cls) -> DataKeys:
        public, secret = zmq.curve_keypair()
        return cls(public=public, secret=secret)

    @property
    def public_text(self) -> str:
        return self.public.decode("ascii")


def load_or_create_keys(directory: Path) -> DataKeys:
    """This agent's key pair from ``directory`` (created, mode 0700, with a new pair the first
    time); refuses a directory or secret that others can read."""
    secret_file = directory / f"{CERTIFICATE}.key_secret"
    if not secret_file.exists():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        _, written = create_certificates(directory, CERTIFICATE)
        os.chmod(written, 0o600)
    for path in (directory, secret_file):
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            fix = "700" if path.is_dir() else "600"
            raise ConfigError(f"{path}: holds the data plane's secret key but others can reach "
                              f"it (mode {stat.S_IMODE(mode):o}); chmod {fix} it")
    try:
        public, secret = load_certificate(secret_file)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{secret_file}: not a ZeroMQ certificate ({exc})") from None
    if secret is None or len(public) != 40 or len(secret) != 40:
        raise ConfigError(f"{secret_file}: has no CURVE key pair")
    return DataKeys(public=public, secret=secret)


class PeerAuthenticator(ThreadAuthenticator):
    """The inbox's ZAP handler: a CURVE client is admitted when its public key is one the
    server named for a peer, and its messages carry that peer's uid as their User-Id."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        super().__init__(context, log=log)
        self._lock = threading.Lock()
        self._uids: dict[bytes, str] = {}  # Z85 public key -> device uid
        self.refused = 0  # connections from keys nobody named

    def trust(self, uid: str, key: bytes) -> None:
        with self._lock:
            self._uids = {k: u for k, u in self._uids.items() if u != uid} | {key: uid}

    def knows(self, key: bytes) -> bool:
        with self._lock:
            return key in self._uids

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook (``key`` in Z85)."""
        known = self.knows(key)
        if not known:
            self.refused += 1
            log.warning("refused a data-plane connection from an unknown key %s",
                        key.decode("ascii", "replace"))
        return known

    def curve_user_id(self, client_public_key: bytes) -> str:
        with self._lock:
            return self._uids.get(z85.encode(client_public_key), "")

    def begin(self) -> None:
        self.start()
        self.configure_curve_callback("*", credentials_provider=self)
