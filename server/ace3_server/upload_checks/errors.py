"""The one error the upload checkers raise (shared with the worker's export checks)."""

from __future__ import annotations

from ace3_control.check_errors import UploadCheckError

__all__ = ["UploadCheckError"]
