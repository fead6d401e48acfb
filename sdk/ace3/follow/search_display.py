"""Show a hyperparameter search while waiting on it, fed by its event stream.

On a terminal: a live rich table of the trials (number, state, parameters, objective,
epochs) under a header line with the search's progress and the best trial so far. Elsewhere
(CI, notebooks, pipes) or with ``show_progress=False``: plain lines, one per trial start, epoch
and end, and per search state change; the same rule as :mod:`ace3.follow.job_display`. The server re-sends
every trial when the stream reconnects: a trial that did not change prints nothing.
"""

from __future__ import annotations

import threading
from typing import Any, TextIO

from ace3.client.searches import Search, SearchEvent, SearchTrial, TrialState, best_of
from ace3.follow.display import DisplayMode, FollowDisplay, choose_display, format_value

MAX_TABLE_ROWS = 12  # the live table shows running trials, the best, then the newest ones
PARAMS_SHOWN = 6

_STATE_STYLES = {
    "running": "cyan",
    "succeeded": "green",
    "pruned": "yellow",
    "failed": "red",
    "cancelled": "dim",
}


def create_search_display(
    search: Search | None, *, mode: DisplayMode = "auto", file: TextIO | None = None
) -> SearchDisplay:
    """The display for ``mode``: ``auto`` = live table on a terminal, plain lines elsewhere."""
    display, out = choose_display(mode, file, SearchDisplay, PlainSearchDisplay, RichSearchDisplay)
    return display(search, out)


def format_params(params: dict[str, Any], limit: int | None = None) -> str:
    shown = list(params.items())
    text = " ".join(f"{name}={_format_param(value)}" for name, value in shown[:limit])
    if limit is not None and len(shown) > limit:
        text += f" (+{len(shown) - limit})"
    return text


def _format_param(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _fingerprint(trial: SearchTrial) -> tuple[Any, ...]:
    return (
        str(trial.state),
        trial.value,
        tuple(sorted(trial.intermediate_values.items())),
        trial.epochs_run,
        trial.job_id,
        trial.checkpoint_id,
        trial.error,
    )


class SearchDisplay(FollowDisplay):
    """Shows nothing; the base of the search displays (which override the ``_on_*`` hooks)."""

    def __init__(self, search: Search | None, out: TextIO):
        super().__init__(out)
        self.search = search
        self.trials: dict[int, SearchTrial] = {}
        self._lock = threading.Lock()  # the live display renders from another thread

    def handle(self, event: SearchEvent) -> None:
        data = event.data
        if isinstance(data, SearchTrial):
            with self._lock:
                previous = self.trials.get(data.number)
                if previous is not None and _fingerprint(previous) == _fingerprint(data):
                    return
                best_before = self.best_seen()
                self.trials[data.number] = data
            self._on_trial(data, previous, best_before)
        elif isinstance(data, Search):
            with self._lock:
                previous_state = self.search.state if self.search is not None else None
                self.search = data
            if event.type == "end":
                self._on_end(data)
            elif data.state != previous_state:
                self._on_state(data)
            else:
                self._on_update(data)

    def best(self) -> SearchTrial | None:
        """The best trial so far, by the trials seen and the search's own word."""
        return best_of(self.search, list(self.trials.values()))

    def best_seen(self) -> SearchTrial | None:
        """The best trial among the trials seen (what "best so far" is judged by)."""
        return best_of(self.search, list(self.trials.values()), with_search_best=False)

    def _on_trial(
        self, trial: SearchTrial, previous: SearchTrial | None, best_before: SearchTrial | None
    ) -> None:
        pass

    def _on_state(self, search: Search) -> None:
        pass

    def _on_update(self, search: Search) -> None:
        pass

    def _on_end(self, search: Search) -> None:
        pass

    # -- shared wording -------------------------------------------------------------------

    def _objective(self) -> str:
        return self.search.objective if self.search is not None else "objective"

    def _best_text(self, best: SearchTrial | None) -> str:
        if best is None or best.value is None:
            return "no trial succeeded yet"
        return (
            f"best trial {best.number}: {self._objective()}={format_value(best.value)} "
            f"{format_params(best.params)}"
        )

    def _counts(self, search: Search) -> str:
        # the trials seen are at least as fresh as the search's own counters
        trials = list(self.trials.values())
        states = [str(trial.state) for trial in trials]
        total = max(search.trials_created, len(trials))
        succeeded = max(search.trials_succeeded, states.count(TrialState.SUCCEEDED))
        pruned = max(search.trials_pruned, states.count(TrialState.PRUNED))
        failed = max(search.trials_failed, states.count(TrialState.FAILED))
        epochs = max(search.epochs_run, sum(trial.epochs_run for trial in trials))
        budget = f"/{search.trial_budget}" if search.trial_budget else ""
        return (
            f"{total}{budget} trials ({succeeded} succeeded, {pruned} pruned, "
            f"{failed} failed), {epochs} epochs"
        )

    def _end_message(self, search: Search) -> str:
        text = f"search {search.id} {search.state} after {self._elapsed()}: {self._counts(search)}"
        if search.error:
            text += f": {search.error}"
        return text + " | " + self._best_text(self.best())


class PlainSearchDisplay(SearchDisplay):
    """One line per trial start, new epoch value and end, and per search state change."""

    def _on_start(self) -> None:
        if self.search is not None:
            self.note(f"search {self.search.id}: {self.search.state}")

    def _on_state(self, search: Search) -> None:
        if not search.is_terminal:  # the end line reports the final state
            self.note(f"search {search.id}: {search.state}")

    def _on_trial(
        self, trial: SearchTrial, previous: SearchTrial | None, best_before: SearchTrial | None
    ) -> None:
        objective = self._objective()
        if previous is None:
            job = f" (job {trial.job_id})" if trial.job_id else ""
            self.note(f"trial {trial.number} started{job}: {format_params(trial.params)}")
        seen = {epoch for epoch, _ in previous.intermediate()} if previous is not None else set()
        for epoch, value in trial.intermediate():
            if epoch not in seen:
                self.note(f"trial {trial.number} epoch {epoch}: {objective}={format_value(value)}")
        if trial.is_finished and (previous is None or not previous.is_finished):
            self.note(self._finished_line(trial, best_before))

    def _finished_line(self, trial: SearchTrial, best_before: SearchTrial | None) -> str:
        text = f"trial {trial.number} {trial.state}"
        value = trial.latest_value
        if value is not None:
            text += f": {self._objective()}={format_value(value)}"
        text += f" after {trial.epochs_run} epoch{'s' if trial.epochs_run != 1 else ''}"
        if trial.error:
            text += f": {trial.error}"
        best = self.best_seen()
        if (
            best is not None
            and best.number == trial.number
            and (best_before is None or best_before.number != trial.number)
        ):
            text += " (best so far)"
        return text

    def _on_end(self, search: Search) -> None:
        self.note(self._end_message(search))


class RichSearchDisplay(SearchDisplay):
    """A live table of the trials under a header with the best trial so far."""

    def __init__(self, search: Search | None, out: TextIO):
        super().__init__(search, out)
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=out)
        self._live = Live(
            _Renderable(self),
            console=self._console,
            refresh_per_second=2,
            transient=False,
            vertical_overflow="visible",
        )
        self._live.start()

    def _stop_live(self) -> None:
        self._live.stop()

    def _on_trial(
        self, trial: SearchTrial, previous: SearchTrial | None, best_before: SearchTrial | None
    ) -> None:
        self._live.refresh()

    def _on_state(self, search: Search) -> None:
        self._live.refresh()

    def _on_update(self, search: Search) -> None:
        self._live.refresh()

    def _on_end(self, search: Search) -> None:
        self._live.refresh()
        self.close()
        self.note(self._end_message(search))

    # -- rendering ------------------------------------------------------------------------

    def header(self) -> tuple[str, str]:
        """The progress line, and the best trial so far."""
        search = self.search
        best = self._best_text(self.best())
        if search is None:
            return f"search | {self._elapsed()}", best
        running = sum(1 for trial in self.trials.values() if not trial.is_finished)
        title = search.name or f"search {search.id}"
        return (
            f"{title} {search.state} | {self._counts(search)}, {running} running | "
            f"{self._elapsed()}"
        ), best

    def rows(self) -> tuple[list[SearchTrial], int]:
        """The trials the table shows (by number), and how many it leaves out."""
        trials = sorted(self.trials.values(), key=lambda trial: trial.number)
        if len(trials) <= MAX_TABLE_ROWS:
            return trials, 0
        best = self.best()
        chosen = {trial.number for trial in trials if not trial.is_finished}
        if best is not None:
            chosen.add(best.number)
        for trial in reversed(trials):  # then the newest
            if len(chosen) >= MAX_TABLE_ROWS:
                break
            chosen.add(trial.number)
        shown = [trial for trial in trials if trial.number in chosen][-MAX_TABLE_ROWS:]
        return shown, len(trials) - len(shown)

    def render(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            header = self.header()
            shown, hidden = self.rows()
            best = self.best()
        table = Table(expand=True, show_edge=False, pad_edge=False)
        table.add_column("#", justify="right", no_wrap=True)
        table.add_column("state", no_wrap=True)
        table.add_column("params", ratio=1, overflow="ellipsis", no_wrap=True)
        table.add_column(Text(self._objective()), justify="right", no_wrap=True)
        table.add_column("epochs", justify="right", no_wrap=True)
        for trial in shown:
            marker = "*" if best is not None and best.number == trial.number else ""
            value = trial.latest_value
            table.add_row(
                Text(f"{trial.number}{marker}"),
                Text(str(trial.state), style=_STATE_STYLES.get(str(trial.state), "")),
                Text(format_params(trial.params, PARAMS_SHOWN)),
                Text(format_value(value) if value is not None else "-"),
                Text(str(trial.epochs_run)),
            )
        progress, best_line = header
        parts: list[Any] = [
            Text(progress, style="bold", no_wrap=True, overflow="ellipsis"),
            Text(best_line, no_wrap=True, overflow="ellipsis"),
            table,
        ]
        if hidden:
            parts.append(Text(f"... {hidden} more trials not shown", style="dim"))
        return Group(*parts)


class _Renderable:
    """Rebuilt on every refresh, so the elapsed time moves between events."""

    def __init__(self, display: RichSearchDisplay):
        self._display = display

    def __rich__(self) -> Any:
        return self._display.render()
