"""Recorded eager calls for every sparse layer of a model: ``SparseGatedMLP.eager_graphs`` set in one call."""

from __future__ import annotations

import torch

from .call_graphs import DEFAULT_COUNTS
from .mlp import _check_eager_graphs
from .model_layers import sparse_layers

__all__ = ["DEFAULT_COUNTS", "graph_eager_calls"]


def graph_eager_calls(model: torch.nn.Module, counts: int = DEFAULT_COUNTS) -> int:
    """Set ``eager_graphs = counts`` on every :class:`SparseGatedMLP` in ``model`` (itself included; 0 turns the
    recordings off and drops them) and return how many layers that was.

    Raises ``TypeError`` for anything but an ``nn.Module``, ``ValueError`` for a count that is not an int >= 0 or a
    model holding no ``SparseGatedMLP`` (most likely not converted)."""
    layers = sparse_layers(model)
    _check_eager_graphs(counts)  # before any layer changes
    for layer in layers:
        layer.eager_graphs = counts
    return len(layers)
