"""Modules the type checker reads (``[tool.mypy] files``) to pin what public calls return."""
