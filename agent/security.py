"""Who may talk to this agent's data plane: ZeroMQ's own CURVE security, nothing hand-made.

Every agent has a CURVE key pair (:class:`DataKeys`), kept as a ZeroMQ certificate in a
directory only its owner can read, beside the enrolment file (``data-keys/``). The agent says
its public key in ``hello``; the server gives each agent, with every peer's address, that
peer's public key (the ``keys`` of ``deploy`` and ``measure``). The data plane's inbox is a
CURVE server whose ZAP handler (:class:`PeerAuthenticator`, pyzmq's authenticator with a
callback) admits only the keys of the peers the server named; every message to a peer is
encrypted to the key the server gave for it, so a host that answers at a peer's address
without its secret key gets nothing.

What is admitted follows what the server says now, not everything it ever said: each
*grant* (a run this agent is deployed in, a link measurement under way) names its peers'
keys, a new deployment of the run replaces its grant and the run's end revokes it. A key no
grant names any more fails new handshakes, and the messages of a connection it opened before
are dropped: a connection's User-Id is its key, which :meth:`PeerAuthenticator.sender`
turns into the peer's uid for each message, as the grants say at that moment.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.certs import create_certificates, load_certificate
from zmq.auth.thread import ThreadAuthenticator

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
    """The inbox's ZAP handler: a CURVE client is admitted while its public key is one that a
    grant in force names for a peer; its connection's User-Id is that key (Z85, pyzmq's
    default)."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        super().__init__(context, log=log)
        self._lock = threading.Lock()
        self._grants: dict[Hashable, dict[bytes, str]] = {}  # holder -> {Z85 key: uid}
        self._epochs: dict[Hashable, int] = {}  # holder -> how many times it was granted
        # every grant's keys together, replaced whole (never changed in place): the
        # thread reading the inbox reads it for every message without the lock
        self._uids: Mapping[bytes, str] = {}
        self.refused = 0  # connections from keys nobody named

    def grant(self, holder: Hashable, peers: Mapping[str, bytes]) -> None:
        """Admit ``peers`` (uid -> Z85 public key) for ``holder`` (a run, a measurement),
        instead of what it admitted before."""
        with self._lock:
            self._grants[holder] = {key: uid for uid, key in peers.items()}
            self._epochs[holder] = self._epochs.get(holder, 0) + 1
            self._update()

    def revoke(self, holder: Hashable, *, after_s: float = 0.0) -> None:
        """Stop admitting what ``holder`` admitted (and no other grant does): now, or
        ``after_s`` from now unless it is granted again meanwhile."""
        if after_s <= 0:
            self._revoke(holder, None)
            return
        with self._lock:
            epoch = self._epochs.get(holder)
        timer = threading.Timer(after_s, self._revoke, args=(holder, epoch))
        timer.daemon = True  # a stopping agent does not wait for it
        timer.start()

    def _revoke(self, holder: Hashable, epoch: int | None) -> None:
        with self._lock:
            if epoch is not None and self._epochs.get(holder) != epoch:
                return  # granted again since the revocation was asked for
            if self._grants.pop(holder, None) is not None:
                self._update()

    def _update(self) -> None:
        """(Under the lock.) Every grant's keys, as one new mapping."""
        uids: dict[bytes, str] = {}
        for granted in self._grants.values():
            uids.update(granted)
        self._uids = uids

    def trust(self, uid: str, key: bytes) -> None:
        """Admit ``uid`` under ``key`` until this plane closes (a grant of its own)."""
        self.grant(("peer", uid), {uid: key})

    def knows(self, key: bytes) -> bool:
        return key in self._uids

    def sender(self, user_id: str) -> str | None:
        """The uid of the peer whose connection has this User-Id (its Z85 key), as the grants
        say now; None when no grant names the key any more."""
        return self._uids.get(user_id.encode("ascii", "replace"))

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook (``key`` in Z85)."""
        known = self.knows(key)
        if not known:
            self.refused += 1
            log.warning("refused a data-plane connection from an unknown key %s",
                        key.decode("ascii", "replace"))
        return known

    def begin(self) -> None:
        self.start()
        self.configure_curve_callback("*", credentials_provider=self)
