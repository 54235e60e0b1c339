"""The sparse FFN as a PyTorch custom operator, so ``torch.compile`` can capture it without a graph break.

``torch.ops.twell.sparse_gated_ffn(x, w_gate, w_up, w_down, tile, capacity, precision, method, backend)``
(``capacity`` 0 = the tile's default) returns
``(out [M, d], counts [M, ceil(F / tile)] int32)`` and dispatches exactly like
:func:`twell.ops.sparse_gated_ffn` (Triton on CUDA, the PyTorch reference elsewhere).  Its fake
(meta) implementation gives torch.compile the output shapes without running anything.  The op has
no autograd formula: it is the inference path (training goes through the sparse autograd function).

``torch.ops.twell.hot_cold_gated_ffn(x, w_gate, w_up, w_down, hot, cold, w_gemm, w_down_hot_t, tile,
capacity, backend)`` is the same for the hot/cold split (``twell.ops.hot_cold``), the plan passed as
its four tensors; its counts are per (row, tile of cold columns, then of hot units).
"""

from __future__ import annotations

import torch

from .hot_cold_plan import HotColdPlan
from .inference import hot_cold_gated_ffn as _hot_cold_gated_ffn
from .inference import sparse_gated_ffn as _sparse_gated_ffn


@torch.library.custom_op("twell::sparse_gated_ffn", mutates_args=())
def sparse_gated_ffn_op(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    tile: int,
    capacity: int,
    precision: str,
    method: str,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    out, counts = _sparse_gated_ffn(
        x, w_gate, w_up, w_down, tile=tile, capacity=capacity or None, precision=precision, method=method,
        backend=backend, return_counts=True,
    )
    return out, counts.contiguous()


@sparse_gated_ffn_op.register_fake
def _(x, w_gate, w_up, w_down, tile, capacity, precision, method, backend):  # noqa: ANN001, ANN202 - signature fixed by the op
    n_tiles = -(-w_gate.shape[0] // tile)
    out = x.new_empty((x.shape[0], w_down.shape[0]))
    counts = x.new_empty((x.shape[0], n_tiles), dtype=torch.int32)
    return out, counts


@torch.library.custom_op("twell::hot_cold_gated_ffn", mutates_args=())
def hot_cold_gated_ffn_op(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    hot: torch.Tensor,
    cold: torch.Tensor,
    w_gemm: torch.Tensor,
    w_down_hot_t: torch.Tensor,
    tile: int,
    capacity: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``twell.ops.hot_cold_gated_ffn`` with the plan passed as its four tensors."""
    plan = HotColdPlan(hot=hot, cold=cold, w_gemm=w_gemm, w_down_hot_t=w_down_hot_t)
    out, counts = _hot_cold_gated_ffn(x, w_gate, w_up, w_down, plan, tile=tile, capacity=capacity or None,
                                      backend=backend, return_counts=True)
    return out, counts.contiguous()


@hot_cold_gated_ffn_op.register_fake
def _(x, w_gate, w_up, w_down, hot, cold, w_gemm, w_down_hot_t, tile, capacity, backend):  # noqa: ANN001, ANN202
    n_tiles = -(-cold.shape[0] // tile) + -(-hot.shape[0] // tile)
    out = x.new_empty((x.shape[0], w_down.shape[0]))
    counts = x.new_empty((x.shape[0], n_tiles), dtype=torch.int32)
    return out, counts
