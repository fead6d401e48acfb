"""The file torchrun runs (``--run-path``) in each rank a warm launcher forks:
:func:`ace3.runtime.process.forked_rank.run_rank`. Not a module to import."""

import sys

if __name__ == "__main__":
    from ace3.runtime.process.forked_rank import run_rank

    run_rank(sys.argv[1:])
