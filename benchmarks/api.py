"""API throughput on this machine: ``GET /v1/jobs/{id}`` and metric ingestion.

On the real API over Postgres (``pg_stack``), a load generator in another process (asyncio
over plain sockets, ``--connections`` 16 connections kept busy for ``--seconds``) measures
requests/s and p50/p99 latency of ``GET /v1/jobs/{id}`` in the configurations the issue names: one server
process with the key looked up on every request (the issue's baseline setup: two database round
trips), one process with the short-lived key cache (``ACE3_API_KEY_CACHE_SECONDS``), and
``--workers`` processes with it (``ACE3_API_WORKERS``); ``/healthz`` (one ``SELECT 1``); and, as
the floor, a bare FastAPI endpoint doing one query (``floor_server.py``). Then metric ingestion:
points/s into ``job_metrics`` through the worker's ingest code (``store_metrics``, records of 10
values), committed per record and per 50 records.

    .venv/bin/python benchmarks/api.py [--seconds 8] [--connections 16] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pg_stack

WARMUP_SECONDS = 1.0


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    """One keep-alive HTTP/1.1 GET; returns the status."""
    writer.write(request)
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


async def _load(url: str, key: str, connections: int, seconds: float) -> tuple[int, list[float]]:
    """``connections`` keep-alive connections, each sending its next request when the last
    answer is in (plain sockets: a lean generator, so the figures are the server's)."""
    address, _, path = url.removeprefix("http://").partition("/")
    host, port = address.split(":")
    request = (
        f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\r\n"
    ).encode()
    latencies: list[float] = []
    errors = 0

    async def one_connection(warm: float, until: float) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, int(port))
        while (started := time.monotonic()) < until:
            status = await _get(reader, writer, request)
            if started >= warm:
                latencies.append(time.monotonic() - started)
                errors += status != 200
        writer.close()

    warm = time.monotonic() + WARMUP_SECONDS
    await asyncio.gather(*(one_connection(warm, warm + seconds) for _ in range(connections)))
    return errors, latencies


def _load_process(url: str, key: str, connections: int, seconds: float, pipe: Any) -> None:
    pipe.send(asyncio.run(_load(url, key, connections, seconds)))


def measure(url: str, key: str, connections: int, seconds: float) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(
        target=_load_process, args=(url, key, connections, seconds, child), daemon=True
    )
    process.start()
    errors, latencies = parent.recv()
    process.join()
    ordered = sorted(latencies)
    return {
        "rps": len(ordered) / seconds,
        "p50": ordered[len(ordered) // 2] * 1000,
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000,
        "errors": errors,
    }


def ingest(database_url: str, job_id: str, per_commit: int, seconds: float) -> float:
    """Points/s stored by the worker's ingest code, ``per_commit`` records per transaction."""
    from ace3.config.events import MetricsRecord
    from ace3_control.db import make_sync_engine, sync_session_factory
    from ace3_worker.reports import store_metrics

    engine = make_sync_engine(database_url)
    factory = sync_session_factory(engine)
    values = {f"metric_{i}": float(i) for i in range(10)}
    step, points = 0, 0
    end = time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < end:
        with factory() as session:
            for _ in range(per_commit):
                step += 1
                store_metrics(session, job_id, MetricsRecord(step=step, values=values))
                points += len(values)
            session.commit()
    elapsed = time.monotonic() - started
    engine.dispose()
    return points / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    runs = [
        ("GET /v1/jobs/{id}, 1 process, no key cache", {"ACE3_API_KEY_CACHE_SECONDS": "0"}, 1,
         "counting_server.py", "job"),
        ("GET /v1/jobs/{id}, 1 process, key cache 5 s", {}, 1, "counting_server.py", "job"),
        (f"GET /v1/jobs/{{id}}, {args.workers} processes, key cache", {}, args.workers,
         "counting_server.py", "job"),
        ("/healthz, 1 process", {}, 1, "counting_server.py", "health"),
        ("floor: bare FastAPI, one query, 1 process", {}, 1, "floor_server.py", "job"),
        (f"floor: bare FastAPI, one query, {args.workers} processes", {}, args.workers,
         "floor_server.py", "job"),
    ]  # fmt: skip
    print(f"{args.connections} connections, {args.seconds:g} s each (after {WARMUP_SECONDS:g} s)")
    print(f"{'':52} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}", flush=True)
    with pg_stack.database() as database_url:
        key, job_id = pg_stack.owner_key_and_job(database_url)
        for label, env, workers, script, path in runs:
            env = {"ACE3_STREAM_WAKE": "notify", **env}
            with pg_stack.api(database_url, env, workers=workers, script=script) as api:
                url = (
                    f"{api.base_url}/v1/jobs/{job_id}"
                    if path == "job"
                    else f"{api.base_url}/healthz"
                )
                r = measure(url, key, args.connections, args.seconds)
            print(f"{label:52} {r['rps']:>7.0f} {r['p50']:>7.1f} {r['p99']:>7.1f} "
                  f"{r['errors']:>6}", flush=True)  # fmt: skip
        for per_commit in (1, 50):
            rate = ingest(database_url, job_id, per_commit, args.seconds)
            print(f"ingest: store_metrics, 10 values/record, {per_commit:>2} records/commit: "
                  f"{rate:>8.0f} points/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
