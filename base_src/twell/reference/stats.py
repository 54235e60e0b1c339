"""Sparsity statistics of an activation ``[M, F]`` (dense tensor or :class:`TwellTensor`).

Conventions chosen so that the statistics can be logged every step without special cases:

* "non-zero" means ``!= 0``; NaN counts as a non-zero (as in the TwELL container).
* Means over rows of an empty batch (M = 0) are 0, not NaN.
* Counts are reduced in int64 and only then divided, so the float results are exact up to the
  final division whatever M and F are.
"""

from __future__ import annotations

import torch

from .._validation import FLOAT_DTYPES, check_tensor
from ..format.twell import TwellTensor

__all__ = ["dead_units", "l0", "l1", "row_l0", "unit_frequency"]

Activation = torch.Tensor | TwellTensor


def _check_act(act: object, name: str = "act") -> None:
    if isinstance(act, TwellTensor):
        return
    check_tensor(act, name, ndim=2)


def _unit_counts(act: Activation) -> torch.Tensor:
    """[F] int64: number of rows in which each unit is non-zero."""
    if isinstance(act, TwellTensor):
        # Entries are unique (row, col) pairs, so counting columns counts rows per unit.
        _, cols, _ = act.entries()
        return torch.bincount(cols, minlength=act.n_cols).to(torch.int64)
    return (act != 0).sum(dim=0, dtype=torch.int64)


def row_l0(act: Activation) -> torch.Tensor:
    """Non-zeros per row: [M] int64."""
    _check_act(act)
    if isinstance(act, TwellTensor):
        return act.row_nnz()
    return (act != 0).sum(dim=1, dtype=torch.int64)


def l0(act: Activation) -> torch.Tensor:
    """Mean number of non-zeros per row, a float32 scalar tensor (0 for M = 0).

    Returned as a tensor (not a Python float) so that logging it does not force a device sync.
    """
    _check_act(act)
    m = act.shape[0]
    total = row_l0(act).sum()
    return (total.to(torch.float64) / max(1, m)).to(torch.float32)


def l1(h: Activation) -> torch.Tensor:
    """Mean over rows of ``sum_j |h_j|``: the L1 penalty with the published normalisation.

    The sum runs over units and the mean over rows (tokens), so the penalty does not shrink as F
    grows.  Accumulated and returned in float32 (float64 for float64 input), as a scalar tensor; for a
    dense tensor it is differentiable, so it can be used directly as a loss term.  0 for M = 0.
    """
    if isinstance(h, TwellTensor):
        vals = h.entries()[2]
        m = h.n_rows
    else:
        check_tensor(h, "h", ndim=2, dtypes=FLOAT_DTYPES)
        vals = h
        m = h.shape[0]
    acc = torch.float64 if vals.dtype == torch.float64 else torch.float32
    return vals.abs().to(acc).sum(dtype=acc) / max(1, m)


def unit_frequency(act: Activation) -> torch.Tensor:
    """Fraction of rows in which each unit is non-zero: [F] float32 (all 0 for M = 0)."""
    _check_act(act)
    m = act.shape[0]
    return (_unit_counts(act).to(torch.float64) / max(1, m)).to(torch.float32)


def dead_units(act: Activation) -> torch.Tensor:
    """[F] bool: units that are zero in every row of ``act`` (every unit, trivially, when M = 0)."""
    _check_act(act)
    return _unit_counts(act) == 0
