"""Sparse training op: the ReLU-gated FFN with an L1 penalty, forward and backward in Triton (issue 4, v1).

Same function and rounding rules as the oracle :class:`twell.reference.training.GatedFFNL1`:
``g = round(x Wg^T)``, ``a = relu(g)``, u and h = a u kept in fp32, ``out`` accumulated in fp32 and
rounded once, ``l1 = sum |h| / M`` in fp32, gradients accumulated in fp32 and returned in the
parameter dtype.  This is option 3 of docs/training-design.md ("unit-major gather"):

Forward
    1. ``g = F.linear(x, Wg)``: the one dense-by-dense product (cuBLAS on the GPU).  It lives only
       until the pack has run; it is not saved.
    2. Row-ELL pack (one program per token): the first W active units of each row (ids int32, gate
       values), the true count, the sentinel id F in slots without a pair.  W (``width``) is fixed by
       the caller, so no size depends on the data.
    3. Row kernel: u, h, ``out``, per-row L1 sums, and u [M, W] fp32 stored for the backward.  Rows with
       count > W ("overflowing") are computed densely over all F units in the same kernel from a
       recomputed gate: exact at any density, and no dense tensor has to be kept for them.
    4. ``l1 = row_l1.sum() / M``, ``l0 = counts.sum() / M``: fixed-size torch reductions (no atomics,
       no host synchronisation).

Saved for backward: x, Wg, Wu, Wd^T (the weights autograd holds anyway; Wd^T is a copy unless
``w_down`` is the transpose of a contiguous [F, d] tensor) and the row-ELL: ids [M, W] int32, a
[M, W] (input dtype), u [M, W] fp32, counts [M] int32.  Not the dense g; h is recomputed as a * u
(bitwise the forward's value).

Backward
    1. Row kernel: per ELL pair dh, du, dg (the last two stored [M, W] fp32) and dX; overflowing rows
       densely from the recomputed gate.
    2. Device-side transpose to unit-major order: ``torch.sort(ids.flatten(), stable=True)``.  The ELL
       is token-major and each row lists its units in increasing order, so a stable sort on the unit
       id alone yields (unit, token) order; sentinels (F) sort after every real pair.
       ``torch.searchsorted`` of 0..F in the sorted ids gives each unit's segment.  Both have sizes
       fixed by M, W and F.  The overflowing rows are listed the same way (a stable sort of the flag).
    3. Unit kernel, grid (F, K): program (j, k) sums slice k of unit j's segment into fp32 rows of
       dWd^T, dWg, dWu, then adds the overflowing rows' contributions for unit j (slice k of the
       overflow list, whose length it reads from device memory), recomputing their gate, u and dh.
       ``partials.sum(1)`` over the K slices (fixed order) finishes the reduction.

Costs and choices:

* Determinism: every sum runs in a fixed order (per-program loops, ``tl.sum`` trees fixed at compile
  time, torch's fixed-shape reductions and stable sort); no float atomics.  Same inputs -> same bits.
* Hot units: a unit active for nearly every token has a segment of ~M pairs; K slices bound the
  serial work per program to ~M / K gathers.  ``token_splits`` (K) defaults to min(4, ceil(M / 8192)):
  the partials take 12 K F d bytes (K = 4 at F=5632, d=2048: 550 MB), which is why K is capped.
* Overflowing rows cost a dense row of work each (F gathers of Wg, Wu, Wd^T rows in each row kernel,
  plus per unit kernel program one 3-dot recomputation per overflowing row): O(n_over F d), done with
  gathers rather than tensor cores.  W should be a few times the typical l0 so that overflow is rare
  (early positions of a sequence); W also sets the sort size (M W keys), so a W far above l0 costs
  sort time and [M, W] memory.  Default W = min(F, 256).
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import check_positive_int
from ..reference.inference import _check_gated_weights
from ._runtime import resolve_backend
from .inference import _unit_major
from .train_kernels import launch_backward_rows, launch_forward_rows, launch_pack_rows, launch_unit_grads

__all__ = ["DEFAULT_WIDTH", "TwellGatedFFNL1", "default_token_splits", "twell_gated_ffn_l1"]

#: Default row-ELL width W (capped at F): rows with more active units go to the dense fallback.
DEFAULT_WIDTH = 256
#: Token slices per unit in the weight-gradient kernel, at most (bounds the fp32 partials' memory).
MAX_TOKEN_SPLITS = 4
#: Tokens per slice the default aims at.
_TOKENS_PER_SPLIT = 8192
#: Dtypes the kernels take (no float64: the interpreter and the GPU path are fp32-accumulating).
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def default_token_splits(m: int) -> int:
    """K for M tokens: ceil(M / 8192), between 1 and :data:`MAX_TOKEN_SPLITS` (module docstring)."""
    return max(1, min(MAX_TOKEN_SPLITS, -(-m // _TOKENS_PER_SPLIT)))


def _dense_gate(x: torch.Tensor, w_gate: torch.Tensor) -> torch.Tensor:
    """``round(x Wg^T)`` in x's dtype with fp32 accumulation.

    On CUDA that is ``F.linear`` (cuBLAS accumulates half inputs in fp32; fp32 inputs need TF32 off,
    PyTorch's default for matmuls).  Under the interpreter the CPU computes it explicitly in fp32, so
    the result does not depend on how the CPU back-end implements half-precision matmuls.
    """
    if x.device.type == "cuda":
        return torch.nn.functional.linear(x, w_gate)
    return (x.float() @ w_gate.float().T).to(x.dtype)


class TwellGatedFFNL1(torch.autograd.Function):
    """``(out, l1) = TwellGatedFFNL1.apply(x, w_gate, w_up, w_down, width, token_splits, stats)``.

    ``width`` is the row-ELL width W (already capped at F), ``token_splits`` the K of the unit kernel;
    ``stats`` (a dict or None) receives ``"l0"`` as in the reference's side channel.  See the module
    docstring for the algorithm; inputs are validated by :func:`twell_gated_ffn_l1`.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        w_gate: torch.Tensor,
        w_up: torch.Tensor,
        w_down: torch.Tensor,
        width: int,
        token_splits: int,
        stats: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m, d = x.shape
        f = w_gate.shape[0]
        x = x.contiguous()
        w_gate = w_gate.contiguous()
        w_up = w_up.contiguous()
        w_down_t = _unit_major(w_down)
        if m == 0 or f == 0:
            ids = torch.zeros((m, 0), dtype=torch.int32, device=x.device)
            vals = torch.zeros((m, 0), dtype=x.dtype, device=x.device)
            u = torch.zeros((m, 0), dtype=torch.float32, device=x.device)
            counts = torch.zeros((m,), dtype=torch.int32, device=x.device)
            out = torch.zeros((m, d), dtype=x.dtype, device=x.device)
            row_l1 = torch.zeros((m,), dtype=torch.float32, device=x.device)
        else:
            g = _dense_gate(x, w_gate)
            ids, vals, counts = launch_pack_rows(g, width)
            del g
            out, u, row_l1 = launch_forward_rows(x, w_gate, w_up, w_down_t, ids, vals, counts)
        l1 = row_l1.sum() / max(1, m)
        ctx.save_for_backward(x, w_gate, w_up, w_down_t, ids, vals, u, counts)
        ctx.width = ids.shape[1]
        ctx.token_splits = token_splits
        if stats is not None:
            stats["l0"] = (counts.sum(dtype=torch.int64).to(torch.float64) / max(1, m)).to(torch.float32)
        return out, l1

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor, grad_l1: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        x, w_gate, w_up, w_down_t, ids, vals, u, counts = ctx.saved_tensors
        need_x, need_wg, need_wu, need_wd = ctx.needs_input_grad[:4]
        m, d = x.shape
        f = w_gate.shape[0]
        width = ctx.width
        nones = (None, None, None)
        if m == 0 or f == 0:
            shapes = (x.shape, w_gate.shape, w_up.shape, w_down_t.T.shape)
            needs = (need_x, need_wg, need_wu, need_wd)
            return tuple(
                torch.zeros(s, dtype=x.dtype, device=x.device) if need else None
                for s, need in zip(shapes, needs, strict=True)
            ) + nones

        grad_out = grad_out.to(x.dtype).contiguous()
        gl1 = grad_l1.detach().to(torch.float32).reshape(1).contiguous()
        dx, dg, du = launch_backward_rows(x, grad_out, w_gate, w_up, w_down_t, ids, vals, counts, u, gl1)

        dwg = dwu = dwd = None
        if need_wg or need_wu or need_wd:
            sorted_ids, perm = torch.sort(ids.reshape(-1), stable=True)
            bounds = torch.arange(f + 1, dtype=sorted_ids.dtype, device=x.device)
            starts = torch.searchsorted(sorted_ids, bounds)
            overflow = counts > width
            overflow_rows = torch.sort((~overflow).to(torch.int32), stable=True).indices
            n_overflow = overflow.sum(dtype=torch.int64).reshape(1)
            partials = launch_unit_grads(
                x, grad_out, w_gate, w_up, w_down_t, perm, starts, vals, u, dg, du,
                overflow_rows, n_overflow, gl1, splits=ctx.token_splits,
            )
            grads = partials.sum(1) if ctx.token_splits > 1 else partials[:, 0]
            dwd = grads[0].T.contiguous().to(w_down_t.dtype) if need_wd else None
            dwg = grads[1].to(w_gate.dtype) if need_wg else None
            dwu = grads[2].to(w_up.dtype) if need_wu else None
        return (dx if need_x else None), dwg, dwu, dwd, *nones


def twell_gated_ffn_l1(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    width: int | None = None,
    token_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse gated FFN with L1 penalty on the Triton kernels: ``(out [M, d], l1, l0)``.

    Same semantics as :func:`twell.reference.training.gated_ffn_l1`: ``out`` in the input dtype and
    ``l1`` in float32, both differentiable; ``l0`` (mean active units per token, float32) carries no
    gradient.  x [M, d]; w_gate, w_up [F, d]; w_down [d, F] (pass the transpose view of a contiguous
    [F, d] tensor to spare a copy per call).  Runs on CUDA tensors, or on the CPU under
    ``TRITON_INTERPRET=1``; float16, bfloat16 and float32.

    ``width``: row-ELL width W (default min(F, 256)); rows with more active units are computed densely,
    exactly.  ``token_splits``: slices per unit in the weight-gradient kernel (default
    :func:`default_token_splits`).  Neither changes the result beyond fp32 summation order.
    """
    _check_gated_weights(x, w_gate, w_up, w_down)
    if x.dtype not in _DTYPES:
        raise TypeError(
            f"the Triton training kernels take float16, bfloat16 or float32, got {str(x.dtype).replace('torch.', '')};"
            " use twell.reference.training.gated_ffn_l1 for float64"
        )
    resolve_backend("triton", x.device)
    f = w_gate.shape[0]
    w = min(f, DEFAULT_WIDTH) if width is None else min(f, check_positive_int(width, "width"))
    k = default_token_splits(x.shape[0]) if token_splits is None else check_positive_int(token_splits, "token_splits")
    stats: dict[str, torch.Tensor] = {}
    out, l1 = TwellGatedFFNL1.apply(x, w_gate, w_up, w_down, w, k, stats)
    return out, l1, stats["l0"]
