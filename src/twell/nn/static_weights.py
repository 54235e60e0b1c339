"""Every sparse layer of a model ready for recorded calls that read cached weight copies: the recipe's one call.

Recording a model under ``torch.compile(mode="reduce-overhead")`` inside ``static_dispatch(cached_weights=True)`` needs
:meth:`SparseGatedMLP.prepare_static_weights` on each of its layers after the last weight change (README, "Use"); a
1.5B model has 28 of them, and a layer left out would build its copies in the graph on every call (H100, session 47:
the recorded forward 1.94 ms slower at 4096 tokens without the copies, bench_results/h100/session47_runs.md)."""

from __future__ import annotations

import torch

from .mlp import SparseGatedMLP


def prepare_static_weights(model: torch.nn.Module) -> list[bool]:
    """Call :meth:`SparseGatedMLP.prepare_static_weights` on every :class:`SparseGatedMLP` in ``model`` (itself
    included), in ``model.modules()`` order, and return their answers: True where the layer's hot/cold copies are
    ready, False where it has no hot set or does not run the split (its TwELL calls still read its cached Wd^T).

    Raises ``TypeError`` for anything but an ``nn.Module`` and ``ValueError`` when ``model`` holds no
    ``SparseGatedMLP`` (nothing would read cached copies: most likely the model was not converted)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    layers = [m for m in model.modules() if isinstance(m, SparseGatedMLP)]
    if not layers:
        raise ValueError(f"{type(model).__name__} holds no SparseGatedMLP layer: convert its MLPs first "
                         "(SparseGatedMLP.from_dense, or twell's Hugging Face models)")
    return [m.prepare_static_weights() for m in layers]
