"""Live event streams, polled vs pushed: database load and delivery delay as watchers grow.

N clients (1, 50, 200) follow one running job's SSE stream while metrics are inserted through
the worker's ingest code (``ace3_worker.reports.store_metrics``, one row per step at
``--rate`` steps/s for ``--seconds``), on the real API over Postgres and Redis, once with
``ACE3_STREAM_WAKE=poll`` (every stream reads every 0.25 s: the behaviour before) and once with
``notify`` (Postgres LISTEN/NOTIFY wakes the streams, which share their reads). Measured:

- statements/s the API process executed while the metrics were inserted (every statement
  SQLAlchemy sent, counted in the API: ``counting_server.py``), and
- the delay from a metric row's ``created_at`` (set by the writer at its insert) to its
  arrival at a client (median, p99 over all clients and rows).

The clients run in another process (one asyncio loop, plain sockets); a stream that ends without
``end`` (say the pool timed out) reconnects with ``Last-Event-ID``. Writing starts once every
client has its first event, or after 60 s with those that have ("in time": connected by then /
saw the ``end`` within 60 s of it); "received" counts the rows that reached the clients.

    .venv/bin/python benchmarks/streams.py [--clients 1 50 200] [--rate 10] [--seconds 10]

Needs Postgres (``ACE3_TEST_DATABASE_ADMIN_URL``) and Redis (``ACE3_BENCH_REDIS_URL``), as the
tests do. Goal (issue 15): the load flat in N, p99 under 250 ms at N = 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from datetime import UTC
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pg_stack

CONNECT_SECONDS = 60.0
END_SECONDS = 60.0
HEADER = (
    f"{'clients':>7} {'wake':>6} {'queries/s':>10} {'median ms':>10} {'p99 ms':>8} "
    f"{'received':>9} {'reconnects':>10} {'in time':>8}"
)


def _row(r: dict[str, Any]) -> str:
    return (
        f"{r['clients']:>7} {r['mode']:>6} {r['queries_per_s']:>10.1f} "
        f"{r['median_ms']:>10.1f} {r['p99_ms']:>8.1f} {r['received']:>9.1%} "
        f"{r['reconnects']:>10} {r['connected']:>4}/{r['ended']:<3}"
    )


async def _follow(
    address: tuple[str, int], path: str, key: str, arrivals: dict[int, float], ready: asyncio.Event
) -> int:
    """Follows the job to its ``end`` over a plain HTTP/1.1 connection (a lean client: the
    delays measure the server, not a client library's parsing); returns its reconnects.

    Each of the server's writes is one chunk that ends an event, so SSE lines never straddle
    chunks and the chunk-size lines are simply lines that match nothing below."""
    last_id: str | None = None
    reconnects = -1
    while True:
        reconnects += 1
        resume = f"Last-Event-ID: {last_id}\r\n" if last_id else ""
        event = ""
        try:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {address[0]}\r\nAuthorization: Bearer {key}\r\n"
                f"Accept: text/event-stream\r\n{resume}\r\n".encode()
            )
            while line := await reader.readline():
                if line.startswith(b"id: "):
                    last_id = line[4:].strip().decode()
                elif line.startswith(b"event: "):
                    event = line[7:].strip().decode()
                elif line.startswith(b"data: "):
                    if event == "metric":
                        arrivals.setdefault(json.loads(line[6:])["step"], time.time())
                    elif event == "state":
                        ready.set()
                    elif event == "end":
                        writer.close()
                        return reconnects
            writer.close()
        except OSError:
            await asyncio.sleep(0.5)


async def _clients_main(base_url: str, key: str, job_id: str, n: int, pipe: Any) -> None:
    host, port = base_url.removeprefix("http://").split(":")
    path = f"/v1/jobs/{job_id}/events"
    arrivals: list[dict[int, float]] = [{} for _ in range(n)]
    readies = [asyncio.Event() for _ in range(n)]
    tasks = [
        asyncio.create_task(_follow((host, int(port)), path, key, arrivals[i], readies[i]))
        for i in range(n)
    ]
    # (a server that cannot serve them all: start with those it did serve in time)
    await asyncio.wait(
        [asyncio.ensure_future(ready.wait()) for ready in readies], timeout=CONNECT_SECONDS
    )
    pipe.send(sum(ready.is_set() for ready in readies))
    await asyncio.to_thread(pipe.recv)  # (the end was written: END_SECONDS to deliver it)
    done, pending = await asyncio.wait(tasks, timeout=END_SECONDS)
    for task in pending:
        task.cancel()
    reconnects = sum(task.result() for task in done)
    pipe.send((arrivals, reconnects, len(done)))


def _clients(base_url: str, key: str, job_id: str, n: int, pipe: Any) -> None:
    asyncio.run(_clients_main(base_url, key, job_id, n, pipe))


def _insert_metrics(database_url: str, job_id: str, rate: float, seconds: float) -> None:
    from ace3.config.events import MetricsRecord
    from ace3_control.db import make_sync_engine, sync_session_factory
    from ace3_worker.reports import store_metrics

    engine = make_sync_engine(database_url)
    factory = sync_session_factory(engine)
    steps = int(rate * seconds)
    started = time.monotonic()
    for step in range(1, steps + 1):
        with factory() as session:
            store_metrics(session, job_id, MetricsRecord(step=step, values={"loss": 1.0 / step}))
            session.commit()
        time.sleep(max(0.0, started + step / rate - time.monotonic()))
    engine.dispose()


def _finish(database_url: str, job_id: str) -> dict[int, float]:
    """Ends the job; returns each step's created_at (epoch seconds)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("UPDATE jobs SET state = 'succeeded' WHERE id = %s", (job_id,))
        rows = connection.execute(
            "SELECT step, created_at FROM job_metrics WHERE job_id = %s", (job_id,)
        ).fetchall()
    return {
        step: (created if created.tzinfo else created.replace(tzinfo=UTC)).timestamp()
        for step, created in rows
    }


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run(
    database_url: str, mode: str, n: int, rate: float, seconds: float, workers: int = 1
) -> dict[str, Any]:
    key, job_id = pg_stack.owner_key_and_job(database_url)
    with pg_stack.api(database_url, {"ACE3_STREAM_WAKE": mode}, workers=workers) as api:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        clients = context.Process(
            target=_clients, args=(api.base_url, key, job_id, n, child), daemon=True
        )
        clients.start()
        connected = parent.recv()
        time.sleep(1.0)  # (connections settled)
        before, started = api.queries(), time.monotonic()
        time.sleep(0.3)  # (the count file lags up to 0.2 s: read windows of equal lag)
        _insert_metrics(database_url, job_id, rate, seconds)
        time.sleep(0.3)
        after, elapsed = api.queries(), time.monotonic() - started
        created = _finish(database_url, job_id)
        parent.send("end")
        arrivals, reconnects, ended = parent.recv()
        clients.join(timeout=30)
    delays = [
        (arrived - created[step]) * 1000
        for client in arrivals
        for step, arrived in client.items()
        if step in created
    ]
    expected = n * len(created)
    return {
        "mode": mode,
        "clients": n,
        "queries_per_s": (after - before) / elapsed,
        "median_ms": statistics.median(delays) if delays else float("nan"),
        "p99_ms": _percentile(delays, 0.99) if delays else float("nan"),
        "received": len(delays) / expected if expected else 0.0,
        "reconnects": reconnects,
        "connected": connected,
        "ended": ended,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 50, 200])
    parser.add_argument("--rate", type=float, default=10.0, help="metric rows per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--modes", nargs="+", default=["poll", "notify"])
    parser.add_argument("--workers", type=int, default=1, help="API processes (ACE3_API_WORKERS)")
    args = parser.parse_args()
    results = []
    print(f"{args.rate:g} metric rows/s for {args.seconds:g} s, one job, "
          f"{args.workers} API process(es)", flush=True)  # fmt: skip
    print(HEADER, flush=True)
    with pg_stack.database() as database_url:
        for n in args.clients:
            for mode in args.modes:
                results.append(run(database_url, mode, n, args.rate, args.seconds, args.workers))
                print(_row(results[-1]), flush=True)


if __name__ == "__main__":
    main()
