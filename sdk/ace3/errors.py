"""Every error the ACE3 SDK raises, in one tree rooted at :class:`ACE3Error`.

Catch ``ace3.ACE3Error`` to handle anything the SDK raises on purpose; catch a leaf to handle
one situation::

    ACE3Error
    ├── APIConnectionError              the request got no HTTP response (DNS, refused, dropped)
    │   └── APITimeoutError             ... because it timed out
    ├── APIStatusError                  the server answered 4xx/5xx: status_code, message,
    │   │                               request_id, body, response
    │   ├── BadRequestError             400
    │   ├── AuthenticationError         401  missing, unknown or revoked API key
    │   ├── PermissionDeniedError       403
    │   ├── NotFoundError               404  does not exist, or belongs to another owner
    │   ├── ConflictError               409  Idempotency-Key reused with another body; deleting
    │   │                                    a model or dataset a live job uses
    │   ├── PayloadTooLargeError        413  upload over the server's size cap
    │   ├── ValidationError             422  .errors: [{loc, msg, type}, ...]
    │   ├── RateLimitError              429
    │   └── InternalServerError         >= 500
    ├── UnsupportedFeatureError         (also a ValueError) a setting the engine does not
    │                                   implement yet; .problems lists each field and reason
    ├── PackingError                    (also a ValueError) a directory cannot be packed
    │                                   (a symlink, a device, a missing entry module)
    ├── ChecksumMismatchError           a downloaded file's sha256 is not the one announced
    ├── JobFailedError                  the training job failed: .job, .logs_tail
    ├── JobCancelledError               the training job was cancelled: .job
    ├── NonFiniteLossError              the training loss became NaN or infinite: .step (where
    │                                   it began), .reported_at_step, .value
    ├── StepOutOfMemoryError            (engine) a rank of a multi-process run ran out of memory
    │                                   in a step: .step, .micro_batch, .split
    ├── SearchFailedError               the hyperparameter search failed: .search, .trials
    └── SearchCancelledError            the hyperparameter search was cancelled: .search,
                                        .trials, .best_params (the best trial so far)

429 and 5xx responses, timeouts and connection errors are retried (with backoff) before they
are raised; see ``ace3.client._http``.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = [
    "ACE3Error",
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ChecksumMismatchError",
    "ConflictError",
    "InternalServerError",
    "JobCancelledError",
    "JobFailedError",
    "NonFiniteLossError",
    "NotFoundError",
    "PackingError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "SearchCancelledError",
    "SearchFailedError",
    "StepOutOfMemoryError",
    "UnsupportedFeatureError",
    "ValidationError",
    "status_error_class",
]


class ACE3Error(Exception):
    """Base class of every error the SDK raises on purpose."""


# -- transport ------------------------------------------------------------------------------


class APIConnectionError(ACE3Error):
    """The request never got an HTTP response: the server is unreachable or the connection
    dropped. Raised after the SDK's own retries are spent."""

    def __init__(self, message: str = "Connection error.", *, request: httpx.Request | None = None):
        super().__init__(message)
        self.message = message
        self.request = request


class APITimeoutError(APIConnectionError):
    """The request timed out (after the SDK's own retries)."""

    def __init__(
        self, message: str = "Request timed out.", *, request: httpx.Request | None = None
    ):
        super().__init__(message, request=request)


# -- HTTP status ----------------------------------------------------------------------------


class APIStatusError(ACE3Error):
    """The server answered with a 4xx or 5xx status.

    ``message`` is the server's ``detail`` (or the body's text); ``request_id`` the
    ``x-request-id`` of the response, to quote when reporting a problem; ``body`` the decoded
    JSON body (or the text when it is not JSON).
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        request_id: str | None = None,
        body: Any = None,
        *,
        response: httpx.Response | None = None,
    ):
        self.status_code = status_code
        self.message = message
        self.request_id = request_id
        self.body = body
        self.response = response
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.status_code}: {self.message}"
        if self.request_id:
            text += f" (request id: {self.request_id})"
        return text

    def __reduce__(self):  # keep errors picklable despite the keyword-only response
        return (type(self), (self.status_code, self.message, self.request_id, self.body))


class BadRequestError(APIStatusError):
    """400: the request is malformed."""


class AuthenticationError(APIStatusError):
    """401: the API key is missing, unknown or revoked. Check ACE3_API_KEY."""


class PermissionDeniedError(APIStatusError):
    """403: the key may not do this."""


class NotFoundError(APIStatusError):
    """404: the resource does not exist, or belongs to another owner."""


class ConflictError(APIStatusError):
    """409: an Idempotency-Key reused with another body, or deleting something in use."""


class PayloadTooLargeError(APIStatusError):
    """413: the upload is over the server's size cap; nothing was stored."""


class RateLimitError(APIStatusError):
    """429: too many requests (raised once the SDK's retries are spent)."""


class InternalServerError(APIStatusError):
    """5xx: the server failed (raised once the SDK's retries are spent)."""


class ValidationError(APIStatusError):
    """422: one or more fields are invalid, or ask for something not implemented yet.

    ``errors`` is the server's list of ``{"loc": [...], "msg": "...", "type": "..."}``; the
    message names every field and its reason.
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        request_id: str | None = None,
        body: Any = None,
        *,
        response: httpx.Response | None = None,
    ):
        detail = body.get("detail") if isinstance(body, dict) else None
        self.errors: list[dict[str, Any]] = (
            [item for item in detail if isinstance(item, dict)] if isinstance(detail, list) else []
        )
        if self.errors:
            message = "invalid request: " + "; ".join(
                f"{_field_name(item.get('loc'))}: {item.get('msg', 'invalid')}"
                for item in self.errors
            )
        super().__init__(status_code, message, request_id, body, response=response)


def _field_name(loc: Any) -> str:
    """``["body", "config", "batch_size"]`` -> ``config.batch_size``."""
    if not isinstance(loc, list | tuple) or not loc:
        return "request"
    parts = [str(part) for part in loc]
    if len(parts) > 1 and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts)


_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: ValidationError,
    429: RateLimitError,
}


def status_error_class(status_code: int) -> type[APIStatusError]:
    """The error class for an HTTP status (``APIStatusError`` for an unlisted one)."""
    if status_code >= 500:
        return InternalServerError
    return _STATUS_ERRORS.get(status_code, APIStatusError)


# -- client-side refusals -------------------------------------------------------------------


class UnsupportedFeatureError(ValueError, ACE3Error):
    """A setting or argument asks for something this version does not implement.

    Raised before anything is uploaded or submitted. ``problems`` holds one entry per refused
    setting, each with ``field`` and ``reason``.
    """

    def __init__(self, message: str, problems: list[Any] | None = None):
        super().__init__(message)
        self.message = message
        self.problems = list(problems or [])


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


# -- job outcomes ---------------------------------------------------------------------------


class JobFailedError(ACE3Error):
    """The training job ended in ``failed``. ``job`` is the final job; ``logs_tail`` its last
    log lines (``LogLine`` objects), also shown in the message."""

    def __init__(self, job: Any, logs_tail: list[Any] | None = None):
        self.job = job
        self.logs_tail = list(logs_tail or [])
        job_id = getattr(job, "id", "?")
        error = getattr(job, "error", None) or "no error message recorded"
        exit_code = getattr(job, "exit_code", None)
        message = f"job {job_id} failed: {error}"
        if exit_code is not None:
            message += f" (exit code {exit_code})"
        if self.logs_tail:
            message += "\nlast log lines:\n" + "\n".join(
                "  " + _format_log_line(line) for line in self.logs_tail
            )
        super().__init__(message)


class JobCancelledError(ACE3Error):
    """The training job ended in ``cancelled``. ``job`` is the final job."""

    def __init__(self, job: Any):
        self.job = job
        super().__init__(f"job {getattr(job, 'id', '?')} was cancelled")


class NonFiniteLossError(ACE3Error):
    """The training loss became NaN or infinite, and the run stopped.

    Raised by the training engine on every rank (an in-process ``Trainer.train`` raises it;
    a job fails with its message). ``step`` is the first optimizer step whose loss was not
    finite, ``reported_at_step`` the step at which the run noticed (losses are read at metric
    reports, not after every step), ``value`` ``"nan"``, ``"inf"`` or ``"-inf"``. Steps that
    the float16 loss scaler skips for inf/NaN *gradients* do not raise it.
    """

    def __init__(
        self, step: int, reported_at_step: int, value: str, metric: str = "train_loss"
    ) -> None:
        self.step = step
        self.reported_at_step = reported_at_step
        self.value = value
        self.metric = metric
        name = "training loss" if metric == "train_loss" else metric
        super().__init__(
            f"{name} became {value} at step {step} (reported at step {reported_at_step}); "
            "lower the learning rate, enable gradient clipping (max_grad_norm) or loss scaling"
        )

    def __reduce__(self):  # picklable: rebuilt from its fields, not from the message
        return (type(self), (self.step, self.reported_at_step, self.value, self.metric))


# The exit status of a rank that ran out of memory inside a training step of a job with more
# than one process (EX_TEMPFAIL): the worker ends the attempt and runs the next one with half
# the micro-batch (twice the accumulation), resuming from the job's newest checkpoint.
OUT_OF_MEMORY_EXIT_CODE = 75


class StepOutOfMemoryError(ACE3Error, RuntimeError):
    """A rank ran out of memory inside a training step of a job with more than one process.

    Its peers may already wait in a collective for it (DDP's all-reduce runs during the
    backward pass), so the step cannot be retried in place: the rank leaves with
    :data:`OUT_OF_MEMORY_EXIT_CODE`, torchrun stops the others, and the worker retries the
    job with ``micro_batch_split`` doubled (the effective batch unchanged). ``micro_batch`` is
    the per-rank micro-batch that did not fit, ``split`` how many micro-batches each loader
    batch ran as.
    """

    def __init__(self, step: int, micro_batch: int, split: int) -> None:
        self.step, self.micro_batch, self.split = step, micro_batch, split
        super().__init__(
            f"out of memory at step {step} with a micro-batch of {micro_batch} sample(s) per "
            f"rank (micro-batch split {split}): this attempt ends on every rank; the next one "
            f"runs micro-batches of {-(-micro_batch // 2)} (the effective batch unchanged)"
        )

    def __reduce__(self):  # picklable: rebuilt from its fields, not from the message
        return (type(self), (self.step, self.micro_batch, self.split))


# -- search outcomes ------------------------------------------------------------------------

FAILED_TRIALS_SHOWN = 5


class _SearchOutcomeError(ACE3Error):
    def __init__(self, message: str, search: Any, trials: list[Any] | None):
        self.search = search
        self.trials = list(trials or [])
        super().__init__(message)

    def __reduce__(self):  # picklable: rebuilt from the search and its trials
        return (type(self), (self.search, self.trials))

    @property
    def best_trial(self) -> Any:
        """The best trial the search had when it ended (None if no trial succeeded)."""
        return getattr(self.search, "best_trial", None)

    @property
    def best_params(self) -> dict[str, Any] | None:
        best = self.best_trial
        return dict(best.params) if best is not None else None


class SearchFailedError(_SearchOutcomeError):
    """The hyperparameter search ended in ``failed`` (too many trials failed). ``search`` is
    the final search, ``trials`` every trial; the message quotes the failed trials' errors."""

    def __init__(self, search: Any, trials: list[Any] | None = None):
        search_id = getattr(search, "id", "?")
        message = f"search {search_id} failed: "
        message += getattr(search, "error", None) or "no error message recorded"
        failed = [trial for trial in trials or [] if str(getattr(trial, "state", "")) == "failed"]
        if failed:
            message += f"\n{len(failed)} failed trial(s):"
            for trial in failed[:FAILED_TRIALS_SHOWN]:
                message += (
                    f"\n  trial {getattr(trial, 'number', '?')} "
                    f"(job {getattr(trial, 'job_id', None) or '-'}): "
                    f"{getattr(trial, 'error', None) or 'no error message recorded'}"
                )
            if len(failed) > FAILED_TRIALS_SHOWN:
                message += f"\n  ... and {len(failed) - FAILED_TRIALS_SHOWN} more"
        super().__init__(message, search, trials)


class SearchCancelledError(_SearchOutcomeError):
    """The hyperparameter search ended in ``cancelled``. ``search`` is the final search (its
    ``best_trial`` is the best so far), ``trials`` every trial."""

    def __init__(self, search: Any, trials: list[Any] | None = None):
        message = f"search {getattr(search, 'id', '?')} was cancelled"
        best = getattr(search, "best_trial", None)
        if best is not None:
            message += f"; best trial so far: #{best.number} {dict(best.params)} = {best.value}"
        super().__init__(message, search, trials)


def _format_log_line(line: Any) -> str:
    text = getattr(line, "line", None)
    if text is None:
        return str(line)
    rank = getattr(line, "rank", None)
    if rank is None or str(text).startswith("[rank "):
        return str(text)
    return f"[rank {rank}] {text}"
