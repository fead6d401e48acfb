"""The ``/openai/v1`` router: files and fine-tuning jobs."""

from __future__ import annotations

from fastapi import APIRouter

from ace3_server.openai_api.errors import PREFIX
from ace3_server.openai_api.files import router as files_router
from ace3_server.openai_api.jobs import router as jobs_router


def openai_router() -> APIRouter:
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    router.include_router(files_router)
    router.include_router(jobs_router)
    return router
