"""Triton kernels of the hot/cold training op (:mod:`twell.ops.hot_cold_training` explains the method).

Notation as in :mod:`twell.ops.train_kernels` (v1), whose jit helpers are reused: x [M, d], Wg, Wu and
Wd^T [F, d] (unit-major), g = round(x Wg^T), a = relu(g), u = x . Wu[j], h = a u.  ``slot [F]`` (int32)
maps a hot unit to its column in the [M, H] hot tensors and a cold unit to -1.

Cold pairs live in a row-ELL of width W with continuation rows: ``ids/vals/u/dg/du [(M + C), W]``.
Row t < M holds the first W cold pairs of token t (unit order); a token with more has its next ones in
continuation rows ``M + lo[t] .. M + hi[t] - 1`` (W pairs each, the last one partly filled), whose
owner token is ``owner[c]``.  Unused slots hold the sentinel id F, so the flattened ids are the sort key
of the unit-major transpose exactly as in v1.  A token whose continuation rows would pass the capacity
C "spills": its main row is all sentinel and every kernel recomputes its cold units densely from x
and Wg (v1's exact fallback, with v1's ``_gate_of`` so that the recomputed gate is the same bits
everywhere).  ``order [M]`` lists the overflowing tokens first (spilled ones last among them), then the
rest: the row kernels take their token from it, so the long rows start first and never form a tail.

Kernels (every sum in a fixed order, no atomics: results are bitwise reproducible):

* :func:`launch_pack` (from the hot-first gate, whose first H columns are the hot units): the cold
  main rows and the true cold counts (8 tokens per program), and from the hot columns (16 x 128
  tiles) a_hot [M, H], h_hot = round(a_hot u_hot) [M, H] (the down GEMM's operand), the row's sum
  |h_hot| (fp32 h) and its hot non-zero count.
* :func:`launch_pack_continuation` (one program per token): ``order``; for an overflowing token the
  continuation pairs (a second pass over its gate row) and ``owner``, or the sentinel main row when it
  spills.
* :func:`launch_forward_rows`: out = round(init + cold pairs) with init = h_hot Wd_hot^T (fp32), the
  row L1 sum (hot part included), u per cold slot (fp32, for the backward).
* :func:`launch_hot_backward` (2-D tiles): dh = dh_raw + grad_l1 sign(h) / M, dg and du of the hot
  pairs (rounded: they are tensor-core GEMM operands) and h_hot again (bitwise the forward's).
* :func:`launch_backward_rows`: dX = round(init + cold pairs), dg and du per cold slot (fp32).
* :func:`launch_unit_grads` (one program per unit): a hot unit copies its rows of the hot GEMMs'
  weight gradients; a cold unit sums its pairs (from the stable sort of the ids, as in v1) and its
  spilled tokens' recomputed pairs, and rounds once.  No token splits: a cold unit fires on fewer than
  ``min_frequency`` of the tokens (0.6 % by default in training, ~100 pairs at M=16384), so one program
  per unit is short; v1 needed splits for the hot units only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import interpreting, next_pow2
from .gate_kernel import relu_keep_nan, round_to
from .train_kernels import (
    _NUM_WARPS,
    _ell_row_backward,
    _ell_row_forward,
    _gate_of,
    _pair_grads,
    _sign,
    default_block,
)

#: Gate columns read per step of the continuation pack kernel (v1's choice; 128 under the interpreter).
_PACK_BLOCK = 1024
#: Tokens x gate columns per step of the cold pack kernel, and its warps.  A pack of hot and cold
#: columns together (slot lookups and scattered hot stores per element) measured on an H200 at M=16384,
#: 0.5 %: 16 x 128 / 2 warps 0.89 ms, 8 x 128 / 2 warps 0.61 ms, 8 x 256 / 4 warps 0.66 ms, 4 x 512 / 4
#: warps 0.67 ms (one token per program, 1024 columns: 0.82 ms); the hot-first gate leaves the cold pack
#: only the cold columns.
_PACK_BM, _PACK_BF, _PACK_WARPS = 8, 128, 2
#: Tokens x hot columns per program of the hot pack (contiguous elementwise tiles, 4 warps).
_HOT_PACK_BM, _HOT_PACK_BH = 16, 128
#: Tokens per step of the one-program overflow layout scan, and its warps: M=16384 in 4 steps,
#: M=1,048,576 in 256.
_LAYOUT_BLOCK, _LAYOUT_WARPS = 4096, 8
#: Tile of the hot backward kernel (rows x hot units): 32 x 64 fp32 values per operand on 4 warps.
_HOT_BM, _HOT_BH = 32, 64


def _pack_block(f: int, width: int) -> int:
    return min(next_pow2(max(f, width)), 128 if interpreting() else _PACK_BLOCK)


def _row_meta(d: int, block: int | None) -> dict:
    return {"D_PAD": next_pow2(d), "SB": block or default_block(d), "num_warps": _NUM_WARPS}


# ------------------------------------------------------------------------------------------ helpers
@triton.jit
def _cold_mask(slot_ptr, unit, u_ok):
    """Which of ``unit`` are cold (slot -1); out-of-range units count as hot (excluded)."""
    return u_ok & (tl.load(slot_ptr + unit, mask=u_ok, other=0) < 0)


@triton.jit
def _spilled_units(j0, x, slot_ptr, wg_ptr, wu_ptr, offs_d, d_ok, F, D, dtype: tl.constexpr, SB: tl.constexpr):
    """Cold units j0 .. j0+SB of a spilled token, densely: v1's recomputed gate, hot units masked out.

    Returns the weight-row offsets, the live pairs' mask (rows), a, u and the loaded Wg and Wu rows."""
    unit = (j0 + tl.arange(0, SB)).to(tl.int64)
    cold = _cold_mask(slot_ptr, unit, unit < F)
    w_off = unit[:, None] * D + offs_d[None, :]
    wg = tl.load(wg_ptr + w_off, mask=cold[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    a = relu_keep_nan(_gate_of(wg, x[None, :], dtype))
    live = cold & (a != 0)
    l_ok = live[:, None] & d_ok[None, :]
    wu = tl.load(wu_ptr + w_off, mask=l_ok, other=0.0).to(tl.float32)
    u = tl.sum(wu * x[None, :], axis=1)
    return w_off, l_ok, live, a, u, wg, wu


@triton.jit
def _program_token(order_ptr, x_ptr, init_ptr, stride_xm, D, HAS_HOT: tl.constexpr, D_PAD: tl.constexpr):
    """The token of this row program (overflowing ones first), its x row (fp32) and the fp32 start of
    its output row: the hot part ``init[t]`` or zeros."""
    t = tl.load(order_ptr + tl.program_id(0)).to(tl.int64)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    x = tl.load(x_ptr + t * stride_xm + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    acc = tl.zeros((D_PAD,), dtype=tl.float32)
    if HAS_HOT:
        acc += tl.load(init_ptr + t * D + offs_d, mask=d_ok, other=0.0)
    return t, offs_d, d_ok, x, acc


@triton.jit
def _token_rows(tok, live, x_ptr, go_ptr, stride_xm, stride_gm, offs_d, d_ok):
    """x and dOut rows ([SB, D_PAD] fp32) of the tokens ``tok`` where ``live``."""
    r_ok = live[:, None] & d_ok[None, :]
    xr = tl.load(x_ptr + tok[:, None] * stride_xm + offs_d[None, :], mask=r_ok, other=0.0).to(tl.float32)
    gr = tl.load(go_ptr + tok[:, None] * stride_gm + offs_d[None, :], mask=r_ok, other=0.0).to(tl.float32)
    return xr, gr


@triton.jit
def _cont_rows(t, cnt, lo_ptr, hi_ptr, W):
    """(lo, hi, n_main) of token t: its continuation rows and the pairs in its main row; lo = -1: spilled."""
    lo = tl.load(lo_ptr + t).to(tl.int64)  # int64: the ELL row M + c addresses (M + C) * W slots
    hi = tl.load(hi_ptr + t).to(tl.int64)
    return lo, hi, tl.minimum(cnt, W)


# --------------------------------------------------------------------------------------------- pack
@triton.jit
def _hot_pack_kernel(
    g_ptr, uh_ptr, ah_ptr, hh_ptr, hl1_ptr, hnz_ptr, M, H, stride_gm, BM: tl.constexpr, BH: tl.constexpr,
):
    """The hot columns (the first H of the hot-first gate): a_hot, h_hot = round(a u_hot), row sum |h| and
    row non-zero count.  Contiguous [BM, BH] tiles: a bandwidth-bound pass."""
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    r_ok = rows < M
    l1 = tl.zeros((BM, BH), dtype=tl.float32)
    hot_nz = tl.zeros((BM, BH), dtype=tl.int32)
    for h0 in range(0, H, BH):
        cols = h0 + tl.arange(0, BH)
        ok = r_ok[:, None] & (cols < H)[None, :]
        a = relu_keep_nan(tl.load(g_ptr + rows[:, None] * stride_gm + cols[None, :], mask=ok, other=0.0))
        nz = (a != 0) & ok
        h_off = rows[:, None] * H + cols[None, :]
        u = tl.load(uh_ptr + h_off, mask=nz, other=0.0)
        h = tl.where(nz, a.to(tl.float32) * u, 0.0)
        tl.store(ah_ptr + h_off, a, mask=ok)
        tl.store(hh_ptr + h_off, round_to(h, hh_ptr.dtype.element_ty), mask=ok)
        l1 += tl.abs(h)
        hot_nz += nz.to(tl.int32)
    tl.store(hl1_ptr + rows, tl.sum(l1, axis=1), mask=r_ok)
    tl.store(hnz_ptr + rows, tl.sum(hot_nz, axis=1), mask=r_ok)


@triton.jit
def _cold_pack_kernel(
    g_ptr, unit_ptr, ids_ptr, val_ptr, cnt_ptr, M, NC, H, W, stride_gm,
    BM: tl.constexpr, BF: tl.constexpr, WP: tl.constexpr,
):
    """The cold main rows: BM tokens per program, the cold columns (H .. F of the hot-first gate, units
    ``unit[H + c]``, increasing) read BF at a time as one [BM, BF] tile with one 2-D prefix scan.  A tile
    without a cold pair (most of them at ~1 % density) skips the scan and the stores."""
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    r_ok = rows < M
    base = rows * W
    total = tl.zeros((BM,), dtype=tl.int32)
    for c0 in range(0, NC, BF):
        cols = c0 + tl.arange(0, BF)
        c_ok = cols < NC
        ok = r_ok[:, None] & c_ok[None, :]
        g = tl.load(g_ptr + rows[:, None] * stride_gm + H + cols[None, :], mask=ok, other=0.0)
        cold = (relu_keep_nan(g) != 0) & ok
        nz_i = cold.to(tl.int32)
        n_tile = tl.sum(nz_i, axis=1)
        if tl.sum(n_tile, axis=0) > 0:
            unit = tl.load(unit_ptr + H + cols, mask=c_ok, other=0).to(tl.int32)
            pos = total[:, None] + tl.cumsum(nz_i, axis=1) - nz_i  # exclusive prefix count over the row
            keep = cold & (pos < W)
            tl.store(ids_ptr + base[:, None] + pos, unit[None, :] + tl.zeros((BM, BF), dtype=tl.int32), mask=keep)
            tl.store(val_ptr + base[:, None] + pos, g, mask=keep)
        total += n_tile
    tl.store(cnt_ptr + rows, total, mask=r_ok)
    s = tl.arange(0, WP)
    pad = r_ok[:, None] & (s >= tl.minimum(total, W)[:, None]) & (s < W)[None, :]
    tl.store(ids_ptr + base[:, None] + s[None, :], tl.zeros((BM, WP), dtype=tl.int32) + NC + H, mask=pad)
    tl.store(val_ptr + base[:, None] + s[None, :], tl.zeros((BM, WP), dtype=val_ptr.dtype.element_ty), mask=pad)


def launch_pack(
    g: torch.Tensor, unit: torch.Tensor, n_hot: int, u_hot: torch.Tensor, width: int, cont_rows: int,
    *, block_m: int | None = None, block_f: int | None = None, num_warps: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """``(ids, vals, counts, a_hot, h_hot, hot_l1, hot_nz)`` from the hot-first gate g [M, F] (rows
    contiguous; column c holds unit ``unit[c]``: the H hot units, then the cold ones, each increasing).

    ``ids``/``vals`` are [(M + C), W] with the C continuation rows all sentinel (filled by
    :func:`launch_pack_continuation`); ``counts`` the true cold count per token (int32).  The hot
    outputs are [M, H] (g's dtype) and [M] (fp32 L1 sums, int32 counts); zeros when H = 0.
    ``block_m`` x ``block_f`` (tokens x gate columns per step) and ``num_warps`` override the cold pack's
    tuned launch (benchmarks).
    """
    m, f = g.shape
    dev = g.device
    ids = torch.empty((m + cont_rows, width), dtype=torch.int32, device=dev)
    ids[m:].fill_(f)
    vals = torch.empty((m + cont_rows, width), dtype=g.dtype, device=dev)
    counts = torch.empty((m,), dtype=torch.int32, device=dev)
    a_hot = torch.empty((m, n_hot), dtype=g.dtype, device=dev)
    h_hot = torch.empty((m, n_hot), dtype=g.dtype, device=dev)
    # The hot pack writes every row of these; without hot units they stay zero.
    alloc = torch.empty if n_hot else torch.zeros
    hot_l1 = alloc((m,), dtype=torch.float32, device=dev)
    hot_nz = alloc((m,), dtype=torch.int32, device=dev)
    if m == 0:
        return ids, vals, counts, a_hot, h_hot, hot_l1, hot_nz
    if n_hot:
        _hot_pack_kernel[(triton.cdiv(m, _HOT_PACK_BM),)](
            g, u_hot, a_hot, h_hot, hot_l1, hot_nz, m, n_hot, g.stride(0),
            BM=_HOT_PACK_BM, BH=min(next_pow2(n_hot), 32 if interpreting() else _HOT_PACK_BH), num_warps=4,
        )
    if f > n_hot:
        bm = block_m or _PACK_BM
        bf = block_f or min(next_pow2(f - n_hot), 64 if interpreting() else _PACK_BF)
        _cold_pack_kernel[(triton.cdiv(m, bm),)](
            g, unit, ids, vals, counts, m, f - n_hot, n_hot, width, g.stride(0),
            BM=bm, BF=bf, WP=next_pow2(width), num_warps=num_warps or _PACK_WARPS,
        )
    else:  # no cold unit: every main row is all sentinel
        ids[:m].fill_(f)
        vals[:m].zero_()
        counts.zero_()
    return ids, vals, counts, a_hot, h_hot, hot_l1, hot_nz


@triton.jit
def _overflow_layout_kernel(cnt_ptr, hnz_ptr, lo_ptr, hi_ptr, ocum_ptr, nspill_ptr, l0_ptr, M, W, C,
                            BLOCK: tl.constexpr):
    """One program, tokens in order, BLOCK at a time with carried running sums: the continuation rows
    [lo, hi) of each overflowing token (-1 when they would pass the capacity C: spilled), the inclusive
    count of overflowing tokens, and the number of spilled ones.  One launch where the same arithmetic
    in PyTorch ops (:func:`twell.ops.hot_cold_training.overflow_layout_reference`) took about a dozen.
    It also gives l0 (cold plus hot non-zeros per token, mean over tokens), which took five more."""
    rows_before = tl.sum(tl.zeros((BLOCK,), dtype=tl.int32), axis=0)
    over_before = rows_before
    n_spill = rows_before
    nz = tl.sum(tl.zeros((BLOCK,), dtype=tl.int64), axis=0)
    for m0 in range(0, M, BLOCK):
        offs = m0 + tl.arange(0, BLOCK)
        ok = offs < M
        cnt = tl.load(cnt_ptr + offs, mask=ok, other=0)
        nz += tl.sum(cnt.to(tl.int64) + tl.load(hnz_ptr + offs, mask=ok, other=0).to(tl.int64), axis=0)
        over = (cnt > W) & ok
        n_cont = tl.where(over, (cnt - 1) // W, 0)  # ceil((count - W) / W) rows past the main one
        hi = rows_before + tl.cumsum(n_cont, axis=0)
        lo = hi - n_cont
        spill = over & (hi > C)
        over_i = over.to(tl.int32)
        tl.store(lo_ptr + offs, tl.where(spill, -1, lo), mask=ok)
        tl.store(hi_ptr + offs, tl.where(spill, -1, hi), mask=ok)
        tl.store(ocum_ptr + offs, over_before + tl.cumsum(over_i, axis=0), mask=ok)
        rows_before += tl.sum(n_cont, axis=0)
        over_before += tl.sum(over_i, axis=0)
        n_spill += tl.sum(spill.to(tl.int32), axis=0)
    tl.store(nspill_ptr, n_spill)
    tl.store(l0_ptr, (nz.to(tl.float64) / M).to(tl.float32))


def launch_overflow_layout(
    counts: torch.Tensor, hot_nz: torch.Tensor, width: int, cont_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(lo, hi, ocum, n_spill, l0)`` for the cold counts [M] and hot non-zeros [M] (int32, M >= 1):
    continuation rows [lo, hi) per token (-1: spilled), the inclusive count of overflowing tokens, the
    number of spilled tokens (int32, 1 element) and l0 (fp32 scalar: exact sum, one rounding).  Fixed
    sizes, on the device, no host synchronisation."""
    m = counts.shape[0]
    lo = torch.empty((m,), dtype=torch.int32, device=counts.device)
    hi = torch.empty_like(lo)
    ocum = torch.empty_like(lo)
    n_spill = torch.empty((1,), dtype=torch.int32, device=counts.device)
    l0 = torch.empty((), dtype=torch.float32, device=counts.device)
    block = min(next_pow2(m), 256 if interpreting() else _LAYOUT_BLOCK)
    _overflow_layout_kernel[(1,)](counts, hot_nz, lo, hi, ocum, n_spill, l0, m, width, cont_rows, BLOCK=block,
                                  num_warps=_LAYOUT_WARPS)
    return lo, hi, ocum, n_spill, l0


@triton.jit
def _pack_cont_kernel(
    g_ptr, unit_ptr, ids_ptr, val_ptr, owner_ptr, order_ptr, cnt_ptr, lo_ptr, hi_ptr, ocum_ptr,
    M, NC, H, W, stride_gm, BF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cnt = tl.load(cnt_ptr + t)
    oc = tl.load(ocum_ptr + t)  # overflowing tokens up to and including t
    n_over = tl.load(ocum_ptr + M - 1)
    over = cnt > W
    tl.store(order_ptr + tl.where(over, oc - 1, n_over + t - oc), t.to(tl.int32))
    if over:
        lo, hi, n_main = _cont_rows(t, cnt, lo_ptr, hi_ptr, W)
        if lo >= 0:
            for c in range(lo, hi):
                tl.store(owner_ptr + c, t.to(tl.int32))
            total = tl.sum(tl.zeros((BF,), dtype=tl.int32), axis=0)
            for c0 in range(0, NC, BF):
                cols = c0 + tl.arange(0, BF)
                ok = cols < NC
                g = tl.load(g_ptr + t * stride_gm + H + cols, mask=ok, other=0.0)
                cold = (relu_keep_nan(g) != 0) & ok
                nz_i = cold.to(tl.int32)
                e = total + tl.cumsum(nz_i, axis=0) - nz_i - W  # position among the continuation pairs
                keep = cold & (e >= 0)
                dst = (M + lo + e // W).to(tl.int64) * W + e % W
                unit = tl.load(unit_ptr + H + cols, mask=keep, other=0).to(tl.int32)
                tl.store(ids_ptr + dst, unit, mask=keep)
                tl.store(val_ptr + dst, g, mask=keep)
                total += tl.sum(nz_i, axis=0)
        else:  # spilled: its cold units are recomputed densely, so its main row lists nothing
            for s0 in range(0, W, BF):
                s = s0 + tl.arange(0, BF)
                tl.store(ids_ptr + t * W + s, tl.zeros((BF,), dtype=tl.int32) + NC + H, mask=s < W)


def launch_pack_continuation(
    g: torch.Tensor, unit: torch.Tensor, n_hot: int, ids: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor,
    lo: torch.Tensor, hi: torch.Tensor, ocum: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fills the continuation rows of ``ids``/``vals`` in place from the hot-first gate (as
    :func:`launch_pack`); returns ``(order [M], owner [max(C, 1)])`` int32."""
    m, f = g.shape
    width = ids.shape[1]
    order = torch.empty((m,), dtype=torch.int32, device=g.device)
    owner = torch.empty((max(1, ids.shape[0] - m),), dtype=torch.int32, device=g.device)
    _pack_cont_kernel[(m,)](
        g, unit, ids, vals, owner, order, counts, lo, hi, ocum, m, f - n_hot, n_hot, width, g.stride(0),
        BF=_pack_block(f, width), num_warps=4,
    )
    return order, owner


# ------------------------------------------------------------------------------------------ forward
@triton.jit
def _forward_rows_kernel(
    x_ptr, wg_ptr, wu_ptr, wdt_ptr, slot_ptr, ids_ptr, val_ptr, cnt_ptr, lo_ptr, hi_ptr, order_ptr,
    init_ptr, hl1_ptr, u_ptr, out_ptr, l1_ptr,
    M, F, D, W, stride_xm, stride_om,
    HAS_HOT: tl.constexpr, D_PAD: tl.constexpr, SB: tl.constexpr,
):
    t, offs_d, d_ok, x, acc = _program_token(order_ptr, x_ptr, init_ptr, stride_xm, D, HAS_HOT, D_PAD)
    dtype = x_ptr.dtype.element_ty
    l1 = tl.zeros((SB,), dtype=tl.float32)
    lo, hi, n_main = _cont_rows(t, tl.load(cnt_ptr + t), lo_ptr, hi_ptr, W)
    if lo >= 0:
        acc, l1 = _ell_row_forward(t, n_main, W, x, acc, l1, ids_ptr, val_ptr, u_ptr, wu_ptr, wdt_ptr,
                                   offs_d, d_ok, D, SB)
        left = tl.load(cnt_ptr + t) - n_main
        for c in range(lo, hi):
            acc, l1 = _ell_row_forward(M + c, tl.minimum(left, W), W, x, acc, l1, ids_ptr, val_ptr, u_ptr,
                                       wu_ptr, wdt_ptr, offs_d, d_ok, D, SB)
            left -= W
    else:
        for j0 in range(0, F, SB):
            w_off, l_ok, live, a, u, wg, wu = _spilled_units(j0, x, slot_ptr, wg_ptr, wu_ptr, offs_d, d_ok, F, D,
                                                             dtype, SB)
            h = tl.where(live, a * u, 0.0)
            wd = tl.load(wdt_ptr + w_off, mask=l_ok, other=0.0).to(tl.float32)
            acc += tl.sum(h[:, None] * wd, axis=0)
            l1 += tl.abs(h)
    row_l1 = tl.sum(l1, axis=0)
    if HAS_HOT:
        row_l1 += tl.load(hl1_ptr + t)
    tl.store(out_ptr + t * stride_om + offs_d, round_to(acc, out_ptr.dtype.element_ty), mask=d_ok)
    tl.store(l1_ptr + t, row_l1)


def launch_forward_rows(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, slot: torch.Tensor,
    ids: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
    order: torch.Tensor, init: torch.Tensor | None, hot_l1: torch.Tensor, *, block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out [M, d] in x's dtype, u [(M + C), W] fp32, row_l1 [M] fp32)``; ``init`` [M, d] fp32 or None."""
    m, d = x.shape
    out = torch.empty((m, d), dtype=x.dtype, device=x.device)
    u = torch.empty(ids.shape, dtype=torch.float32, device=x.device)
    row_l1 = torch.empty((m,), dtype=torch.float32, device=x.device)
    _forward_rows_kernel[(m,)](
        x, w_gate, w_up, w_down_t, slot, ids, vals, counts, lo, hi, order,
        x if init is None else init, hot_l1, u, out, row_l1,
        m, w_gate.shape[0], d, ids.shape[1], x.stride(0), out.stride(0),
        HAS_HOT=init is not None, **_row_meta(d, block),
    )
    return out, u, row_l1


# ------------------------------------------------------------------------------------- hot backward
@triton.jit
def _hot_backward_kernel(dh_ptr, ah_ptr, uh_ptr, gl1_ptr, dgu_ptr, hh_ptr, M, H,
                         BM: tl.constexpr, BH: tl.constexpr):
    rows = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    ok = (rows < M)[:, None] & (cols < H)[None, :]
    at = rows[:, None] * H + cols[None, :]
    dh = tl.load(dh_ptr + at, mask=ok, other=0.0)
    a = tl.load(ah_ptr + at, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(uh_ptr + at, mask=ok, other=0.0)
    live = a != 0
    h = tl.where(live, a * u, 0.0)
    dh += tl.load(gl1_ptr) * _sign(h) / M
    du = tl.where(live, dh * a, 0.0)
    dg = tl.where(live & (a > 0), dh * u, 0.0)
    dt = dgu_ptr.dtype.element_ty
    gu = rows[:, None] * (2 * H) + cols[None, :]
    tl.store(dgu_ptr + gu, round_to(dg, dt), mask=ok)
    tl.store(dgu_ptr + gu + H, round_to(du, dt), mask=ok)
    tl.store(hh_ptr + at, round_to(h, hh_ptr.dtype.element_ty), mask=ok)


def launch_hot_backward(
    dh_raw: torch.Tensor, a_hot: torch.Tensor, u_hot: torch.Tensor, grad_l1: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dgu [M, 2H] = [dg | du], h_hot [M, H])`` in a_hot's dtype from ``dh_raw = dOut Wd_hot`` (fp32)."""
    m, n_hot = a_hot.shape
    dgu = torch.empty((m, 2 * n_hot), dtype=a_hot.dtype, device=a_hot.device)
    h_hot = torch.empty_like(a_hot)
    grid = (triton.cdiv(m, _HOT_BM), triton.cdiv(n_hot, _HOT_BH))
    _hot_backward_kernel[grid](dh_raw, a_hot, u_hot, grad_l1, dgu, h_hot, m, n_hot, BM=_HOT_BM, BH=_HOT_BH,
                               num_warps=4)
    return dgu, h_hot


# ------------------------------------------------------------------------------------ cold backward
@triton.jit
def _backward_rows_kernel(
    x_ptr, go_ptr, wg_ptr, wu_ptr, wdt_ptr, slot_ptr, ids_ptr, val_ptr, cnt_ptr, lo_ptr, hi_ptr, order_ptr,
    u_ptr, gl1_ptr, init_ptr, dg_ptr, du_ptr, dx_ptr,
    M, F, D, W, stride_xm, stride_gm, stride_dxm,
    HAS_HOT: tl.constexpr, D_PAD: tl.constexpr, SB: tl.constexpr,
):
    t, offs_d, d_ok, x, dx = _program_token(order_ptr, x_ptr, init_ptr, stride_xm, D, HAS_HOT, D_PAD)
    dtype = x_ptr.dtype.element_ty
    go = tl.load(go_ptr + t * stride_gm + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    gl1 = tl.load(gl1_ptr).to(tl.float32)
    lo, hi, n_main = _cont_rows(t, tl.load(cnt_ptr + t), lo_ptr, hi_ptr, W)
    if lo >= 0:
        dx = _ell_row_backward(t, n_main, W, M, x, go, gl1, dx, ids_ptr, val_ptr, u_ptr, dg_ptr, du_ptr,
                               wg_ptr, wu_ptr, wdt_ptr, offs_d, d_ok, D, SB)
        left = tl.load(cnt_ptr + t) - n_main
        for c in range(lo, hi):
            dx = _ell_row_backward(M + c, tl.minimum(left, W), W, M, x, go, gl1, dx, ids_ptr, val_ptr, u_ptr,
                                   dg_ptr, du_ptr, wg_ptr, wu_ptr, wdt_ptr, offs_d, d_ok, D, SB)
            left -= W
    else:
        for j0 in range(0, F, SB):
            w_off, l_ok, live, a, u, wg, wu = _spilled_units(j0, x, slot_ptr, wg_ptr, wu_ptr, offs_d, d_ok, F, D,
                                                             dtype, SB)
            wd = tl.load(wdt_ptr + w_off, mask=l_ok, other=0.0).to(tl.float32)
            du, dg = _pair_grads(wd, go, a, u, live, gl1, M)
            dx += tl.sum(dg[:, None] * wg + du[:, None] * wu, axis=0)
    tl.store(dx_ptr + t * stride_dxm + offs_d, round_to(dx, dx_ptr.dtype.element_ty), mask=d_ok)


def launch_backward_rows(
    x: torch.Tensor, grad_out: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor,
    slot: torch.Tensor, ids: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor, lo: torch.Tensor,
    hi: torch.Tensor, order: torch.Tensor, u: torch.Tensor, grad_l1: torch.Tensor, init: torch.Tensor | None,
    *, block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx [M, d] in x's dtype, dg, du [(M + C), W] fp32)``; ``init`` [M, d] fp32 (hot part) or None."""
    m, d = x.shape
    dx = torch.empty((m, d), dtype=x.dtype, device=x.device)
    dg = torch.empty(ids.shape, dtype=torch.float32, device=x.device)
    du = torch.empty(ids.shape, dtype=torch.float32, device=x.device)
    _backward_rows_kernel[(m,)](
        x, grad_out, w_gate, w_up, w_down_t, slot, ids, vals, counts, lo, hi, order, u, grad_l1,
        x if init is None else init, dg, du, dx,
        m, w_gate.shape[0], d, ids.shape[1], x.stride(0), grad_out.stride(0), dx.stride(0),
        HAS_HOT=init is not None, **_row_meta(d, block),
    )
    return dx, dg, du


# --------------------------------------------------------------------------------- weight gradients
@triton.jit
def _unit_grads_kernel(
    x_ptr, go_ptr, wg_ptr, wu_ptr, wdt_ptr, slot_ptr,
    perm_ptr, start_ptr, owner_ptr, val_ptr, u_ptr, dg_ptr, du_ptr,
    order_ptr, ocum_ptr, nspill_ptr, gl1_ptr, hgu_ptr, hwd_ptr,
    dwg_ptr, dwu_ptr, dwdt_ptr,
    M, F, D, W, H, stride_xm, stride_gm,
    HAS_HOT: tl.constexpr, D_PAD: tl.constexpr, SB: tl.constexpr,
):
    j = tl.program_id(0).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    wdt = dwg_ptr.dtype.element_ty
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    row_j = j * D + offs_d
    sl = tl.load(slot_ptr + j).to(tl.int64)
    if sl >= 0:
        if HAS_HOT:  # rows of the hot GEMMs' results, already in the parameter dtype
            tl.store(dwg_ptr + row_j, tl.load(hgu_ptr + sl * D + offs_d, mask=d_ok), mask=d_ok)
            tl.store(dwu_ptr + row_j, tl.load(hgu_ptr + (H + sl) * D + offs_d, mask=d_ok), mask=d_ok)
            tl.store(dwdt_ptr + row_j, tl.load(hwd_ptr + sl * D + offs_d, mask=d_ok), mask=d_ok)
    else:
        acc_wd = tl.zeros((D_PAD,), dtype=tl.float32)
        acc_wg = tl.zeros((D_PAD,), dtype=tl.float32)
        acc_wu = tl.zeros((D_PAD,), dtype=tl.float32)
        # Listed pairs of unit j: its segment of the (unit, slot)-sorted slots, in token order.
        e = tl.load(start_ptr + j + 1)
        for p0 in range(tl.load(start_ptr + j), e, SB):
            p = p0 + tl.arange(0, SB)
            live = p < e
            slot = tl.load(perm_ptr + p, mask=live, other=0)
            erow = slot // W
            cont = live & (erow >= M)
            tok = tl.where(cont, tl.load(owner_ptr + (erow - M), mask=cont, other=0).to(tl.int64), erow)
            xr, gr = _token_rows(tok, live, x_ptr, go_ptr, stride_xm, stride_gm, offs_d, d_ok)
            h = tl.where(live, tl.load(val_ptr + slot, mask=live, other=0.0).to(tl.float32)
                         * tl.load(u_ptr + slot, mask=live, other=0.0), 0.0)
            acc_wd += tl.sum(h[:, None] * gr, axis=0)
            acc_wg += tl.sum(tl.load(dg_ptr + slot, mask=live, other=0.0)[:, None] * xr, axis=0)
            acc_wu += tl.sum(tl.load(du_ptr + slot, mask=live, other=0.0)[:, None] * xr, axis=0)
        # Spilled tokens (the tail of the overflowing ones in ``order``): recompute this unit's pairs.
        n_over = tl.load(ocum_ptr + M - 1)
        n_spill = tl.load(nspill_ptr)
        if n_spill > 0:
            wg_j = tl.load(wg_ptr + row_j, mask=d_ok, other=0.0).to(tl.float32)
            wu_j = tl.load(wu_ptr + row_j, mask=d_ok, other=0.0).to(tl.float32)
            wd_j = tl.load(wdt_ptr + row_j, mask=d_ok, other=0.0).to(tl.float32)
            for q0 in range(n_over - n_spill, n_over, SB):
                q = q0 + tl.arange(0, SB)
                live = q < n_over
                tok = tl.load(order_ptr + q, mask=live, other=0).to(tl.int64)
                xr, gr = _token_rows(tok, live, x_ptr, go_ptr, stride_xm, stride_gm, offs_d, d_ok)
                a = relu_keep_nan(_gate_of(xr, wg_j[None, :], dtype))
                act = live & (a != 0)
                u = tl.sum(xr * wu_j[None, :], axis=1)
                du, dg = _pair_grads(gr, wd_j, a, u, act, tl.load(gl1_ptr), M)
                acc_wd += tl.sum(tl.where(act, a * u, 0.0)[:, None] * gr, axis=0)
                acc_wg += tl.sum(dg[:, None] * xr, axis=0)
                acc_wu += tl.sum(du[:, None] * xr, axis=0)
        tl.store(dwg_ptr + row_j, round_to(acc_wg, wdt), mask=d_ok)
        tl.store(dwu_ptr + row_j, round_to(acc_wu, wdt), mask=d_ok)
        tl.store(dwdt_ptr + row_j, round_to(acc_wd, wdt), mask=d_ok)


def launch_unit_grads(
    x: torch.Tensor, grad_out: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor,
    slot: torch.Tensor, perm: torch.Tensor, starts: torch.Tensor, owner: torch.Tensor, vals: torch.Tensor,
    u: torch.Tensor, dg: torch.Tensor, du: torch.Tensor, order: torch.Tensor, ocum: torch.Tensor,
    n_spill: torch.Tensor, grad_l1: torch.Tensor, hot_gu: torch.Tensor | None, hot_wd: torch.Tensor | None,
    *, block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dWg, dWu, dWd^T)`` [F, d] in the weights' dtype.

    ``perm`` (int64) lists the flat ELL slots sorted by (unit, slot); unit j's are
    ``perm[starts[j]:starts[j + 1]]``.  ``hot_gu`` [2H, d] = [dWg_hot; dWu_hot] and ``hot_wd`` [H, d] =
    dWd_hot^T are the hot units' rows (None when H = 0)."""
    m, d = x.shape
    f = w_gate.shape[0]
    grads = tuple(torch.empty((f, d), dtype=w_gate.dtype, device=x.device) for _ in range(3))
    has_hot = hot_gu is not None
    _unit_grads_kernel[(f,)](
        x, grad_out, w_gate, w_up, w_down_t, slot, perm, starts, owner, vals, u, dg, du,
        order, ocum, n_spill, grad_l1, hot_gu if has_hot else x, hot_wd if has_hot else x, *grads,
        m, f, d, vals.shape[1], hot_gu.shape[0] // 2 if has_hot else 0, x.stride(0), grad_out.stride(0),
        HAS_HOT=has_hot, **_row_meta(d, block),
    )
    return grads
