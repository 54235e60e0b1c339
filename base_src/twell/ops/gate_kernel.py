"""Triton gate GEMM ``relu(x @ Wg^T)`` whose epilogue writes the TwELL container.

One program computes one [BLOCK_M, TILE] output tile of the gate GEMM on tensor cores (fp32
accumulation), rounds it to the input dtype (as a dense PyTorch linear would), applies ReLU and, per
row, compacts the non-zeros of the tile into the row-tile's C slots with an exclusive prefix sum.  The
dense gate activation never reaches memory.  A row-tile with more than C non-zeros writes its first C
and its true count: the fused FFN kernel recomputes such row-tiles densely from x and Wg, so nothing
is lost and no spill area has to be sized (which would need a host synchronisation).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import interpreting

#: The interpreter casts fp32 -> bf16 by truncation (Triton 3.6; its "rtne" path rounds ties up and
#: misses the carry), so under the interpreter bf16 rounding is done by hand, bit-exactly.
_INTERPRET_BF16_FIX = tl.constexpr(interpreting())


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """Round fp32 ``x`` to ``dtype``, to nearest even, as the GPU's conversion (and PyTorch) does."""
    if dtype == tl.float32:
        return x
    elif _INTERPRET_BF16_FIX and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(dtype)
    else:
        return x.to(dtype)


@triton.jit
def relu_keep_nan(g):
    """ReLU that keeps NaN (as torch.relu does): a NaN gate counts as active and reaches the output."""
    return tl.where((g > 0) | (g != g), g, 0.0)


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of output tile ``tile_id`` in grouped order: GROUP_M row blocks sweep all column
    blocks together, so their x rows and weight tiles stay in L2 (the trick of Triton's matmul tutorial)."""
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile_id % in_group) % group_m, (tile_id % in_group) // group_m


@triton.jit
def dot_acc(a, b, acc, DOT_FP32: tl.constexpr):
    """``acc + a @ b``: with DOT_FP32, true fp32 products of fp32 operands (not tf32; fp32 inputs, and the
    interpreter, which needs fp32 operands), else the operands' own tensor-core dot."""
    if DOT_FP32:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


def _gate_configs() -> list[triton.Config]:
    if interpreting():
        # The interpreter cannot autotune several configs without a GPU (design.md, section 5).
        return [triton.Config({"BLOCK_M": 16, "BLOCK_K": 16, "GROUP_M": 4}, num_warps=4, num_stages=1)]
    configs = []
    for bm in (64, 128):
        for bk in (64, 128):
            for stages in (3, 4):
                for warps in (4, 8):
                    if bm == 64 and warps == 8:
                        continue
                    configs.append(
                        triton.Config({"BLOCK_M": bm, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=warps, num_stages=stages)
                    )
    return configs


@triton.autotune(configs=_gate_configs(), key=["M_BUCKET", "F", "D", "TILE", "CAP", "EPILOGUE"])
@triton.heuristics({"EVEN_K": lambda a: a["D"] % a["BLOCK_K"] == 0})
@triton.jit
def _gate_twell_kernel(
    x_ptr,
    w_ptr,
    val_ptr,
    idx_ptr,
    cnt_ptr,
    M,
    F,
    D,
    M_BUCKET,
    stride_xm,
    stride_wf,
    n_tiles,
    TILE: tl.constexpr,
    CAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    EPILOGUE: tl.constexpr = 0,
):
    """EPILOGUE 0 writes TwELL; 1 writes only the counts and 2 the dense activation into ``val_ptr``
    viewed as [M, F] (diagnostics: they time the GEMM with a cheaper epilogue)."""
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), n_tiles, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * TILE + tl.arange(0, TILE)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < F
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wf + offs_k[:, None]

    acc = tl.zeros((BLOCK_M, TILE), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            b = tl.load(w_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = offs_k < D - k0
            a = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        acc = dot_acc(a, b, acc, DOT_FP32)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    # Round to the storage dtype first (a dense linear returns that), then ReLU.  NaN is kept as a
    # non-zero (g != g), matching torch.relu, which propagates NaN.
    g = round_to(acc, val_ptr.dtype.element_ty)
    act = relu_keep_nan(g).to(val_ptr.dtype.element_ty)
    if EPILOGUE == 2:
        dense_ptrs = val_ptr + offs_m.to(tl.int64)[:, None] * F + offs_n[None, :]
        tl.store(dense_ptrs, act, mask=m_ok[:, None] & n_ok[None, :])
    else:
        _twell_epilogue(act, pid_m, pid_n, m_ok, n_ok, val_ptr, idx_ptr, cnt_ptr, n_tiles, n_tiles, tl.arange(0, TILE),
                        BLOCK_M, TILE, CAP, EPILOGUE == 1, not DOT_FP32)


@triton.jit
def nonzeros_and_counts(act, pid_m, pid_n, m_ok, n_ok, cnt_ptr, cnt_stride, BLOCK_M: tl.constexpr):
    """``(nz, count)`` of an activated [BLOCK_M, TILE] tile: its non-zero mask (rows and columns past the
    edges excluded) and per-row counts, the counts stored in column ``pid_n`` of ``cnt_ptr`` (rows
    ``cnt_stride`` apart)."""
    nz = (act != 0) & m_ok[:, None] & n_ok[None, :]
    count = tl.sum(nz.to(tl.int32), axis=1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(cnt_ptr + offs_m.to(tl.int64) * cnt_stride + pid_n, count, mask=m_ok)
    return nz, count


@triton.jit
def _twell_epilogue(
    act,
    pid_m,
    pid_n,
    m_ok,
    n_ok,
    val_ptr,
    idx_ptr,
    cnt_ptr,
    n_tiles,
    cnt_stride,
    ids,
    BLOCK_M: tl.constexpr,
    TILE: tl.constexpr,
    CAP: tl.constexpr,
    COUNTS_ONLY: tl.constexpr,
    PREFIX_DOT: tl.constexpr,
):
    """Write one activated [BLOCK_M, TILE] tile as TwELL: per row its count and its first CAP non-zeros,
    each non-zero's index taken from ``ids`` [TILE] (the column inside the tile, or a unit id).  The
    container is [M, n_tiles, CAP]; the counts' rows are ``cnt_stride`` apart (n_tiles when they are their
    own [M, n_tiles] tensor).

    The slot of each non-zero is the exclusive prefix count of non-zeros to its left.  On the GPU
    (PREFIX_DOT) that prefix is a tensor-core product with a strictly upper-triangular matrix of ones,
    exact in fp32 for counts <= TILE: it stays in the accumulator layout, where tl.cumsum along a row
    of a wgmma accumulator cost ~3 ms of the 9.2 ms gate kernel at M=131072 (H200, scripts/kernel_variants.py).
    """
    nz, _ = nonzeros_and_counts(act, pid_m, pid_n, m_ok, n_ok, cnt_ptr, cnt_stride, BLOCK_M)
    if not COUNTS_ONLY:
        cols = tl.arange(0, TILE)
        if PREFIX_DOT:
            tri = (cols[:, None] < cols[None, :]).to(tl.float16)
            pos = tl.dot(nz.to(tl.float16), tri, out_dtype=tl.float32).to(tl.int32)
        else:
            nz_i = nz.to(tl.int32)
            pos = tl.cumsum(nz_i, axis=1) - nz_i
        keep = nz & (pos < CAP)
        # int64 base of the tile, int32 offsets inside it (BLOCK_M * n_tiles * CAP < 2**31)
        base = (pid_m.to(tl.int64) * BLOCK_M * n_tiles + pid_n) * CAP
        local = tl.arange(0, BLOCK_M)[:, None] * (n_tiles * CAP) + pos
        tl.store(val_ptr + base + local, act, mask=keep)
        tl.store(idx_ptr + base + local, tl.broadcast_to(ids[None, :], (BLOCK_M, TILE)).to(tl.int16), mask=keep)


@triton.jit
def _pack_twell_kernel(
    g_ptr,
    val_ptr,
    idx_ptr,
    cnt_ptr,
    map_ptr,
    M,
    F,
    stride_gm,
    n_tiles,
    TILE: tl.constexpr,
    CAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    PREFIX_DOT: tl.constexpr,
    MAP_IDS: tl.constexpr = False,
):
    """Pack a dense pre-activation g [M, F] (from a cuBLAS GEMM) into TwELL, with the same epilogue.

    ``MAP_IDS``: store ``map[column]`` (a unit id, int32 map) as each non-zero's index instead of its
    column in the tile."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * TILE + tl.arange(0, TILE)
    m_ok = offs_m < M
    n_ok = offs_n < F
    if MAP_IDS:
        ids = tl.load(map_ptr + offs_n, mask=n_ok, other=0)
    else:
        ids = tl.arange(0, TILE)
    g = tl.load(g_ptr + offs_m.to(tl.int64)[:, None] * stride_gm + offs_n[None, :],
                mask=m_ok[:, None] & n_ok[None, :], other=0.0)
    act = relu_keep_nan(g).to(val_ptr.dtype.element_ty)
    # The general epilogue for every tile: a fast path for tiles whose rows all hold <= 2 non-zeros (slots
    # by a min and a max over the columns, taken by 88 % of the cold pack's programs at l0=28) ran at
    # 0.76-0.89x of it on the H200, e.g. the cold pack at M=131072, l0=28 in 1.876 vs 1.627 ms
    # (bench_results/h200/cold_pack_gather_probe_session7.log), and was removed.
    _twell_epilogue(act, pid_m, pid_n, m_ok, n_ok, val_ptr, idx_ptr, cnt_ptr, n_tiles, n_tiles, ids, BLOCK_M, TILE,
                    CAP, False, PREFIX_DOT)


def launch_gate_twell(
    x: torch.Tensor, w: torch.Tensor, tile: int, capacity: int, *, epilogue: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the gate kernel; x [M, d] and w [F, d] are validated, contiguous, same dtype/device.

    Returns (values, indices, counts) of the TwELL container (padding slots unwritten).
    """
    m, d = x.shape
    f = w.shape[0]
    n_tiles = triton.cdiv(f, tile)
    if epilogue == 2:
        values = torch.empty((m, f), dtype=x.dtype, device=x.device)
    else:
        values = torch.empty((m, n_tiles, capacity), dtype=x.dtype, device=x.device)
    indices = torch.empty((m, n_tiles, capacity), dtype=torch.int16, device=x.device)
    counts = torch.empty((m, n_tiles), dtype=torch.int32, device=x.device)
    if m == 0 or n_tiles == 0:
        return values, indices, counts
    # Autotune per power-of-two bucket of M: tile choice depends on M only through the grid size.
    m_bucket = 1 << max(0, (m - 1).bit_length())

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * n_tiles,)

    _gate_twell_kernel[grid](
        x,
        w,
        values,
        indices,
        counts,
        m,
        f,
        d,
        m_bucket,
        x.stride(0),
        w.stride(0),
        n_tiles,
        TILE=tile,
        CAP=capacity,
        DOT_FP32=interpreting() or x.dtype == torch.float32,
        EPILOGUE=epilogue,
    )
    return values, indices, counts


def launch_pack_twell(
    g: torch.Tensor,
    tile: int,
    capacity: int,
    *,
    prefix_dot: bool | None = None,
    block_m: int | None = None,
    num_warps: int = 2,
    unit_map: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack a dense gate pre-activation g [M, F] (row-major) into TwELL; same outputs as the gate kernel.
    ``unit_map`` (int32 [F], values < 2**15): the indices are ``unit_map[column]`` instead of the
    column inside its tile (the row-gather kernel then reads weight rows without a map lookup)."""
    m, f = g.shape
    n_tiles = triton.cdiv(f, tile)
    values = torch.empty((m, n_tiles, capacity), dtype=g.dtype, device=g.device)
    indices = torch.empty((m, n_tiles, capacity), dtype=torch.int16, device=g.device)
    counts = torch.empty((m, n_tiles), dtype=torch.int32, device=g.device)
    if m == 0 or n_tiles == 0:
        return values, indices, counts
    # 16 x 128 tiles on 2 warps: 1.80 ms at M=131072, F=5632 (H200) against 2.12 ms for 64 x 128 on
    # 4 warps; the kernel is instruction-bound (ncu: 54 % SM throughput, 1 TB/s, occupancy 12 % held
    # down by registers), so smaller programs that fit more warps per SM win
    # (bench_results/h200/hot_cold_probe.log, ncu_pack_gather_union.txt).
    if block_m is None:
        block_m = 16
    if unit_map is not None and (unit_map.dtype != torch.int32 or unit_map.shape != (f,)):
        raise ValueError(f"unit_map must be int32 of shape ({f},), got {unit_map.dtype} {tuple(unit_map.shape)}")
    _pack_twell_kernel[(triton.cdiv(m, block_m), n_tiles)](
        g, values, indices, counts, unit_map if unit_map is not None else counts, m, f, g.stride(0), n_tiles,
        TILE=tile, CAP=capacity, BLOCK_M=block_m,
        # tl.cumsum on the blocked layout of a plain load beat the tensor-core prefix here: 2.13 vs 2.75 ms
        # at M=131072, F=5632 (H200, bench_results/h200/block_union_variants.log).
        PREFIX_DOT=False if prefix_dot is None else prefix_dot,
        MAP_IDS=unit_map is not None,
        num_warps=num_warps,
    )
    return values, indices, counts
