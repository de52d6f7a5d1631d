"""Secrets shown once and stored hashed: device keys (salted SHA-256, compared in constant
time) and enrolment tokens (looked up by their SHA-256 digest; 192 random bits need no salt)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

_SCHEME = "sha256"


def secret_new(prefix: str) -> str:
    """A fresh random secret, ``<prefix>_<43 url-safe characters>`` (256 bits)."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_hash(secret: str) -> str:
    """``sha256$<salt>$<digest of salt + secret>``."""
    salt = secrets.token_hex(16)
    digest = hashlib.sha256((salt + secret).encode()).hexdigest()
    return f"{_SCHEME}${salt}${digest}"


def secret_matches(secret: str, stored: str) -> bool:
    """Whether ``secret`` hashes to ``stored``, in time independent of where they differ."""
    scheme, _, rest = stored.partition("$")
    salt, _, digest = rest.partition("$")
    candidate = hashlib.sha256((salt + secret).encode()).hexdigest()
    return hmac.compare_digest(candidate, digest) and scheme == _SCHEME
