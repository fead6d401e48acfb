"""The one error the upload checkers raise."""

from __future__ import annotations


class UploadCheckError(ValueError):
    """The uploaded file would fail in the engine; the message says what is wrong (the caller
    prefixes the file's name)."""
