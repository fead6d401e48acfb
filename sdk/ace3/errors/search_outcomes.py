"""How a hyperparameter search ended badly: failed or cancelled (with its trials)."""

from __future__ import annotations

from typing import Any

from ace3.errors.base import ACE3Error

__all__ = ["FAILED_TRIALS_SHOWN", "SearchCancelledError", "SearchFailedError"]


FAILED_TRIALS_SHOWN = 5


class _SearchOutcomeError(ACE3Error):
    def __init__(self, message: str, search: Any, trials: list[Any] | None):
        self.search = search
        self.trials = list(trials or [])
        super().__init__(message)

    # picklable: rebuilt from the search and its trials
    def __reduce__(self) -> tuple[Any, ...]:
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
