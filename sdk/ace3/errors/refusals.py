"""What the SDK refuses on the client side: an unsupported setting, a directory it cannot pack, a
download whose checksum does not match, a webhook body whose signature does not verify, an
in-process run whose ``requirements`` this Python does not meet, a checkpoint file that loading
would have to run code for."""

from __future__ import annotations

from typing import Any

from ace3.errors.base import ACE3Error

__all__ = [
    "ChecksumMismatchError",
    "PackingError",
    "UnmetRequirementsError",
    "UnsafeCheckpointError",
    "UnsupportedFeatureError",
    "WebhookSignatureError",
]


class UnsupportedFeatureError(ValueError, ACE3Error):
    """A setting or argument asks for something this version does not implement.

    Raised before anything is uploaded or submitted. ``problems`` holds one entry per refused
    setting, each with ``field`` and ``reason``.
    """

    def __init__(self, message: str, problems: list[Any] | None = None):
        super().__init__(message)
        self.message = message
        self.problems = list(problems or [])


class UnmetRequirementsError(ACE3Error):
    """An in-process run (``ace3.Trainer`` on a live module) whose ``config.requirements`` this
    Python does not meet: a package is not installed, or at another version. Raised before
    training; nothing is installed into your Python (a job on the service gets them in an
    environment of its own). ``unmet`` holds one line per entry, naming it and why."""

    def __init__(self, unmet: list[str]):
        self.unmet = list(unmet)
        super().__init__(
            "this Python does not meet the run's requirements (an in-process run installs "
            "nothing: install them yourself, or submit the job to the service): "
            + "; ".join(self.unmet)
        )


class PackingError(ValueError, ACE3Error):
    """A directory cannot be packed for upload (a symlink or special file, a bad layout)."""


class ChecksumMismatchError(ACE3Error):
    """A downloaded file's sha256 differs from the one the server announced."""

    def __init__(self, path: str, expected: str, actual: str):
        super().__init__(
            f"sha256 mismatch for {path}: expected {expected}, got {actual}; "
            "the partial file was removed, download it again"
        )
        self.path = path
        self.expected = expected
        self.actual = actual


class UnsafeCheckpointError(ValueError, ACE3Error):
    """A checkpoint file that loading would have to run code for (a pickle naming a function or
    class outside the allowed ones), or an archive that reaches outside itself (a link, a path
    out of the directory, a sparse member, metadata pointing at other files or describing more
    data than it holds). Refused before any of it runs or is written."""


class WebhookSignatureError(ACE3Error):
    """A webhook request's ``ACE3-Signature`` header is missing, malformed, does not match the
    body and secret, or is older than the tolerance (a replay): do not trust the body.
    ``reason`` says which."""

    def __init__(self, reason: str):
        super().__init__(f"webhook signature rejected: {reason}")
        self.reason = reason
