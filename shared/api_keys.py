"""Database API keys as text: how one is made, what of it is shown, and the hash that is stored.

A key is ``aptix_`` and 48 hexadecimal digits (192 random bits from :mod:`secrets`). It is shown
once, when it is made; the database keeps its SHA-256 (:func:`hash_key`) and the start of it
(:func:`key_prefix`, ``aptix_`` and 8 digits) to tell keys apart in a listing.

A fast unkeyed hash is enough here: a password hash (bcrypt, argon2) is slow on purpose so that
guessing a *human-chosen* secret from its hash costs a lot per guess, but nobody can enumerate
2**192 random keys however fast each guess is. A fast hash keeps a lookup to one index probe, and
there is no pepper for every gateway and ``aptix keys`` to share (and to lose or mismatch).
"""

from __future__ import annotations

import hashlib
import re
import secrets

__all__ = ["KEY_ID_PATTERN", "KEY_PATTERN", "KEY_PREFIX", "hash_key", "key_prefix", "new_key", "new_key_id"]

KEY_PREFIX = "aptix_"
"""How every database key starts (``APTIX_API_KEYS`` keys may look like anything)."""
_KEY_BYTES = 24
_SHOWN_DIGITS = 8
KEY_PATTERN = re.compile(r"aptix_[0-9a-f]{48}")
"""A whole database key."""
KEY_ID_PATTERN = re.compile(r"key_[0-9a-f]{16}")
"""A key's id: what listings, the access log and ``aptix keys revoke`` name it by."""


def new_key() -> str:
    """A new random key: ``aptix_`` and 48 hexadecimal digits."""
    return KEY_PREFIX + secrets.token_hex(_KEY_BYTES)


def new_key_id() -> str:
    """A new key id: ``key_`` and 16 hexadecimal digits."""
    return "key_" + secrets.token_hex(8)


def hash_key(key: str) -> str:
    """The stored form of ``key``: its SHA-256, 64 hexadecimal digits."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    """The part of ``key`` listings show: ``aptix_`` and its first 8 digits (32 of its 192 bits)."""
    return key[: len(KEY_PREFIX) + _SHOWN_DIGITS]
