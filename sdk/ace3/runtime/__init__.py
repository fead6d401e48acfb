"""ACE3 training engine: the code that runs inside every torchrun rank.

Entry point: ``torchrun ... -m ace3.runtime --job JOB_DIR/job.json`` (see ``docs/runtime.md``).
This package is the only place in ``ace3`` that imports torch; importing it does not.
"""
