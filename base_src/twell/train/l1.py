"""The L1 sparsity penalty of the training recipe: coefficient schedule, penalty term, l0 read-out.

The published recipe ("Sparser, Faster, Lighter Transformer Language Models", arXiv 2603.23198) adds
``coef * L1`` to the language-modelling loss, with ``L1`` the per-layer penalty ``mean_t sum_j |h_tj|``
(what :class:`~twell.nn.SparseGatedMLP` stores as ``last_l1`` in a training forward), and a constant
coefficient of 2e-5 (1.5B model: 29 of 5632 units active per token and layer, no measurable loss).
3e-5 is the edge before accuracy drops, so the coefficient is a hyper-parameter to keep, not to tune
freely.  Here the per-layer penalties are *averaged* over the sparse layers, so the coefficient does
not have to change with depth.

Everything here is model-agnostic: the sparse layers are found with ``isinstance(m, SparseGatedMLP)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..nn.mlp import SparseGatedMLP

__all__ = ["DEFAULT_L1_COEF", "L1Schedule", "l1_term", "layer_l0", "mean_l0", "sparse_layers"]

#: The published coefficient (1.5B model, ~1e11 tokens).  Tiny CPU runs need a much larger one (see
#: :mod:`twell.train.demo` for the measured value): sparsity has to appear within a few hundred steps.
DEFAULT_L1_COEF = 2e-5


def sparse_layers(model: nn.Module) -> list[SparseGatedMLP]:
    """The model's :class:`SparseGatedMLP` layers, in module order (the order of ``model.modules()``)."""
    return [m for m in model.modules() if isinstance(m, SparseGatedMLP)]


@dataclass(frozen=True)
class L1Schedule:
    """L1 coefficient as a function of the optimizer step (0-based).

    ``coef`` is held constant (the published schedule) after an optional linear warm-up: with
    ``warmup_steps = N > 0`` the coefficient is ``coef * (step + 1) / N`` for ``step < N``, so step 0
    already has a small non-zero penalty and step ``N - 1`` reaches ``coef``.  A warm-up lets the
    language model form before the penalty starts pruning units (useful at the large coefficients a
    short run needs; the published runs use none).
    """

    coef: float = DEFAULT_L1_COEF
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.coef, (int, float)) and self.coef >= 0.0) or self.coef != self.coef:
            raise ValueError(f"coef must be a float >= 0, got {self.coef!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an int >= 0, got {self.warmup_steps!r}")

    def __call__(self, step: int) -> float:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if self.warmup_steps and step < self.warmup_steps:
            return float(self.coef) * (step + 1) / self.warmup_steps
        return float(self.coef)


def l1_term(model: nn.Module | list[SparseGatedMLP]) -> torch.Tensor:
    """Mean over the sparse layers of their ``last_l1`` (differentiable, float32 scalar).

    Needs a training forward (``model.train()``, grad enabled) first; raises otherwise with the layer
    named.  A model without sparse layers raises too: a zero penalty would hide a wiring mistake.
    """
    layers = model if isinstance(model, list) else sparse_layers(model)
    if not layers:
        raise ValueError("the model has no SparseGatedMLP layers, so there is no L1 term to compute")
    terms = []
    for i, layer in enumerate(layers):
        if layer.last_l1 is None:
            raise RuntimeError(
                f"sparse layer {i} has no last_l1: run a forward with model.train() and grad enabled first"
            )
        terms.append(layer.last_l1.float())
    return torch.stack(terms).mean()


def layer_l0(model: nn.Module | list[SparseGatedMLP]) -> list[float]:
    """``last_l0`` of every sparse layer as host floats (one device sync); NaN for a layer with none yet."""
    layers = model if isinstance(model, list) else sparse_layers(model)
    vals = [layer.last_l0 for layer in layers]
    known = [v for v in vals if v is not None]
    host = torch.stack([v.float() for v in known]).cpu().tolist() if known else []
    it = iter(host)
    return [float("nan") if v is None else next(it) for v in vals]


def mean_l0(model: nn.Module | list[SparseGatedMLP]) -> float:
    """Mean of :func:`layer_l0` over the layers that have one (NaN if none)."""
    vals = [v for v in layer_l0(model) if v == v]
    return sum(vals) / len(vals) if vals else float("nan")
