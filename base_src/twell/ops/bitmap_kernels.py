"""The cold half of the hot/cold FFN through a per-(row, tile) bitmap instead of the TwELL slots.

Status: measured slower than the TwELL listing on the H200 as a whole (see ``hot_cold.launch_hot_cold_ffn``),
so it is an option, not the default.

Why: the TwELL pack writes each non-zero's value and index at a position found by a prefix sum, so
every element of the dense gate pays for a scan step and two predicated scatter stores.  On the H200
that made the pack instruction-bound at ~44 instructions per gate element (ncu: 54 % SM throughput,
1 TB/s, 1.8 ms at M=131072, F=5632 against a ~0.4 ms memory floor).  Here the pack does per element
only a compare and a shift into a 32-bit word:

    bits[row, tile, w] = OR over b < 32 of (relu(g[row, tile * T + 32 w + b]) != 0) << b
    counts[row, tile]  = number of non-zeros of the row-tile (all of them: nothing can overflow)

and the work of finding the k-th active unit moves to the FFN kernel, which pays it per active pair
(a popcount and a 5-step binary search in one word) instead of per element.  The gate values are read
back from the dense pre-activation itself (one 2-byte load per pair), so no value array is written.
Exact at any density: a bitmap holds every non-zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import next_pow2
from .gate_kernel import relu_keep_nan, round_to
from .twell_ffn_kernel import _row_input_and_acc, _tile_of_entry, _units_contribution

#: Bits per bitmap word.
WORD = 32


@triton.jit
def _pack_bitmap_kernel(
    g_ptr, bits_ptr, cnt_ptr, M, F, stride_gm, n_tiles,
    TILE: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """One [BLOCK_M, TILE] tile of g: its bitmap words and per-row counts."""
    pid_m = tl.program_id(0)
    pid_t = tl.program_id(1)
    NW: tl.constexpr = TILE // 32
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    w = tl.arange(0, NW)
    b = tl.arange(0, 32)
    cols = pid_t * TILE + w[None, :, None] * 32 + b[None, None, :]
    m_ok = rows < M
    ok = m_ok[:, None, None] & (cols < F)
    g = tl.load(g_ptr + rows.to(tl.int64)[:, None, None] * stride_gm + cols, mask=ok, other=0.0)
    nz = ((relu_keep_nan(g) != 0) & ok).to(tl.int32)
    # distinct powers of two: the sum is the bitwise OR (bit 31 wraps to the sign bit, as intended)
    words = tl.sum(nz << b[None, None, :], axis=2)
    tile_row = rows.to(tl.int64) * n_tiles + pid_t
    tl.store(bits_ptr + tile_row[:, None] * NW + w[None, :], words, mask=m_ok[:, None])
    tl.store(cnt_ptr + tile_row, tl.sum(tl.sum(nz, axis=2), axis=1), mask=m_ok)


@triton.jit
def _popcount32(x):
    """Set bits of the low 32 bits of int64 ``x`` (SWAR; no libdevice call, so the interpreter runs it)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24) & 0xFF


@triton.jit
def _nth_set_bit(word, n):
    """Position of the n-th (0-based) set bit of int64 ``word`` (< 2**32; n < popcount(word))."""
    pos = tl.zeros_like(word)
    for width in tl.static_range(5):
        half = 16 >> width
        low = word & ((1 << half) - 1)
        c = _popcount32(low)
        high = n >= c
        n = tl.where(high, n - c, n)
        word = tl.where(high, word >> half, low)
        pos = tl.where(high, pos + half, pos)
    return pos


@triton.jit
def _bitmap_ffn_row_kernel(
    x_ptr, g_ptr, wu_ptr, wdt_ptr, out_ptr, bits_ptr, cnt_ptr, unit_map_ptr, init_ptr,
    D, n_tiles, stride_xm, stride_gm, stride_om, stride_im,
    TILE: tl.constexpr, NT_PAD: tl.constexpr, D_PAD: tl.constexpr, SB: tl.constexpr,
    HAS_INIT: tl.constexpr,
):
    """out[row] = init[row] + sum over the row's active units j of round(relu(g_j) * round(x . Wu[j])) Wd[:, j].

    ``g`` is the cold part of the gate pre-activation (column c of the bitmap = column c of g);
    ``unit_map`` maps a column to its weight row.  "match" rounding, as the TwELL row kernel.
    """
    row = tl.program_id(0).to(tl.int64)
    dtype = out_ptr.dtype.element_ty
    NW: tl.constexpr = TILE // 32
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    x, out = _row_input_and_acc(x_ptr, init_ptr, row, stride_xm, stride_im, offs_d, d_ok, D_PAD, HAS_INIT)
    tiles = tl.arange(0, NT_PAD)
    cnt = tl.load(cnt_ptr + row * n_tiles + tiles, mask=tiles < n_tiles, other=0)
    incl = tl.cumsum(cnt, axis=0)
    excl = incl - cnt
    total = tl.sum(cnt, axis=0)
    words_idx = tl.arange(0, NW)
    for k0 in range(0, total, SB):
        k = k0 + tl.arange(0, SB)
        k_ok = k < total
        t_k, n = _tile_of_entry(k, incl, excl, tiles)
        t_k = tl.minimum(t_k, n_tiles - 1)  # lanes past the end: any valid tile (masked below)
        n = n.to(tl.int64)
        wbase = (row * n_tiles + t_k) * NW
        words = tl.load(bits_ptr + wbase[:, None] + words_idx[None, :], mask=k_ok[:, None], other=0)
        words = words.to(tl.int64) & 0xFFFFFFFF
        pc = _popcount32(words)
        # inclusive prefix over the NW words as a masked sum: tl.cumsum on this small [SB, NW] tensor
        # hits an assertion in Triton 3.6's scan lowering for sm_90 (ScanOpToLLVM.cpp:265)
        upto = words_idx[None, :] <= words_idx[:, None]  # [j, i]: word i counts towards word j
        w_incl = tl.sum(tl.where(upto[None, :, :], pc[:, None, :], 0), axis=2)
        wi = tl.sum((w_incl <= n[:, None]).to(tl.int32), axis=1)
        wi = tl.minimum(wi, NW - 1)
        sel = words_idx[None, :] == wi[:, None]
        word = tl.sum(tl.where(sel, words, 0), axis=1)
        n_in = n - tl.sum(tl.where(sel, w_incl - pc, 0), axis=1)
        col = t_k.to(tl.int64) * TILE + wi * 32 + _nth_set_bit(word, n_in)
        a = tl.load(g_ptr + row * stride_gm + col, mask=k_ok, other=0.0).to(tl.float32)
        a = relu_keep_nan(a)
        unit = tl.load(unit_map_ptr + col, mask=k_ok, other=0).to(tl.int64)
        out += _units_contribution(a, k_ok, unit, x, offs_d, d_ok, wu_ptr, wdt_ptr, D, dtype, True, True)
    tl.store(out_ptr + row * stride_om + offs_d, round_to(out, dtype), mask=d_ok)


def launch_pack_bitmap(g: torch.Tensor, tile: int, *, block_m: int = 16,
                       num_warps: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(bits int32 [M, n_tiles, tile // 32], counts int32 [M, n_tiles]) of ``relu(g)``; g [M, F] row-major view."""
    if tile % WORD:
        raise ValueError(f"the bitmap path needs a tile that is a multiple of {WORD}, got {tile}")
    m, f = g.shape
    n_tiles = triton.cdiv(f, tile)
    bits = torch.empty((m, n_tiles, tile // WORD), dtype=torch.int32, device=g.device)
    counts = torch.empty((m, n_tiles), dtype=torch.int32, device=g.device)
    if m and n_tiles:
        _pack_bitmap_kernel[(triton.cdiv(m, block_m), n_tiles)](
            g, bits, counts, m, f, g.stride(0), n_tiles, TILE=tile, BLOCK_M=block_m, num_warps=num_warps
        )
    return bits, counts


def launch_bitmap_ffn(
    x: torch.Tensor,
    g: torch.Tensor,
    bits: torch.Tensor,
    counts: torch.Tensor,
    unit_map: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    *,
    tile: int,
    out: torch.Tensor,
    init: torch.Tensor | None = None,
    sb: int | None = None,
) -> torch.Tensor:
    """The cold pairs' contribution (plus ``init``) into ``out``; inputs validated, contiguous rows."""
    m, d = x.shape
    n_tiles = counts.shape[1]
    if m == 0:
        return out
    d_pad = next_pow2(d)
    if sb is None:  # as the TwELL row kernel: two [SB, D_PAD] fp32 tiles per step, SB * D_PAD <= 8192
        sb = max(1, min(4, 8192 // d_pad))
    _bitmap_ffn_row_kernel[(m,)](
        x, g, w_up, w_down_t, out, bits, counts, unit_map, init if init is not None else out,
        d, n_tiles, x.stride(0), g.stride(0), out.stride(0), init.stride(0) if init is not None else 0,
        TILE=tile, NT_PAD=next_pow2(max(1, n_tiles)), D_PAD=d_pad, SB=sb, HAS_INIT=init is not None, num_warps=4,
    )
    return out
