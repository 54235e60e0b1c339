"""The sparse FFN as a PyTorch custom operator, so ``torch.compile`` can capture it without a graph break.

``torch.ops.twell.sparse_gated_ffn(x, w_gate, w_up, w_down, tile, capacity, precision, method, backend)``
(``capacity`` 0 = the tile's default) returns
``(out [M, d], counts [M, ceil(F / tile)] int32)`` and dispatches exactly like
:func:`twell.ops.sparse_gated_ffn` (Triton on CUDA, the PyTorch reference elsewhere).  Its fake
(meta) implementation gives torch.compile the output shapes without running anything.  The op has
no autograd formula: it is the inference path (training goes through the sparse autograd function).

``torch.ops.twell.hot_cold_gated_ffn(x, w_gate, w_up, w_down, hot, cold, w_gemm, w_down_hot_t, tile,
capacity, backend, fused_tile=0, dense_rows=0, residual=None)`` is the same for the hot/cold split
(``twell.ops.hot_cold``), the plan passed as its four tensors and its ``fused_tile``; its counts are per
(row, tile of cold columns, then of hot units); with ``residual`` its output is ``residual + FFN(x)``.

``torch.ops.twell.decode_gated_ffn_unchecked(x, w_gate, w_up, w_down_t, precision, backend)`` is the
small-batch path (``twell.ops.decode``, 1 to 64 tokens): ``(out [M, d], counts [M, ceil(F / 16)])``.

``torch.ops.twell.sparse_gated_ffn_unchecked``, ``torch.ops.twell.hot_cold_gated_ffn_unchecked`` and the
decode op are the same computations for a caller that has validated everything already (``SparseGatedMLP``
checks its weights once per weight change and ``x`` per call): they skip the ops' input checks and
take Wd^T ([F, d], contiguous) directly, a resolved backend (``"torch"`` or ``"triton"``) and a
resolved capacity (> 0).  On the CPU (d=64, F=256, Triton launches stubbed out, so host time only;
``scripts/module_overhead.py``) that took ``sparse_gated_ffn`` from 51.8 to 30.5 us per call at
M=1 and ``hot_cold_gated_ffn`` from 100.8 to 81.2 us at M=16.  Wrong inputs to the unchecked ops
give undefined results, so they are not part of the public API.
"""

from __future__ import annotations

import torch

from ..reference import inference as _ref
from . import inference as _inference
from .decode_kernels import _HIDDEN_BU as _DECODE_BU
from .decode_kernels import decode_blocks
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


def _fake_sparse(x: torch.Tensor, w_gate: torch.Tensor, d: int, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    n_tiles = -(-w_gate.shape[0] // tile)
    out = x.new_empty((x.shape[0], d))
    counts = x.new_empty((x.shape[0], n_tiles), dtype=torch.int32)
    return out, counts


@sparse_gated_ffn_op.register_fake
def _(x, w_gate, w_up, w_down, tile, capacity, precision, method, backend):  # noqa: ANN001, ANN202 - signature fixed by the op
    return _fake_sparse(x, w_gate, w_down.shape[0], tile)


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
    fused_tile: int = 0,
    dense_rows: int = 0,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``twell.ops.hot_cold_gated_ffn`` with the plan passed as its four tensors and its ``fused_tile``."""
    plan = HotColdPlan(hot=hot, cold=cold, w_gemm=w_gemm, w_down_hot_t=w_down_hot_t, fused_tile=fused_tile)
    out, counts = _hot_cold_gated_ffn(x, w_gate, w_up, w_down, plan, tile=tile, capacity=capacity or None,
                                      backend=backend, return_counts=True, dense_rows=dense_rows, residual=residual)
    return out, counts.contiguous()


def _fake_hot_cold(x: torch.Tensor, hot: torch.Tensor, cold: torch.Tensor, d: int,
                   tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    n_tiles = -(-cold.shape[0] // tile) + -(-hot.shape[0] // tile)
    out = x.new_empty((x.shape[0], d))
    counts = x.new_empty((x.shape[0], n_tiles), dtype=torch.int32)
    return out, counts


@hot_cold_gated_ffn_op.register_fake
def _(x, w_gate, w_up, w_down, hot, cold, w_gemm, w_down_hot_t, tile, capacity, backend,  # noqa: ANN001, ANN202
      fused_tile=0, dense_rows=0, residual=None):  # noqa: ANN001
    return _fake_hot_cold(x, hot, cold, w_down.shape[0], tile)


# ---------------------------------------------------------------------------------------- unchecked twins
@torch.library.custom_op("twell::sparse_gated_ffn_unchecked", mutates_args=())
def sparse_gated_ffn_unchecked_op(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    tile: int,
    capacity: int,
    precision: str,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sparse_gated_ffn`` with ``method="auto"`` for validated inputs (see the module docs).

    ``x`` [M >= 1, d], ``w_gate``/``w_up`` [F, d] contiguous, ``w_down_t`` = Wd^T [F, d] contiguous,
    all of one float dtype and device; ``capacity`` > 0; ``backend`` "torch" or "triton".
    """
    if backend == "torch":  # the reference does far more host work than its checks: keep one code path
        out, counts = _sparse_gated_ffn(x, w_gate, w_up, w_down_t.t(), tile=tile, capacity=capacity,
                                        precision=precision, backend="torch", return_counts=True)
        return out, counts.contiguous()
    # The gate of impl="auto": the cuBLAS GEMM then the pack kernel on CUDA, the fused kernel elsewhere.
    gate = "gemm+pack" if x.device.type == "cuda" else "fused"
    return _triton_sparse_ffn(x, w_gate, w_up, w_down_t, tile, capacity, precision == "match", gate)


def _triton_sparse_ffn(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, tile: int, capacity: int,
    round_hidden: bool, gate: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``ops.sparse_gated_ffn`` runs on the Triton backend with ``method="auto"`` and ``impl=gate``.

    The choices mirror ``twell.ops.inference`` (read from it at call time where they are constants);
    ``tests/test_nn_overhead.py`` checks both methods and both gates against the public op, bit for bit.
    """
    m = x.shape[0]
    if m >= _inference.BLOCK_UNION_MIN_TOKENS:
        from .block_union_kernel import launch_block_union_ffn

        g = torch.nn.functional.linear(x, w_gate)
        return launch_block_union_ffn(x, g, w_up, w_down_t, round_hidden=round_hidden, tile=tile)
    from .gate_kernel import launch_gate_twell, launch_pack_twell
    from .twell_ffn_kernel import launch_twell_ffn

    if gate == "gemm+pack":
        values, indices, counts = launch_pack_twell(torch.nn.functional.linear(x, w_gate), tile, capacity)
    else:
        values, indices, counts = launch_gate_twell(x, w_gate, tile, capacity)
    out = torch.empty((m, w_down_t.shape[1]), dtype=x.dtype, device=x.device)
    launch_twell_ffn(x, values, indices, counts, None, None, w_gate, w_up, w_down_t, n_cols=w_gate.shape[0],
                     tile=tile, round_hidden=round_hidden, out=out)
    return out, counts


@sparse_gated_ffn_unchecked_op.register_fake
def _(x, w_gate, w_up, w_down_t, tile, capacity, precision, backend):  # noqa: ANN001, ANN202
    return _fake_sparse(x, w_gate, w_down_t.shape[1], tile)


@torch.library.custom_op("twell::hot_cold_gated_ffn_unchecked", mutates_args=())
def hot_cold_gated_ffn_unchecked_op(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    hot: torch.Tensor,
    cold: torch.Tensor,
    w_gemm: torch.Tensor,
    w_down_hot_t: torch.Tensor,
    tile: int,
    capacity: int,
    backend: str,
    fused_tile: int = 0,
    dense_rows: int = 0,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``hot_cold_gated_ffn`` for validated inputs (as ``sparse_gated_ffn_unchecked``; the plan built for
    these weights, ``w_gemm`` in the fused gate layout when ``fused_tile``; ``dense_rows`` >= 0; ``residual``
    None or [M, d] contiguous in x's dtype: the output is then ``residual + FFN(x)``)."""
    if backend == "torch":
        out, counts = _ref.hot_cold_gated_ffn(x, w_gate, w_up, w_down_t.t(), hot, cold, tile=tile)
        return (out if residual is None else out + residual), counts.contiguous()
    from .hot_cold import launch_hot_cold_ffn

    plan = HotColdPlan(hot=hot, cold=cold, w_gemm=w_gemm, w_down_hot_t=w_down_hot_t, fused_tile=fused_tile)
    return launch_hot_cold_ffn(x, plan, w_gate, w_up, w_down_t, tile=tile, capacity=capacity, dense_rows=dense_rows,
                               residual=residual)


@hot_cold_gated_ffn_unchecked_op.register_fake
def _(x, w_gate, w_up, w_down_t, hot, cold, w_gemm, w_down_hot_t, tile, capacity, backend,  # noqa: ANN001, ANN202
      fused_tile=0, dense_rows=0, residual=None):  # noqa: ANN001
    return _fake_hot_cold(x, hot, cold, w_down_t.shape[1], tile)


@torch.library.custom_op("twell::decode_gated_ffn_unchecked", mutates_args=())
def decode_gated_ffn_unchecked_op(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    precision: str,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``decode_gated_ffn`` for validated inputs: x [1 <= M <= 64, d], Wg/Wu/Wd^T [F >= 1, d] contiguous, one
    dtype and device; also the active units per (token, block of 16 units)."""
    if backend == "torch":
        g = _ref.gate_preactivation(x, w_gate)  # once: for the output and the counts
        return (_ref.dense_gated_ffn_from_gate(x, g, w_up, w_down_t.t(), precision=precision),
                _ref.tile_counts(g, _DECODE_BU))
    from .decode import launch_decode_ffn

    return launch_decode_ffn(x, w_gate, w_up, w_down_t, match=precision == "match")


@decode_gated_ffn_unchecked_op.register_fake
def _(x, w_gate, w_up, w_down_t, precision, backend):  # noqa: ANN001, ANN202
    m = x.shape[0]
    return (x.new_empty((m, w_down_t.shape[1])),
            x.new_empty((m, decode_blocks(w_gate.shape[0])), dtype=torch.int32))
