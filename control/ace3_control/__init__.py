"""ACE3 control plane: the state the API and the workers share (no HTTP, no torch here).

The database models and sessions, the job state transitions, the per-node rows of multi-node
jobs, capacity accounting, the artifact store, the Celery queue, the worker registry and the
settings both processes read. ``ace3_server`` (the HTTP app) and ``ace3_worker`` (the job
supervisor) import this package; it imports neither of them.
"""
