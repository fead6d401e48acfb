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
    ├── UnmetRequirementsError          an in-process run's config.requirements are not met by
    │                                   this Python (nothing is installed): .unmet
    ├── ChecksumMismatchError           a downloaded file's sha256 is not the one announced
    ├── UnsafeCheckpointError           (also a ValueError) a checkpoint file that loading
    │                                   would have to run pickled code for, or an archive that
    │                                   reaches outside itself
    ├── WebhookSignatureError           a webhook body's ACE3-Signature does not verify
    │                                   (wrong secret, altered body, stale timestamp): .reason
    ├── JobFailedError                  the training job failed: .job, .logs_tail
    ├── JobCancelledError               the training job was cancelled: .job
    ├── NonFiniteLossError              the training loss became NaN or infinite: .step (where
    │                                   it began), .reported_at_step, .value
    ├── InstabilityError                the instability guard stopped the run: .step, .reason,
    │                                   .action
    ├── StepOutOfMemoryError            (engine) a rank of a multi-process run ran out of memory
    │                                   in a step: .step, .micro_batch, .split
    ├── TrainingPreemptedError          (engine) SIGTERM stopped the run after a checkpoint:
    │                                   .step, .checkpoint
    ├── SearchFailedError               the hyperparameter search failed: .search, .trials
    └── SearchCancelledError            the hyperparameter search was cancelled: .search,
                                        .trials, .best_params (the best trial so far)

429 and 5xx responses, timeouts and connection errors are retried (with backoff) before they
are raised; see ``ace3.client._http``.

The package: :mod:`.base` (``ACE3Error``), :mod:`.api` (connection and HTTP status errors),
:mod:`.refusals` (client-side refusals), :mod:`.job_outcomes`, :mod:`.search_outcomes`.
``ace3.errors`` stays the ``__module__`` of every class, as when it was one module.
"""

from ace3.errors.api import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ValidationError,
    status_error_class,
)
from ace3.errors.base import ACE3Error
from ace3.errors.job_outcomes import OUT_OF_MEMORY_EXIT_CODE as OUT_OF_MEMORY_EXIT_CODE
from ace3.errors.job_outcomes import PREEMPTED_EXIT_CODE as PREEMPTED_EXIT_CODE
from ace3.errors.job_outcomes import (
    InstabilityError,
    JobCancelledError,
    JobFailedError,
    NonFiniteLossError,
    StepOutOfMemoryError,
    TrainingPreemptedError,
)
from ace3.errors.refusals import (
    ChecksumMismatchError,
    PackingError,
    UnmetRequirementsError,
    UnsafeCheckpointError,
    UnsupportedFeatureError,
    WebhookSignatureError,
)
from ace3.errors.search_outcomes import FAILED_TRIALS_SHOWN as FAILED_TRIALS_SHOWN
from ace3.errors.search_outcomes import SearchCancelledError, SearchFailedError

__all__ = [
    "ACE3Error",
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ChecksumMismatchError",
    "ConflictError",
    "InstabilityError",
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
    "TrainingPreemptedError",
    "UnmetRequirementsError",
    "UnsafeCheckpointError",
    "UnsupportedFeatureError",
    "ValidationError",
    "WebhookSignatureError",
    "status_error_class",
]

# This package is the public home of the errors, as when it was one module: tracebacks, reprs
# and pickles name ace3.errors.<Error>.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type):
        _value.__module__ = __name__
del _name, _value
