"""Sparse reference of the training forward/backward of the ReLU-gated FFN with an L1 penalty.

This is the oracle for the Triton training kernels, so it is written the way they work: the gate
``g = x Wg^T`` is the only dense-by-dense product; everything after it is evaluated only at the active
pairs ``(t, j)`` with ``a_tj = relu(g_tj) != 0``, and only sparse state is saved for the backward.

Forward (per token t, unit j)::

    g = round(x Wg^T)          dense, accumulated in fp32 (fp64), rounded to the input dtype
    a = relu(g)                 active pairs: a != 0 (a NaN gate counts as active, as in TwELL)
    u = x[t] . Wu[j]            active pairs only, fp32 (fp64)
    h = a * u                   fp32 (fp64), not rounded
    out[t] = sum_j h_tj Wd[:, j]  fp32 (fp64) accumulation, rounded once to the input dtype
    l1 = sum_tj |h_tj| / M      fp32 (fp64) scalar; 0 for M = 0

Rounding follows the "fp32" precision mode of :mod:`twell.reference.inference`: ``g`` is rounded
because the kernels store it in the input dtype, the rest stays wide.  ``l1`` is returned in the
accumulation dtype (float32 for half inputs): it is a loss term summed over all tokens and units, and
rounding it to bf16 would only lose information (its gradient does not depend on its value).

Backward on the active pattern only (``relu'(0) = 0`` as in PyTorch, so ``dg`` is kept where
``g > 0``; ``sign(0) = 0`` as in ``torch.abs``'s backward)::

    dh   = (grad_out @ Wd)[t, j] + grad_l1 * sign(h_tj) / M
    dWd[:, j] += grad_out[t] * h_tj
    du   = dh * a         da = dh * u         dg = da * [g > 0]
    dx[t]  += dg Wg[j] + du Wu[j]
    dWg[j] += dg x[t]     dWu[j] += du x[t]

All sums are accumulated in float32 (float64 for float64) and gradients are returned in the dtype of
the parameter they belong to.  Scatter-adds use ``index_add_``: deterministic on the CPU (pairs are
summed in a fixed order); on CUDA ``index_add_`` uses atomics and is only deterministic under
``torch.use_deterministic_algorithms(True)``.
"""

from __future__ import annotations

from typing import Any

import torch

from .inference import _acc_dtype, _check_gated_weights, _matmul_nt, _pair_dots, _scatter_scaled_rows

__all__ = ["GatedFFNL1", "dense_gated_ffn_l1", "gated_ffn_l1"]


class GatedFFNL1(torch.autograd.Function):
    """``(out, l1) = GatedFFNL1.apply(x, w_gate, w_up, w_down)``, computed and differentiated sparsely.

    An optional fifth argument ``stats`` (a dict, or None) receives ``stats["l0"]``, the mean number of
    active units per token (float32 scalar tensor, no gradient).  It is a side channel rather than a
    third output so that the Function's outputs are exactly the two differentiable ones; the public
    wrapper :func:`gated_ffn_l1` uses it to report l0 without recomputing the gate.

    Saved for backward: x and the three weights (which autograd keeps anyway) and, per active pair,
    its row, column, ``a`` (input dtype) and ``u`` (accumulation dtype): no dense ``[M, F]`` tensor.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        w_gate: torch.Tensor,
        w_up: torch.Tensor,
        w_down: torch.Tensor,
        stats: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_gated_weights(x, w_gate, w_up, w_down)
        if stats is not None and not isinstance(stats, dict):
            raise TypeError(f"stats must be a dict or None, got {type(stats).__name__}")
        dt = x.dtype
        acc = _acc_dtype(dt)
        m = x.shape[0]

        # The one dense product; the [M, F] tensors die at the end of this block.
        a_dense = torch.relu(_matmul_nt(x, w_gate, acc).to(dt))
        rows, cols = (a_dense != 0).nonzero(as_tuple=True)  # row-major: sorted by token, then unit
        a = a_dense[rows, cols]
        del a_dense

        u = _pair_dots(x, rows, w_up, cols, acc)
        h = a.to(acc) * u
        out = torch.zeros((m, x.shape[1]), dtype=acc, device=x.device)
        _scatter_scaled_rows(out, rows, h, w_down.T, cols)
        l1 = h.abs().sum() / max(1, m)

        ctx.save_for_backward(x, w_gate, w_up, w_down, rows, cols, a, u)
        ctx.n_rows = m
        if stats is not None:
            stats["l0"] = torch.tensor(rows.numel() / max(1, m), dtype=torch.float32, device=x.device)
        return out.to(dt), l1

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor, grad_l1: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None]:
        x, w_gate, w_up, w_down, rows, cols, a, u = ctx.saved_tensors
        m = ctx.n_rows
        acc = u.dtype
        need_x, need_wg, need_wu, need_wd = ctx.needs_input_grad[:4]

        go = grad_out.to(acc)
        a_acc = a.to(acc)
        h = a_acc * u
        # (grad_out @ Wd)[t, j] = grad_out[t] . Wd[:, j] = grad_out[t] . (Wd^T)[j]
        dh = _pair_dots(go, rows, w_down.T, cols, acc)
        dh = dh + grad_l1.to(acc) * torch.sign(h) / max(1, m)
        du = dh * a_acc
        dg = torch.where(a > 0, dh * u, torch.zeros((), dtype=acc, device=u.device))

        dx = dwg = dwu = dwd = None
        if need_x:
            dx_acc = torch.zeros(x.shape, dtype=acc, device=x.device)
            _scatter_scaled_rows(dx_acc, rows, dg, w_gate, cols)
            _scatter_scaled_rows(dx_acc, rows, du, w_up, cols)
            dx = dx_acc.to(x.dtype)
        if need_wg:
            dwg_acc = torch.zeros(w_gate.shape, dtype=acc, device=x.device)
            _scatter_scaled_rows(dwg_acc, cols, dg, x, rows)
            dwg = dwg_acc.to(w_gate.dtype)
        if need_wu:
            dwu_acc = torch.zeros(w_up.shape, dtype=acc, device=x.device)
            _scatter_scaled_rows(dwu_acc, cols, du, x, rows)
            dwu = dwu_acc.to(w_up.dtype)
        if need_wd:
            # Accumulate Wd^T ([F, d], one row per unit) so the scatter runs over units, then transpose.
            dwd_t = torch.zeros((w_down.shape[1], w_down.shape[0]), dtype=acc, device=x.device)
            _scatter_scaled_rows(dwd_t, cols, h, go, rows)
            dwd = dwd_t.T.contiguous().to(w_down.dtype)
        return dx, dwg, dwu, dwd, None


def gated_ffn_l1(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse gated FFN with L1 penalty: ``(out [M, d], l1 scalar, l0 scalar)``.

    ``out`` is in the input dtype, ``l1`` in float32 (float64 for float64 inputs), both differentiable
    through :class:`GatedFFNL1`; ``l0`` (mean active units per token, float32) carries no gradient.
    """
    stats: dict[str, torch.Tensor] = {}
    out, l1 = GatedFFNL1.apply(x, w_gate, w_up, w_down, stats)
    return out, l1, stats["l0"]


def dense_gated_ffn_l1(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same function as :func:`gated_ffn_l1` with plain dense autograd ops (the comparison baseline).

    Same rounding points (g rounded to the input dtype, everything else in the accumulation dtype, the
    output rounded once), so in float64 it agrees with the sparse version to rounding noise, and
    autograd's casts route the gradients back to the parameters' dtype.
    """
    _check_gated_weights(x, w_gate, w_up, w_down)
    dt = x.dtype
    acc = _acc_dtype(dt)
    m = x.shape[0]
    xa = x.to(acc)
    a = torch.relu((xa @ w_gate.to(acc).T).to(dt).to(acc))
    h = a * (xa @ w_up.to(acc).T)
    out = (h @ w_down.to(acc).T).to(dt)
    l1 = h.abs().sum() / max(1, m)
    l0 = ((a != 0).sum(dtype=torch.int64).to(torch.float64) / max(1, m)).to(torch.float32)
    return out, l1, l0
