"""``s3://bucket/prefix/`` URIs: split and checked. No settings, no boto3: the settings validate
``ACE3_DATASET_SOURCES`` with it at load, and :mod:`ace3_control.dataset_sources` checks
registered URIs with it."""

from __future__ import annotations

import re

# S3's bucket names (3-63 characters; letters, digits, '.', '-', and '_' of legacy AWS buckets).
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]$")
# Whitespace and control characters, '?' and '#' (a query or fragment is no part of a key).
_BAD_KEY_CHARACTER = re.compile(r"[\s\x00-\x1f\x7f?#\\]")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> (``bucket``, ``some/prefix/``): the prefix ends in ``/``
    unless it is empty. Raises ``ValueError`` for anything that is not an s3:// URI of a valid
    bucket name and a plain key prefix (no '.' or '..' parts, no whitespace, '?' or '#')."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI (s3://bucket/prefix/)")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket (s3://bucket/prefix/)")
    if not _BUCKET.match(bucket):
        raise ValueError(
            f"{uri!r}: {bucket!r} is not a bucket name (3 to 63 letters, digits, '.', '-')"
        )
    prefix = prefix.strip("/")
    if _BAD_KEY_CHARACTER.search(prefix):
        raise ValueError(
            f"{uri!r}: the prefix holds whitespace, a control character, '?', '#' or '\\'"
        )
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise ValueError(f"{uri!r}: the prefix has an empty, '.' or '..' part")
    return bucket, f"{prefix}/" if prefix else ""


def parse_sources(raw: str | None) -> list[tuple[str, str]]:
    """The (bucket, prefix) pairs of a comma-separated list of s3:// prefixes (empty entries
    skipped; None or blank: none). Raises ``ValueError`` naming the first bad entry."""
    return [split_s3_uri(part.strip()) for part in (raw or "").split(",") if part.strip()]


def covers(outer: tuple[str, str], inner: tuple[str, str]) -> bool:
    """Whether every key under ``inner`` (bucket, prefix) is under ``outer``."""
    return outer[0] == inner[0] and inner[1].startswith(outer[1])


def overlaps(first: tuple[str, str], second: tuple[str, str], *, casefold: bool = False) -> bool:
    """Whether some key could be under both (bucket, prefix) pairs: one covers the other. With
    ``casefold``, compared ignoring case (a store that matches keys case-insensitively, or a
    bucket name written in another case, is still the same place)."""
    if casefold:
        first = (first[0].casefold(), first[1].casefold())
        second = (second[0].casefold(), second[1].casefold())
    return covers(first, second) or covers(second, first)
