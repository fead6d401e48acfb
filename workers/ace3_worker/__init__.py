"""ACE3 worker: a Celery app whose one task supervises a job's torchrun process group.

Torch is never imported here: it runs only inside the torchrun subprocess (``ace3.runtime``).
"""
