"""Preparing an attempt's environment: from this machine's cache when it holds it, else fetched
from the artifact store when another worker built it, else built here (once for the whole
cluster: :mod:`.registry`), and pinned in the cache until the attempt is over.

What happened goes to the job's log, as the service's lines (``ace3: environment <hash>: built in
2.1 s (3 packages: ...)``, ``... fetched from the store in 0.2 s``, ``... reused from the
cache``), uv's own output with them. While an environment is built or fetched the job's
``phase`` is ``preparing_environment`` (it stays ``starting``); the attempt's lease is renewed by
its membership meanwhile (:meth:`ace3_worker.membership.Membership.keep_alive`). A requirement that
cannot be met raises :class:`~.uv_commands.EnvironmentRefusedError` naming it (the row is marked
``failed``); a worker that waited for another's build and saw it fail raises the same message,
while a job that finds a failed build it did not wait for builds again (the wheelhouse may have
changed since). A build that failed for a reason that may pass (the index unreachable, the disk
full, the store down, the worker stopping) gives the row up (deleted: the next worker that needs
it builds it) and raises :class:`~.uv_commands.EnvironmentBuildError` (the attempt is retried).

A waiter waits as long as the builder's lease is live (renewed through the build, packing,
upload and unpack) and takes the build over once it expires; a row that disappears means "build
it yourself". A builder checks its lease right before uploading and stores its archive under a
content-addressed key (:func:`~.archive.storage_key`), so a builder that lost its lease never
changes the archive the row names; it keeps the tree it built in this machine's cache (the same
requirements over the same installed set and sources: the same packages) and leaves the row to
the worker that took it over. A ``ready`` row whose archive is missing, does not match its
sha256 or cannot be unpacked is taken over and built again. Builds run in scratch directories
on the work filesystem (:mod:`.scratch`), local waits for another process's install stop on the
attempt's interrupt like the waits for another worker's build.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from ace3_control import job_transitions
from ace3_control.models import EnvironmentState
from ace3_control.settings import Settings
from ace3_control.storage import ArtifactStore, StoredDigestError
from ace3_worker.environments import registry
from ace3_worker.environments.archive import (
    ArchiveTooLargeError,
    BrokenArchiveError,
    pack,
    storage_key,
    unpack,
)
from ace3_worker.environments.build import BuiltTree, EnvironmentBuilder, take_ownership
from ace3_worker.environments.cache import EnvironmentCache, Pin, remove_tree
from ace3_worker.environments.identity import EnvironmentIdentity, environment_identity
from ace3_worker.environments.scratch import build_scratch
from ace3_worker.environments.uv_commands import (
    EnvironmentBuildError,
    EnvironmentRefusedError,
    PreparationInterrupted,
)
from ace3_worker.sandbox.plan import SandboxPlan

logger = logging.getLogger(__name__)

PHASE = "preparing_environment"
# How a worker waiting for another's build polls its row: soon at first, then less often.
WAIT_FIRST_SECONDS = 0.05
WAIT_MAX_SECONDS = 1.0
PIN_TRIES = 3
# A stored archive a worker cannot use: the row's environment is built again.
UNUSABLE_ARCHIVE = (FileNotFoundError, StoredDigestError, BrokenArchiveError)

Log = Callable[[str], None]


@dataclass
class PreparedEnvironment:
    """An attempt's environment, pinned in the cache until :meth:`release`."""

    identity: EnvironmentIdentity
    pin: Pin
    how: str  # "built", "fetched" or "reused"

    @property
    def path(self) -> Path:
        return self.pin.path

    def release(self) -> None:
        self.pin.release()


class EnvironmentPreparer:
    """Prepares the environments of one worker process's attempts."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        store: ArtifactStore,
        plan: Callable[[], SandboxPlan],
        builder_id: str,
    ) -> None:
        """``plan``: the worker's sandbox (the build runs in it); ``builder_id``: this worker
        process, as the environments row names its builder (default: host:pid)."""
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.plan = plan
        self.builder_id = builder_id or f"{socket.gethostname()}:{os.getpid()}"
        self.cache = EnvironmentCache(settings.resolved_env_cache_dir, settings.env_cache_bytes)

    def prepare(
        self,
        job_id: str,
        attempt: int,
        requirements: Sequence[str],
        log: Log,
        interrupt: threading.Event | None = None,
    ) -> PreparedEnvironment:
        """The attempt's environment, in the cache and pinned; the job row names it. Raises
        :class:`~.uv_commands.PreparationInterrupted` when ``interrupt`` is set while it waits
        for another worker's build or another local process's install, or builds (uv killed,
        the row left for another builder)."""
        interrupt = interrupt if interrupt is not None else threading.Event()
        identity = environment_identity(requirements, settings=self.settings)
        name = f"ace3: environment {identity.short}"
        how = "reused"
        for _ in range(PIN_TRIES):
            pin = self.cache.pin_if_present(identity.hash, interrupt)
            if pin is not None:
                break
            self._set_phase(job_id, attempt, PHASE)
            with self.cache.installing(identity.hash, interrupt) as present:
                if not present:
                    how = self._obtain(identity, log, interrupt)
        else:
            raise RuntimeError(f"{name} was evicted from the cache as soon as it was installed")
        try:
            if how == "reused":
                log(f"{name}: reused from the cache")
            with self.sessions() as session:
                registry.touch(session, identity.hash)
                session.execute(job_transitions.record_environment(job_id, attempt, identity.hash))
                session.commit()
        except BaseException:
            pin.release()
            raise
        return PreparedEnvironment(identity, pin, how)

    def _set_phase(self, job_id: str, attempt: int, phase: str | None) -> None:
        with self.sessions() as session:
            session.execute(job_transitions.set_phase(job_id, attempt, phase))
            session.commit()

    # -- who makes it: this worker, another one (then fetched), or nobody (refused) -------------
    def _obtain(self, identity: EnvironmentIdentity, log: Log, interrupt: threading.Event) -> str:
        """Build or fetch the environment into the cache (under its installing lock): which.
        Waits for another worker's build as long as its lease is live (no deadline of its own:
        the builder's timeout and lease bound it), fails only on a ``failed`` row."""
        name = f"ace3: environment {identity.short}"
        waited = False
        delay = WAIT_FIRST_SECONDS
        while True:
            with self.sessions() as session:
                if registry.insert_building(
                    session, identity, self.builder_id, self.settings.lease_seconds
                ):
                    return self._build(identity, log, interrupt)
                row = registry.read(session, identity.hash)
            if row is None:
                continue  # (given up meanwhile: insert it again and build it here)
            if row.state == EnvironmentState.READY and row.storage_key and row.sha256:
                try:
                    return self._fetch(identity, row.storage_key, row.sha256, log)
                except UNUSABLE_ARCHIVE as exc:
                    log(f"{name}: its stored archive cannot be used ({exc}); building it again")
                    if self._take_over(identity, EnvironmentState.READY, row.storage_key):
                        self._forget(row.storage_key)
                        return self._build(identity, log, interrupt)
                    continue
            if row.state == EnvironmentState.FAILED:
                error = row.error or "its build failed"
                if waited:
                    raise EnvironmentRefusedError(error)
                if self._take_over(identity, EnvironmentState.FAILED):
                    log(f"{name}: an earlier build failed ({error[:200]}); building it again")
                    return self._build(identity, log, interrupt)
                continue
            if row.state == EnvironmentState.BUILDING and not row.lease_live:
                if self._take_over(identity, EnvironmentState.BUILDING):
                    log(f"{name}: the build by {row.builder} stopped renewing; building it here")
                    return self._build(identity, log, interrupt)
                continue
            if not waited:
                log(f"{name}: waiting for its build by {row.builder}")
                waited = True
            if interrupt.wait(delay):
                raise PreparationInterrupted(f"{name}: stopped waiting for its build")
            delay = min(delay * 1.5, WAIT_MAX_SECONDS)

    def _take_over(
        self, identity: EnvironmentIdentity, from_state: str, storage_key: str | None = None
    ) -> bool:
        with self.sessions() as session:
            return registry.take_over(
                session,
                identity.hash,
                self.builder_id,
                self.settings.lease_seconds,
                from_state=from_state,
                storage_key=storage_key,
            )

    def _forget(self, key: str) -> None:
        """Delete an archive no row names any more (best effort: an orphan costs only space)."""
        try:
            self.store.delete(key)
        except Exception:
            logger.warning("could not delete the unused environment archive %s", key)

    # -- building -----------------------------------------------------------------------------
    def _build(self, identity: EnvironmentIdentity, log: Log, interrupt: threading.Event) -> str:
        """Build it here (this worker holds the row), store its archive, mark it ready, and
        install it in the cache. A refusal marks the row failed (waiters fail with it); an
        interrupt, or any other failure (which may pass: raised as
        :class:`~.uv_commands.EnvironmentBuildError`), gives the row up (deleted), so that the
        next job needing the environment builds it instead of failing."""
        name = f"ace3: environment {identity.short}"
        stop = threading.Event()
        renewer = threading.Thread(
            target=self._renew_while, args=(identity.hash, stop), daemon=True
        )
        renewer.start()
        try:
            try:
                with build_scratch(self.settings.resolved_work_dir) as scratch:
                    built = self._build_in(identity, scratch, log, interrupt)
            finally:
                stop.set()
                renewer.join(timeout=10)
        except PreparationInterrupted:
            self._give_up(identity)
            log(f"{name}: its build was stopped")
            raise
        except EnvironmentRefusedError as exc:
            self._mark_failed(identity, str(exc))
            raise
        except EnvironmentBuildError:
            self._give_up(identity)
            raise
        except Exception as exc:
            self._give_up(identity)
            raise EnvironmentBuildError(f"the worker could not build it: {exc}") from exc
        except BaseException:  # (the worker stopping: the row goes to the next builder)
            self._give_up(identity)
            raise
        added = ", ".join(pin.requirement for pin in built.pins) or "nothing to add"
        log(f"{name}: built in {built.seconds:.1f} s ({len(built.pins)} packages: {added})")
        return "built"

    def _build_in(
        self, identity: EnvironmentIdentity, scratch: Path, log: Log, interrupt: threading.Event
    ) -> BuiltTree:
        """Build, pack and (while the row is still this worker's) store and record the
        environment, then install it in the cache."""
        builder = EnvironmentBuilder(self.settings, self.plan(), log)
        builder.interrupt = interrupt
        built = builder.build(identity.requirements, scratch)
        archive = scratch / "environment.tar.gz"
        sha256, archive_bytes = pack(built.path, archive)
        key = storage_key(identity.hash, sha256)
        with self.sessions() as session:  # (right before uploading: still this worker's?)
            mine = registry.renew(
                session, identity.hash, self.builder_id, self.settings.lease_seconds
            )
        if mine:
            self.store.put_file(key, archive)
            with self.sessions() as session:
                mine = registry.mark_ready(
                    session,
                    identity.hash,
                    self.builder_id,
                    storage_key=key,
                    sha256=sha256,
                    archive_bytes=archive_bytes,
                    size_bytes=built.size_bytes,
                    packages=built.pins,
                    build_seconds=built.seconds,
                )
            if not mine:
                self._drop_late_upload(identity, key)
        if not mine:
            logger.warning("environment %s: its build lease was lost meanwhile", identity.hash)
            log(
                f"ace3: environment {identity.short}: another worker took its build over "
                "meanwhile; this job uses the tree built here, the cluster keeps that worker's"
            )
        # (kept even when lost: the same requirements over the same installed set and sources,
        # so the same packages as the row's archive; fetching that would only cost time)
        self._install(identity, archive)
        return built

    def _drop_late_upload(self, identity: EnvironmentIdentity, key: str) -> None:
        """The archive uploaded after the lease was lost is no row's: delete it, unless the
        row names the same key (two byte-identical builds)."""
        try:
            with self.sessions() as session:
                row = registry.read(session, identity.hash)
        except Exception:
            logger.warning("environment %s: could not read its row", identity.hash)
            return
        if row is None or row.storage_key != key:
            self._forget(key)

    def _renew_while(self, environment_hash: str, stop: threading.Event) -> None:
        every = min(self.settings.heartbeat_seconds, self.settings.lease_seconds / 3)
        while not stop.wait(every):
            try:
                with self.sessions() as session:
                    if not registry.renew(
                        session, environment_hash, self.builder_id, self.settings.lease_seconds
                    ):
                        logger.warning("environment %s: its build lease was lost", environment_hash)
            except Exception:
                logger.warning("environment %s: could not renew its build lease", environment_hash)

    def _give_up(self, identity: EnvironmentIdentity) -> None:
        try:
            with self.sessions() as session:
                registry.release(session, identity.hash, self.builder_id)
        except Exception:  # (its lease then expires, and a waiter takes it over)
            logger.exception("environment %s: could not give up its build", identity.hash)

    def _mark_failed(self, identity: EnvironmentIdentity, reason: str) -> None:
        try:
            with self.sessions() as session:
                registry.mark_failed(session, identity.hash, self.builder_id, reason)
        except Exception:
            logger.exception("environment %s: could not record its failure", identity.hash)

    # -- fetching and installing ------------------------------------------------------------
    def _fetch(self, identity: EnvironmentIdentity, key: str, sha256: str, log: Log) -> str:
        """Fetch the row's archive and install it. An archive that cannot be used raises one of
        :data:`UNUSABLE_ARCHIVE` (the caller builds it again); one larger than this worker
        allows, :class:`~.uv_commands.EnvironmentRefusedError`; anything else (the store
        unreachable, the disk full), :class:`~.uv_commands.EnvironmentBuildError`."""
        started = time.monotonic()
        archive = self.cache.scratch_archive(identity.hash)
        try:
            self.store.fetch(key, archive, sha256)  # (verified against the row's sha256)
            size = self._install(identity, archive)
        except UNUSABLE_ARCHIVE:
            raise
        except ArchiveTooLargeError as exc:
            raise EnvironmentRefusedError(str(exc)) from exc
        except Exception as exc:
            raise EnvironmentBuildError(f"could not fetch it from the store: {exc}") from exc
        finally:
            archive.unlink(missing_ok=True)
        log(
            f"ace3: environment {identity.short}: fetched from the store in "
            f"{time.monotonic() - started:.1f} s ({size} bytes)"
        )
        return "fetched"

    def _install(self, identity: EnvironmentIdentity, archive: Path) -> int:
        """Unpack a verified archive into the cache (the caller holds its installing lock)."""
        unpacked = self.cache.scratch(identity.hash)
        try:
            size = unpack(archive, unpacked, self.settings.env_max_bytes)
            take_ownership(unpacked)
            self.cache.install(identity.hash, unpacked, size)
        finally:
            remove_tree(unpacked)
        return size
