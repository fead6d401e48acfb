"""The one error the checks of untrusted files raise (an upload's, in the API; a job's export,
in the worker)."""

from __future__ import annotations


class UploadCheckError(ValueError):
    """The file would fail in the engine; the message says what is wrong (the caller prefixes
    the file's name)."""
