"""Triton kernels of the hot/cold op's dense-row pass (``twell.ops.hot_cold_dense_rows``): the rows' selection in two
launches, the gated product and the rows' write-back (with the residual) in one each.

Why: the pass ran ~20 PyTorch launches a layer: the selection's amax, compare, prefix sum, two masks, ``where``,
``zeros``, ``arange``, scatter and cast (~11), and around the three dense GEMMs the gathers, the ReLU, the product, the
residual's gather and add and the ``index_copy`` (~9 with a residual).  On an H100 the pass took ~0.07-0.08 ms a layer
at 8192 tokens (session 46, bench_results/h100/forward_layer_times_b4_callrecorded_session46.log: layers with a
budget against layer 19 without), while its GEMMs on 64 rows read ~70 MB of weights (~0.025 ms at ~3 TB/s): most of
the rest is small kernels, each a launch and a drain, and in session 47 the pass ran on 23 of the 1.5B model's 28
layers at 4096 tokens (bench_results/h100/session47_runs.md).  Here the selection is two kernels and the pass eight
launches in all (the two selection kernels, the row gather, three GEMMs, the product, the write-back).

The selection is :func:`twell.ops.hot_cold_dense_rows.select_overflow_rows`'s, bit for bit (its PyTorch twin):

1. :func:`_overflow_flags_kernel`, one program per ``BLOCK_M`` rows: each row's largest cold count against the
   capacity and its cold pairs (the counts' sum) against the heavy-row bound, written as an int8 flag (2: an
   overflowing tile, 1: heavy, 0: neither), and the block's numbers of overflowing and of heavy rows;
2. :func:`_overflow_ranks_kernel`, the same grid: each program sums the counts of the blocks before it (a loop over
   the ``cdiv(M, BLOCK_M)`` counts, at most 2048 at 524,288 tokens), ranks its overflowing rows by a prefix sum and
   its heavy rows after every overflowing one, keeps those ranked within the budget (the flags rewritten in place as
   0 / 1), writes their row numbers to their rank's slot, and program 0 fills the slots past the last rank with row 0.

Integer sums in a fixed order: deterministic.
"""

from __future__ import annotations

import torch

from ._runtime import cdiv, next_pow2, triton_available

__all__ = ["gated_product", "launch_select_overflow_rows", "scatter_rows"]

#: Rows per program of the selection kernels: 16 blocks at 4096 tokens, 512 at 131,072.
_SELECT_BLOCK_M = 256
#: Cold tiles per load step of the flags kernel (a 5632-unit layer has at most 44 cold tiles of 128: 3 steps).  At 64
#: the sm_90 build took 158 registers (a 256 x 64 tile over 128 threads), at 16 it takes 48 (compile_check).
_SELECT_BLOCK_T = 16
#: Block counts per load step of the ranks kernel.
_SELECT_CHUNK = 1024
#: Elements per program of the gated product (64 rows x 5632 units: 176 programs).  At 8192 the sm_90 build spilled
#: 72 B at 255 registers (compile_check); at 2048, 16 elements a thread, 92 registers and no spill.
_PRODUCT_BLOCK = 2048
#: Columns per program of the write-back.
_SCATTER_BLOCK_D = 1024

if triton_available():
    import triton
    import triton.language as tl

    from .gate_kernel import round_to

    @triton.jit
    def _overflow_flags_kernel(counts_ptr, stride_m, stride_t, m, n_tiles, capacity, heavy_pairs, n_blocks, flags_ptr,
                               block_counts_ptr, BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        in_m = rows < m
        top = tl.zeros((BLOCK_M,), dtype=tl.int32)
        pairs = tl.zeros((BLOCK_M,), dtype=tl.int32)  # at most n_tiles * tile, far below 2**31
        for t0 in range(0, n_tiles, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            c = tl.load(counts_ptr + rows[:, None].to(tl.int64) * stride_m + t[None, :] * stride_t,
                        mask=in_m[:, None] & (t[None, :] < n_tiles), other=0)
            top = tl.maximum(top, tl.max(c, axis=1))
            pairs += tl.sum(c, axis=1)
        over = (top > capacity) & in_m
        heavy = (heavy_pairs > 0) & (pairs > heavy_pairs) & in_m & ~over
        tl.store(flags_ptr + rows, (over.to(tl.int8) * 2 + heavy.to(tl.int8)), mask=in_m)
        tl.store(block_counts_ptr + pid, tl.sum(over.to(tl.int32), axis=0))
        tl.store(block_counts_ptr + n_blocks + pid, tl.sum(heavy.to(tl.int32), axis=0))

    @triton.jit
    def _overflow_ranks_kernel(flags_ptr, block_counts_ptr, n_blocks, m, budget, rows_ptr,
                               BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
        pid = tl.program_id(0)
        before = tl.zeros((), dtype=tl.int32)
        total = tl.zeros((), dtype=tl.int32)
        before_heavy = tl.zeros((), dtype=tl.int32)
        total_heavy = tl.zeros((), dtype=tl.int32)
        for c0 in range(0, n_blocks, CHUNK):
            b = c0 + tl.arange(0, CHUNK)
            cnt = tl.load(block_counts_ptr + b, mask=b < n_blocks, other=0)
            before += tl.sum(tl.where(b < pid, cnt, 0), axis=0)
            total += tl.sum(cnt, axis=0)
            cnt_h = tl.load(block_counts_ptr + n_blocks + b, mask=b < n_blocks, other=0)
            before_heavy += tl.sum(tl.where(b < pid, cnt_h, 0), axis=0)
            total_heavy += tl.sum(cnt_h, axis=0)
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        in_m = rows < m
        flag = tl.load(flags_ptr + rows, mask=in_m, other=0).to(tl.int32)
        over = (flag == 2).to(tl.int32)
        heavy = (flag == 1).to(tl.int32)
        # inclusive: the k-th overflowing row has rank k, the k-th heavy row total + k
        rank = tl.where(over > 0, before + tl.cumsum(over, axis=0), total + before_heavy + tl.cumsum(heavy, axis=0))
        take = (flag > 0) & (rank <= budget)
        tl.store(flags_ptr + rows, take.to(tl.int8), mask=in_m)
        tl.store(rows_ptr + (rank - 1), rows.to(tl.int64), mask=take)
        if pid == 0:  # the slots no flagged row took hold row 0 (slots below min(flagged, budget) are taken)
            used = tl.minimum(total + total_heavy, budget)
            for s0 in range(0, budget, CHUNK):
                s = s0 + tl.arange(0, CHUNK)
                tl.store(rows_ptr + s, tl.zeros((CHUNK,), dtype=tl.int64), mask=(s >= used) & (s < budget))

    @triton.jit
    def _gated_product_kernel(g_ptr, u_ptr, h_ptr, n, KEEP_NEG_ZERO: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        u = tl.load(u_ptr + offs, mask=mask, other=0.0)
        # torch.relu: NaN stays NaN (tl.maximum need not keep it); -0.0 stays -0.0 on the CPU (the interpreter's
        # twin) but becomes +0.0 on CUDA (session 49's H100 run: the sign of relu(-0.0) * u differed there)
        if KEEP_NEG_ZERO:
            a = tl.where(g < 0, tl.zeros_like(g), g)
        else:
            a = tl.where((g > 0) | (g != g), g, tl.zeros_like(g))
        h = a.to(tl.float32) * u.to(tl.float32)  # one rounding below, as torch's bf16 / fp16 multiply
        tl.store(h_ptr + offs, round_to(h, h_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _scatter_rows_kernel(y_ptr, rows_ptr, res_ptr, out_ptr, d, stride_y, stride_res, stride_out,
                             HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr):
        i = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        mask = cols < d
        r = tl.load(rows_ptr + i)
        v = tl.load(y_ptr + i.to(tl.int64) * stride_y + cols, mask=mask, other=0.0)
        if HAS_RES:
            res = tl.load(res_ptr + r * stride_res + cols, mask=mask, other=0.0)
            v = round_to(v.to(tl.float32) + res.to(tl.float32), v.dtype)  # torch's add in the dtype: one rounding
        tl.store(out_ptr + r * stride_out + cols, v, mask=mask)


def launch_select_overflow_rows(cold_counts: torch.Tensor, capacity: int, budget: int,
                                heavy_pairs: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(skip int8 [M], rows int64 [budget])`` as :func:`twell.ops.hot_cold_dense_rows.select_overflow_rows` (the
    caller has checked its arguments): two launches, no host synchronisation."""
    m, n_tiles = cold_counts.shape
    dev = cold_counts.device
    skip = torch.empty(m, dtype=torch.int8, device=dev)
    rows = torch.empty(budget, dtype=torch.int64, device=dev)
    if m == 0:
        rows.zero_()
        return skip, rows
    n_blocks = cdiv(m, _SELECT_BLOCK_M)
    block_counts = torch.empty(2 * n_blocks, dtype=torch.int32, device=dev)  # overflowing rows, then heavy ones
    block_t = min(_SELECT_BLOCK_T, next_pow2(max(n_tiles, 1)))
    _overflow_flags_kernel[(n_blocks,)](cold_counts, cold_counts.stride(0), cold_counts.stride(1), m, n_tiles,
                                        capacity, heavy_pairs, n_blocks, skip, block_counts,
                                        BLOCK_M=_SELECT_BLOCK_M, BLOCK_T=block_t)
    _overflow_ranks_kernel[(n_blocks,)](skip, block_counts, n_blocks, m, budget, rows, BLOCK_M=_SELECT_BLOCK_M,
                                        CHUNK=_SELECT_CHUNK)
    return skip, rows


def gated_product(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``relu(g) * u`` in their dtype (one rounding), as PyTorch computes it on their device (the sign of a zero
    included: torch.relu(-0.0) is -0.0 on the CPU, +0.0 on CUDA), in one launch; ``g`` and ``u`` are contiguous
    tensors of one shape and dtype."""
    h = torch.empty_like(g)
    n = g.numel()
    if n:
        _gated_product_kernel[(cdiv(n, _PRODUCT_BLOCK),)](g, u, h, n, KEEP_NEG_ZERO=g.device.type == "cpu",
                                                          BLOCK=_PRODUCT_BLOCK)
    return h


def scatter_rows(y: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, residual: torch.Tensor | None) -> None:
    """``out[rows[i]] = y[i]`` (plus ``residual[rows[i]]``, the sum rounded once to the dtype) in one launch; a row
    listed twice gets the same values twice.  ``y`` [K, d], ``out`` and ``residual`` [M, d], unit stride along d."""
    k, d = y.shape
    if k == 0 or d == 0:
        return
    res = residual if residual is not None else out
    _scatter_rows_kernel[(k, cdiv(d, _SCATTER_BLOCK_D))](y, rows, res, out, d, y.stride(0), res.stride(0),
                                                         out.stride(0), HAS_RES=residual is not None,
                                                         BLOCK_D=_SCATTER_BLOCK_D)
