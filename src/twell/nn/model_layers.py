"""The :class:`SparseGatedMLP` layers of a model, for the helpers that act on all of them at once."""

from __future__ import annotations

import torch

from .mlp import SparseGatedMLP


def sparse_layers(model: torch.nn.Module) -> list[SparseGatedMLP]:
    """Every :class:`SparseGatedMLP` in ``model`` (itself included), in ``model.modules()`` order.

    Raises ``TypeError`` for anything but an ``nn.Module`` and ``ValueError`` when there is none (most likely the model
    was not converted)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    layers = [m for m in model.modules() if isinstance(m, SparseGatedMLP)]
    if not layers:
        raise ValueError(f"{type(model).__name__} holds no SparseGatedMLP layer: convert its MLPs first "
                         "(SparseGatedMLP.from_dense, or twell's Hugging Face models)")
    return layers
