"""Every sparse layer of a model ready for recorded calls that read cached weight copies: the recipe's one call.

Recording a model under ``torch.compile(mode="reduce-overhead")`` inside ``static_dispatch(cached_weights=True)`` needs
:meth:`SparseGatedMLP.prepare_static_weights` on each of its layers after the last weight change (README, "Use"); a
1.5B model has 28 of them, and a layer left out would build its copies in the graph on every call (H100, session 47:
the recorded forward 1.94 ms slower at 4096 tokens without the copies, bench_results/h100/session47_runs.md)."""

from __future__ import annotations

import torch

from .model_layers import sparse_layers


def prepare_static_weights(model: torch.nn.Module) -> list[bool]:
    """Call :meth:`SparseGatedMLP.prepare_static_weights` on every :class:`SparseGatedMLP` in ``model`` (itself
    included), in ``model.modules()`` order, and return their answers: True where the layer's hot/cold copies are
    ready, False where it has no hot set or does not run the split (its TwELL calls still read its cached Wd^T).

    Raises ``TypeError`` for anything but an ``nn.Module`` and ``ValueError`` when ``model`` holds no
    ``SparseGatedMLP`` (nothing would read cached copies: most likely the model was not converted)."""
    return [m.prepare_static_weights() for m in sparse_layers(model)]
