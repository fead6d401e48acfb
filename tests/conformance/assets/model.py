"""The conformance suite's model file: an MLP for scikit-learn's 8x8 digits.

Its layers are an nn.Sequential (so gradient checkpointing applies) with a BatchNorm layer (so
the AMP levels' BatchNorm handling runs) and dropout (so the dropout override applies).
"""

from torch import nn


def build_model(hidden: int = 64, dropout: float = 0.1) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.BatchNorm1d(hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )
