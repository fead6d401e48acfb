"""Benchmarks: scripts that print their figures (run them with the project's venv)."""
