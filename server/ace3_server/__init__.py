"""ACE3 API server: FastAPI app, SQLAlchemy models, services, storage and auth (no torch here)."""

from ace3._version import __version__

__all__ = ["__version__"]
