"""The one follow loop of jobs and searches: a handle that reads the live event stream into a
display until the ``end`` event, turns Ctrl-C into a cancel when asked, and a timeout into a
``TimeoutError`` that says the run keeps going."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from ace3.follow.display import FollowDisplay

if TYPE_CHECKING:
    from ace3.client import Client


class _Followed(Protocol):
    id: str
    state: Any


class _Event(Protocol):
    type: str
    data: Any


ResourceT = TypeVar("ResourceT", bound=_Followed)
EventT = TypeVar("EventT", bound=_Event)


class FollowedHandle(Generic[ResourceT, EventT]):
    """A submitted run the service holds (a job, a search): refresh, cancel, stream, follow.

    Subclasses name the resource (``kind``, ``resource_type``), the client's collection for it
    (:meth:`_collection`), how to wait on it again (``wait_again``) and what stops after a
    cancel (``stops_after_cancel``)."""

    kind: ClassVar[str]
    resource_type: ClassVar[type[Any]]
    wait_again: ClassVar[str]  # formatted with the id
    stops_after_cancel: ClassVar[str]

    def __init__(self, resource: ResourceT | str, client: Client):
        self._client = client
        self._last: ResourceT | None
        if isinstance(resource, self.resource_type):
            self.id = resource.id
            self._last = resource
        else:
            self.id = str(resource)
            self._last = None

    def __repr__(self) -> str:
        state = self._last.state if self._last is not None else "?"
        return f"{type(self).__name__}(id={self.id!r}, state={str(state)!r})"

    @property
    def client(self) -> Client:
        return self._client

    @property
    def state(self) -> Any:
        """The state last seen (call :meth:`refresh` for the current one)."""
        return self._last.state if self._last is not None else None

    def refresh(self) -> ResourceT:
        self._last = self._collection().retrieve(self.id)
        return self._last

    def cancel(self) -> ResourceT:
        """Ask the run to stop; returns at once (it goes through ``cancelling``)."""
        self._last = self._collection().cancel(self.id)
        return self._last

    def stream_events(self, **kwargs: Any) -> Iterator[EventT]:
        """The live events, until the ``end`` event."""
        return self._collection().events(self.id, **kwargs)

    def _collection(self) -> Any:
        raise NotImplementedError

    def _follow(
        self,
        display: FollowDisplay,
        *,
        timeout: float | None,
        cancel_on_interrupt: bool,
        on_event: Callable[[EventT], None] | None = None,
    ) -> ResourceT:
        """Show every event until ``end`` and return the run as it ended. ``on_event`` sees
        each event after the display; an error it raises is shown once as a note and does not
        stop the wait."""
        final: ResourceT | None = None
        hook_failed = False
        started = time.monotonic()
        try:
            with display:
                for event in self.stream_events(timeout=timeout):
                    display.handle(event)
                    if on_event is not None:
                        try:
                            on_event(event)
                        except Exception as exc:  # a follower must not end the wait
                            if not hook_failed:
                                display.note(f"warning: following {self.kind} {self.id}: {exc!r}")
                            hook_failed = True
                    if isinstance(event.data, self.resource_type):
                        self._last = event.data
                        if event.type == "end":
                            final = event.data
        except KeyboardInterrupt:
            if cancel_on_interrupt:
                self._cancel_after_interrupt(display)
            raise
        except TimeoutError as exc:
            waited = time.monotonic() - started
            raise TimeoutError(
                f"{self.kind} {self.id} did not finish within {waited:.0f} s; it keeps running: "
                f"wait on it again with {self.wait_again.format(id=self.id)} or cancel it"
            ) from exc
        if final is None:  # the stream ended without `end`: ask the service itself
            final = self.refresh()
        return final

    def _cancel_after_interrupt(self, display: FollowDisplay) -> None:
        try:
            resource = self.cancel()
        except Exception as exc:
            display.note(f"Interrupted; could not cancel {self.kind} {self.id}: {exc}")
        else:
            display.note(
                f"Interrupted: cancelled {self.kind} {self.id} (state {resource.state}). "
                f"{self.stops_after_cancel}"
            )
