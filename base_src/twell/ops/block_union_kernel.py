"""Block-union FFN kernels: weight rows shared by the tokens of a block are read once, on tensor cores.

The row-gather kernel reads one Wu row and one Wd row per (token, active unit): 8 KB per pair at
d=2048, which on an H200 settles at ~1.5 ns per pair (L2 bandwidth bound, bench_results/h200).
Unit firing frequencies are heavy-tailed, so the tokens of a block share most of their active units.
Here, for each block of BLOCK_M tokens, the union U_b of their active units is listed once, and

    H_b = round(relu(G_b[:, U_b]) * round(X_b @ Wu[U_b]^T))     (tensor-core GEMM over d)
    out_b = H_b @ Wd[:, U_b]^T                                   (tensor-core GEMM over U_b)

Per token this costs 4 * d * |U_b| FLOPs instead of 4 * d * F, and weight rows are read once per
block instead of once per pair.  Exact at any density: the gate values are read from the dense
pre-activation G (cuBLAS), so no unit can be dropped; units outside the union have relu(G) = 0.

Three launches: ``_block_union_kernel`` lists the union per (block, column tile) and counts each
row's non-zeros; ``_union_up_kernel`` writes H_b compactly (column p of H_b is the p-th union unit);
``_union_down_kernel`` computes the output.  H for the union columns goes through memory: M * |U_b|
values, which is small next to the weights the gather would move.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import interpreting, next_pow2
from .gate_kernel import dot_acc, relu_keep_nan, round_to
from .twell_ffn_kernel import _tile_of_entry


@triton.jit
def _block_union_kernel(
    g_ptr, cnt_ptr, ucnt_ptr, ucols_ptr, M, F, stride_gm, n_tiles,
    BLOCK_M: tl.constexpr, TILE: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_t = tl.program_id(1)
    rows = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, TILE)
    m_ok = rows < M
    n_ok = pid_t * TILE + cols < F
    g = tl.load(g_ptr + rows.to(tl.int64)[:, None] * stride_gm + pid_t * TILE + cols[None, :],
                mask=m_ok[:, None] & n_ok[None, :], other=0.0)
    nz = (relu_keep_nan(g) != 0) & m_ok[:, None] & n_ok[None, :]
    nz_i = nz.to(tl.int32)
    tl.store(cnt_ptr + rows.to(tl.int64) * n_tiles + pid_t, tl.sum(nz_i, axis=1), mask=m_ok)
    union = tl.max(nz_i, axis=0)
    upos = tl.cumsum(union, axis=0) - union
    bt = pid_b.to(tl.int64) * n_tiles + pid_t
    tl.store(ucnt_ptr + bt, tl.sum(union, axis=0))
    tl.store(ucols_ptr + bt * TILE + upos, cols.to(tl.int16), mask=union > 0)


@triton.jit
def _union_units(ucnt_ptr, ucols_ptr, pid_b, p, n_tiles, NT_PAD: tl.constexpr, TILE: tl.constexpr):
    """Unit ids of union positions ``p`` of block ``pid_b`` (valid where p < union size)."""
    tiles = tl.arange(0, NT_PAD)
    bt0 = pid_b.to(tl.int64) * n_tiles
    cnt = tl.load(ucnt_ptr + bt0 + tiles, mask=tiles < n_tiles, other=0)
    incl = tl.cumsum(cnt, axis=0)
    excl = incl - cnt
    total = tl.sum(cnt, axis=0)
    t_p, rank = _tile_of_entry(p, incl, excl, tiles)
    ok = p < total
    local = tl.load(ucols_ptr + (bt0 + t_p) * TILE + rank, mask=ok, other=0).to(tl.int64)
    return t_p.to(tl.int64) * TILE + local, ok


@triton.jit
def _union_size(ucnt_ptr, pid_b, n_tiles, NT_PAD: tl.constexpr):
    tiles = tl.arange(0, NT_PAD)
    cnt = tl.load(ucnt_ptr + pid_b.to(tl.int64) * n_tiles + tiles, mask=tiles < n_tiles, other=0)
    return tl.sum(cnt, axis=0)


@triton.jit
def _union_up_kernel(
    x_ptr, wu_ptr, g_ptr, h_ptr, ucnt_ptr, ucols_ptr, M, D, stride_xm, stride_gm, stride_hm, n_tiles,
    BLOCK_M: tl.constexpr, BLOCK_U: tl.constexpr, BLOCK_K: tl.constexpr, TILE: tl.constexpr,
    NT_PAD: tl.constexpr, ROUND_HIDDEN: tl.constexpr, DOT_FP32: tl.constexpr,
):
    pid_b = tl.program_id(0)
    rows = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rows < M
    rows64 = rows.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    dtype = h_ptr.dtype.element_ty
    total = _union_size(ucnt_ptr, pid_b, n_tiles, NT_PAD)
    for p0 in range(0, total, BLOCK_U):
        p = p0 + tl.arange(0, BLOCK_U)
        unit, ok = _union_units(ucnt_ptr, ucols_ptr, pid_b, p, n_tiles, NT_PAD, TILE)
        acc = tl.zeros((BLOCK_M, BLOCK_U), dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            k_ok = offs_k < D - k0
            a = tl.load(x_ptr + rows64[:, None] * stride_xm + k0 + offs_k[None, :],
                        mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(wu_ptr + unit[None, :] * D + k0 + offs_k[:, None], mask=ok[None, :] & k_ok[:, None],
                        other=0.0)
            acc = dot_acc(a, b, acc, DOT_FP32)
        both = m_ok[:, None] & ok[None, :]
        g = tl.load(g_ptr + rows64[:, None] * stride_gm + unit[None, :], mask=both, other=0.0).to(tl.float32)
        act = relu_keep_nan(g)
        u = acc
        if ROUND_HIDDEN:
            u = round_to(u, dtype).to(tl.float32)
        h = act * u
        tl.store(h_ptr + rows64[:, None] * stride_hm + p[None, :], round_to(h, dtype), mask=both)


@triton.jit
def _union_down_kernel(
    h_ptr, wdt_ptr, out_ptr, ucnt_ptr, ucols_ptr, M, D, stride_hm, stride_om, n_tiles,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_U: tl.constexpr, TILE: tl.constexpr,
    NT_PAD: tl.constexpr, H_IS_GATE: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """out[block, d-chunk] = H_b @ Wd^T[U_b, d-chunk].  H_IS_GATE: H is relu(G) read through the union
    (non-gated FFN), else H is the compact output of _union_up_kernel."""
    pid_b = tl.program_id(0)
    pid_d = tl.program_id(1)
    rows = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rows < M
    rows64 = rows.to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    total = _union_size(ucnt_ptr, pid_b, n_tiles, NT_PAD)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for p0 in range(0, total, BLOCK_U):
        p = p0 + tl.arange(0, BLOCK_U)
        unit, ok = _union_units(ucnt_ptr, ucols_ptr, pid_b, p, n_tiles, NT_PAD, TILE)
        both = m_ok[:, None] & ok[None, :]
        if H_IS_GATE:
            g = tl.load(h_ptr + rows64[:, None] * stride_hm + unit[None, :], mask=both, other=0.0)
            a = relu_keep_nan(g).to(g.dtype)
        else:
            a = tl.load(h_ptr + rows64[:, None] * stride_hm + p[None, :], mask=both, other=0.0)
        b = tl.load(wdt_ptr + unit[:, None] * D + offs_d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
        acc = dot_acc(a, b, acc, DOT_FP32)
    tl.store(out_ptr + rows64[:, None] * stride_om + offs_d[None, :], round_to(acc, out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & d_ok[None, :])



def launch_block_union_ffn(
    x: torch.Tensor,
    g: torch.Tensor,
    w_up: torch.Tensor | None,
    w_down_t: torch.Tensor,
    *,
    round_hidden: bool,
    block_m: int = 64,
    tile: int = 128,
    block_u: int = 64,
    block_k: int = 64,
    block_d: int = 128,
    num_warps: int = 4,
    num_stages: int = 3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FFN output from the dense gate pre-activation ``g`` [M, F]; returns (out [M, d], counts [M, n_tiles]).

    ``w_up=None`` gives the non-gated FFN ``relu(g) @ Wd^T``.  ``w_down_t`` is Wd^T [F, d] contiguous.
    """
    m, d = x.shape
    f = g.shape[1]
    n_tiles = triton.cdiv(f, tile)
    interp = interpreting()
    if interp:
        block_m = min(block_m, 16)
    n_blocks = triton.cdiv(m, block_m)
    counts = torch.empty((m, n_tiles), dtype=torch.int32, device=x.device)
    out = torch.empty((m, d), dtype=x.dtype, device=x.device)
    if m == 0:
        return out, counts
    ucnt = torch.empty((n_blocks, n_tiles), dtype=torch.int32, device=x.device)
    ucols = torch.empty((n_blocks, n_tiles, tile), dtype=torch.int16, device=x.device)
    _block_union_kernel[(n_blocks, n_tiles)](
        g, counts, ucnt, ucols, m, f, g.stride(0), n_tiles, BLOCK_M=block_m, TILE=tile, num_warps=4
    )
    nt_pad = next_pow2(n_tiles)
    dot_fp32 = interp or x.dtype == torch.float32
    if interp:  # tiny tiles: the interpreter executes every dot element by element
        block_u = block_k = block_d = 16
        num_stages = 1
    if w_up is not None:
        h = torch.empty((m, f), dtype=x.dtype, device=x.device)
        _union_up_kernel[(n_blocks,)](
            x, w_up, g, h, ucnt, ucols, m, d, x.stride(0), g.stride(0), h.stride(0), n_tiles,
            BLOCK_M=block_m, BLOCK_U=block_u, BLOCK_K=block_k, TILE=tile, NT_PAD=nt_pad,
            ROUND_HIDDEN=round_hidden, DOT_FP32=dot_fp32, num_warps=num_warps, num_stages=num_stages,
        )
    else:
        h = g
    _union_down_kernel[(n_blocks, triton.cdiv(d, block_d))](
        h, w_down_t, out, ucnt, ucols, m, d, h.stride(0), out.stride(0), n_tiles,
        BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_U=block_u, TILE=tile, NT_PAD=nt_pad,
        H_IS_GATE=w_up is None, DOT_FP32=dot_fp32, num_warps=num_warps, num_stages=num_stages,
    )
    return out, counts
