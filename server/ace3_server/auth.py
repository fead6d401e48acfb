"""API keys: generation, hashing at rest with a lookup prefix, and verification."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

KEY_PREFIX = "ace3"
LOOKUP_PREFIX_CHARS = 12
_HEX_DIGITS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class NewKey:
    """A freshly generated key: ``plaintext`` is shown once and never stored."""

    plaintext: str
    lookup_prefix: str
    key_hash: str


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def generate_key() -> NewKey:
    lookup = secrets.token_hex(LOOKUP_PREFIX_CHARS // 2)
    plaintext = f"{KEY_PREFIX}_{lookup}_{secrets.token_urlsafe(32)}"
    return NewKey(plaintext=plaintext, lookup_prefix=lookup, key_hash=hash_key(plaintext))


def parse_lookup_prefix(plaintext: str) -> str | None:
    """The lookup prefix of a well-formed key, or None (the caller answers 401 either way)."""
    parts = plaintext.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or len(parts[1]) != LOOKUP_PREFIX_CHARS:
        return None
    if not _HEX_DIGITS.issuperset(parts[1]):
        return None
    return parts[1]


def key_matches(plaintext: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_key(plaintext), stored_hash)
