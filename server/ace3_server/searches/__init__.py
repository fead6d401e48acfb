"""Hyperparameter searches: Optuna for the algorithms, our tables for the state, a driver loop."""
