"""The root of the SDK's error tree: :class:`ACE3Error`."""

from __future__ import annotations

__all__ = ["ACE3Error"]


class ACE3Error(Exception):
    """Base class of every error the SDK raises on purpose."""
