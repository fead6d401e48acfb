"""Exit codes of the ``ace3`` command, and how an exception becomes one (never a traceback).

====  ==========================================================================
code  meaning
====  ==========================================================================
0     success (a followed job or search succeeded)
1     the job or search failed or was cancelled (or another server-side failure)
2     usage or bad input: an unknown key, a wrong type, a missing file, a
      setting the service refuses (400/409/422)
3     not found: no such job, search or checkpoint (for this API key)
4     the service is unreachable, or the API key is missing or refused
130   interrupted (Ctrl-C)
====  ==========================================================================
"""

from __future__ import annotations

from ace3.errors import (
    ACE3Error,
    APIConnectionError,
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    JobCancelledError,
    JobFailedError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    SearchCancelledError,
    SearchFailedError,
    UnsupportedFeatureError,
    ValidationError,
)

OK = 0
RUN_FAILED = 1
BAD_INPUT = 2
NOT_FOUND = 3
UNREACHABLE = 4
INTERRUPTED = 130

EXIT_CODES_HELP = (
    "exit codes: 0 success; 1 job/search failed or cancelled; 2 usage or bad input "
    "(unknown key, wrong type, missing file, refused setting); 3 not found; "
    "4 service unreachable or API key missing/refused; 130 interrupted"
)


class CLIError(Exception):
    """A failure the command explains in one message and an exit code."""

    def __init__(self, message: str, code: int = BAD_INPUT):
        super().__init__(message)
        self.code = code


def exit_code_for(exc: BaseException) -> tuple[int, str]:
    """(exit code, message for stderr) of an exception raised by a user command."""
    if isinstance(exc, CLIError):
        return exc.code, str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED, "interrupted"
    if isinstance(exc, JobFailedError | JobCancelledError | SearchFailedError):
        return RUN_FAILED, str(exc)
    if isinstance(exc, SearchCancelledError):
        return RUN_FAILED, str(exc)
    if isinstance(exc, NotFoundError):
        return NOT_FOUND, f"not found: {exc.message}"
    if isinstance(exc, AuthenticationError | PermissionDeniedError):
        return UNREACHABLE, (
            f"the service refused the API key ({exc.message}): check ACE3_API_KEY "
            "(create one with `ace3 keys create --name ...` on the server)"
        )
    if isinstance(exc, APIConnectionError):
        return UNREACHABLE, (
            f"cannot reach the ACE3 service ({exc}): check ACE3_BASE_URL and that the "
            "service runs (`ace3 up` starts one on this machine)"
        )
    if isinstance(exc, BadRequestError | ConflictError | ValidationError | PayloadTooLargeError):
        return BAD_INPUT, f"the service refused the request: {exc.message}"
    if isinstance(exc, APIStatusError):
        return RUN_FAILED, f"the service answered {exc.status_code}: {exc.message}"
    if isinstance(exc, UnsupportedFeatureError | ValueError | TypeError):
        return BAD_INPUT, str(exc)
    if isinstance(exc, OSError):  # a file that is missing or cannot be read or written
        return BAD_INPUT, str(exc)
    if isinstance(exc, ACE3Error):
        message = str(exc)
        if "API key" in message:
            return UNREACHABLE, message
        return RUN_FAILED, message
    raise exc
