"""Helpers for writing your own search loops.

::

    for params in ace3.utils.grid_search({"learning_rate": [1e-4, 1e-3], "batch_size": [32, 64]}):
        result = ace3.Trainer(ace3.TrainingConfig(**params)).train(model, dataset)

For a search the service runs (Bayesian, random or grid, with pruning), see
:func:`ace3.hyperparameter_search`.
"""

from __future__ import annotations

from ace3.hp import grid_search

__all__ = ["grid_search"]
