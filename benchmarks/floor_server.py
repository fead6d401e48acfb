"""The floor for benchmarks/api.py: a bare FastAPI endpoint doing one query (a job's row by
id, on the same async engine and driver as the API), no authentication, under uvicorn."""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from sqlalchemy import text

from ace3_control.db import make_async_engine


def app() -> FastAPI:
    engine = make_async_engine(os.environ["ACE3_DATABASE_URL"], application_name="ace3-floor")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await engine.dispose()

    floor = FastAPI(lifespan=lifespan)

    @floor.get("/healthz")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @floor.get("/v1/jobs/{job_id}")
    async def job(job_id: str) -> dict[str, Any]:
        async with engine.connect() as connection:
            row = (
                await connection.execute(
                    text("SELECT id, state, attempt FROM jobs WHERE id = :id"), {"id": job_id}
                )
            ).one()
        return dict(row._mapping)

    return floor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    uvicorn.run(
        "floor_server:app",
        factory=True,
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        log_level="warning",
        app_dir=os.path.dirname(os.path.abspath(__file__)),
    )


if __name__ == "__main__":
    main()
