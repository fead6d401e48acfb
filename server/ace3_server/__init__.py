"""ACE3 API server: FastAPI app, SQLAlchemy models, services, storage and auth (no torch here)."""

__version__ = "0.1.0"
