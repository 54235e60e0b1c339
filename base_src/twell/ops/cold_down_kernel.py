"""The hot/cold split's cold pairs added in the epilogue of the hot down GEMM: no fp32 partial sum in memory.

The split's tail (``twell.ops.hot_cold``) ran the hot down GEMM in cuBLAS with an fp32 output, ``init =
h_hot @ Wd_hot^T`` ([M, d] fp32: 1.07 GB at M=131072, d=2048), which the row-gather kernel read back to add
the cold pairs and round once.  On the H200 that round trip is the largest part of the gather's traffic
that is not weight rows: random whole-row gathers over the cold set's 41 MB of rows took 0.82 ms alone and
1.34 ms with the x, init and output rows added (bench_results/h200/l2_gather_probe_session10.log), against
2.15 ms for the row-gather kernel (cold_pack_gather_probe_session10.log).

Here two kernels do that tail:

1. ``_cold_list_kernel``, one program per token: walks the token's cold TwELL list (as the row kernel
   does), computes each pair's ``h = round(a * round(x . Wu[unit]))`` and writes the token's pairs as a
   short list (h in the input dtype, weight-row id int32, length).  A token with an overflowing tile or
   more than ``LIST`` cold pairs gets length -1: it stays with the row-gather kernel.
2. ``_down_cold_kernel``, one program per [BM, BN] output tile: ``acc = h_hot @ Wd_hot^T`` on tensor cores
   (TMA loads), then for each list position the BM tokens' Wd^T row segments [BN] are gathered and
   accumulated in fp32, and the tile is rounded once and written.  Tokens with length -1 get their fp32
   hot partial written to ``init`` instead, and the row-gather kernel, which skips the others (a byte per
   token), finishes them exactly as before.

The output is the same function as the row-gather path's, rounded once from fp32; only the summation
order differs (the hot part in the GEMM's order, the cold pairs one after another).

Prediction (session 10, before any GPU run; M=131072, l0=28, H200): the cold gather 2.15 ms and the
cuBLAS down GEMM 0.46 ms become ~0.6-0.8 ms (x and ~7 Wu rows per token, latency-bound as the row kernel
but with half its registers) plus ~0.6-0.9 ms (the GEMM and 3.8 GB of Wd^T segments from L2), the op
8.58 -> ~7.6-8.0 ms.

Measured (H200, session 10, bench_results/h200/cold_down_probe_session10_v{1,2}.log): far slower.  At
M=131072, l0=28 the tail took 4.339 ms at best (64 x 64 tiles on 4 warps, 2 list steps a step, the next
step's ids prefetched) against 2.605 ms for the shipped one; the list kernel alone 1.105 ms, the down
GEMM with its epilogue ~2.67 ms where cuBLAS's down GEMM alone takes 0.523, and the row kernel's pass
over every token for the 3,335 left to it ~0.57 ms.  The op: 10.053 vs 8.576 ms (1.38x vs 1.61x of
dense).  The miss: the epilogue's gathers are serial round trips per tile (ids, then rows) with one to
three programs per SM, where the row kernel keeps two tokens per SM in flight with no GEMM between;
prefetching the next step's ids cut the first form's 4.516 ms to 4.339, not to the ~1.5 predicted.
Kept off (``hot_cold.COLD_IN_DOWN_GEMM``), exact and tested, as the measured record of the approach.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._runtime import interpreting, next_pow2
from .gate_kernel import dot_acc, round_to, tile_coords
from .twell_ffn_kernel import _hidden, _listed_entries

#: Longest cold list a token keeps (a token with more cold pairs goes to the row-gather kernel): at the
#: synthetic profile's l0=28 / 56 the hot/cold split leaves 7.1 / 8.9 cold pairs per token on average
#: (cold_pack_gather_probe_session10.log), so 32 leaves only the rare outliers.
LIST = 32
#: ``(BM, BN, BK, stages, warps, STEPS)`` of the down GEMM on the GPU (STEPS: list positions gathered per
#: step of its epilogue); the interpreter runs small tiles.  ptxas (sm_90a, session 10, next step's ids
#: prefetched): 64 x 64 on 4 warps with 2 steps 161 registers (3 programs per SM), with 4 steps 241; 128 x
#: 64 on 8 warps 208 / 240; 64 x 128 on 4 warps spills.  The fastest measured of the four (session 10,
#: cold_down_probe_session10_v2.log): 4.339 ms for the tail at M=131072, l0=28; 4.728 with 4 steps,
#: 5.526 / 5.179 on 128 x 64.
_GPU_CONFIG = (64, 64, 64, 3, 4, 2)
_INTERPRET_CONFIG = (16, 16, 16, 1, 4, 2)


@triton.jit
def _cold_list_kernel(
    x_ptr, wu_ptr, val_ptr, idx_ptr, cnt_ptr, unit_map_ptr, list_h_ptr, list_id_ptr, list_len_ptr, taken_ptr,
    D, n_tiles, stride_xm,
    TILE: tl.constexpr, CAP: tl.constexpr, NT_PAD: tl.constexpr, D_PAD: tl.constexpr, SB: tl.constexpr,
    LIST: tl.constexpr, HAS_MAP: tl.constexpr, IDX_IS_UNIT: tl.constexpr,
):
    """One token's cold pairs as a list of (h, weight row), or length -1 (and taken 0) when it cannot."""
    row = tl.program_id(0).to(tl.int64)
    dtype = val_ptr.dtype.element_ty
    tiles = tl.arange(0, NT_PAD)
    cnt = tl.load(cnt_ptr + row * n_tiles + tiles, mask=tiles < n_tiles, other=0)
    total = tl.sum(cnt, axis=0)
    listed = (tl.max(cnt, axis=0) <= CAP) & (total <= LIST)
    tl.store(list_len_ptr + row, tl.where(listed, total, -1))
    tl.store(taken_ptr + row, listed.to(tl.int8))
    total = tl.where(listed, total, 0)
    incl = tl.cumsum(cnt, axis=0)
    excl = incl - cnt
    offs_d = tl.arange(0, D_PAD)
    d_ok = (offs_d < D) & listed
    x = tl.load(x_ptr + row * stride_xm + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    for k0 in range(0, total, SB):
        k = k0 + tl.arange(0, SB)
        a, unit, k_ok = _listed_entries(k, total, incl, excl, tiles, row, n_tiles, val_ptr, idx_ptr, unit_map_ptr,
                                        TILE, CAP, HAS_MAP, IDX_IS_UNIT)
        wu = tl.load(wu_ptr + unit[:, None] * D + offs_d[None, :], mask=k_ok[:, None] & d_ok[None, :],
                     other=0.0).to(tl.float32)
        h = _hidden(a, k_ok, wu, x, dtype, True, True)  # round(a * round(x . Wu[unit])), as the row kernel's
        tl.store(list_h_ptr + row * LIST + k, h.to(dtype), mask=k_ok)
        tl.store(list_id_ptr + row * LIST + k, unit.to(tl.int32), mask=k_ok)


@triton.jit
def _down_cold_kernel(
    h_desc, wd_desc, list_h_ptr, list_id_ptr, list_len_ptr, wdt_ptr, out_ptr, init_ptr, M, D, H,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, LIST: tl.constexpr, STEPS: tl.constexpr,
    GROUP_M: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """Output tile [BM, BN]: the hot down GEMM, then the BM tokens' listed cold pairs, rounded once; the
    fp32 hot partial to ``init`` for tokens without a list."""
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(D, BN), GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    rows64 = rows.to(tl.int64)
    m_ok = rows < M
    n_ok = cols < D
    # The epilogue is latency-bound (session 10, H200: reading each step's ids, then its rows, the two
    # kernels took 4.5-5.6 ms at M=131072, l0=28, against 2.6 for the shipped tail), so each step waits on
    # one round trip: its rows, with the next step's ids requested alongside (the first step's before the
    # GEMM, so that they arrive under it).  Holding the tile's whole lists instead took 229-255 registers.
    n_list = tl.load(list_len_ptr + rows64, mask=m_ok, other=-1)
    steps = tl.arange(0, STEPS)
    live = steps[None, :] < n_list[:, None]
    h = tl.load(list_h_ptr + rows64[:, None] * LIST + steps[None, :], mask=live, other=0.0)
    unit = tl.load(list_id_ptr + rows64[:, None] * LIST + steps[None, :], mask=live, other=0)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, H, BK):
        acc = dot_acc(h_desc.load([pid_m * BM, k0]), wd_desc.load([k0, pid_n * BN]), acc, DOT_FP32)
    # the cold sum in its own accumulator, in the gathered rows' layout: added to the tensor-core one in
    # place, each step's [BM, BN] rows went through shared memory into the MMA layout (ttgir, sm_90a)
    cold = tl.zeros((BM, BN), dtype=tl.float32)
    for s0 in range(0, tl.max(n_list, axis=0), STEPS):
        w = tl.load(wdt_ptr + unit.to(tl.int64)[:, :, None] * D + cols[None, None, :],
                    mask=live[:, :, None] & n_ok[None, None, :], other=0.0)
        h_now = h.to(tl.float32)
        nxt = s0 + STEPS + steps[None, :]
        live = nxt < n_list[:, None]
        h = tl.load(list_h_ptr + rows64[:, None] * LIST + nxt, mask=live, other=0.0)
        unit = tl.load(list_id_ptr + rows64[:, None] * LIST + nxt, mask=live, other=0)
        cold += tl.sum(h_now[:, :, None] * w.to(tl.float32), axis=1)
    acc += cold
    offs = rows64[:, None] * D + cols[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    listed = (n_list >= 0)[:, None]
    tl.store(out_ptr + offs, round_to(acc, out_ptr.dtype.element_ty), mask=ok & listed)
    tl.store(init_ptr + offs, acc, mask=ok & ~listed)


def down_cold_supported(x: torch.Tensor, n_hot: int) -> bool:
    """Whether :func:`launch_down_cold` takes this call: some hot units (the GEMM's K), TMA-readable rows
    (``h_hot`` [M, H] and Wd_hot^T [H, d] rows of a multiple of 16 bytes) and a tensor-core dtype."""
    item = x.element_size()
    return (n_hot > 0 and (n_hot * item) % 16 == 0 and (x.shape[1] * item) % 16 == 0
            and x.dtype in (torch.bfloat16, torch.float16))


def launch_cold_list(
    x: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
    counts: torch.Tensor,
    w_up: torch.Tensor,
    *,
    tile: int,
    unit_map: torch.Tensor | None,
    idx_is_unit: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(list_h [M, LIST], list_id [M, LIST] int32, list_len [M] int32, taken [M] int8)``: each token's cold
    pairs as (h, weight row), in its TwELL list's order; length -1 and taken 0 for a token with an
    overflowing tile or more than LIST pairs (only the first ``list_len`` entries of a row are written)."""
    m, d = x.shape
    n_tiles, cap = counts.shape[1], values.shape[2]
    dev = x.device
    list_h = torch.empty((m, LIST), dtype=x.dtype, device=dev)
    list_id = torch.empty((m, LIST), dtype=torch.int32, device=dev)
    list_len = torch.empty((m,), dtype=torch.int32, device=dev)
    taken = torch.empty((m,), dtype=torch.int8, device=dev)
    if m:
        d_pad = next_pow2(d)
        _cold_list_kernel[(m,)](
            x, w_up, values, indices, counts, unit_map if unit_map is not None else counts, list_h, list_id,
            list_len, taken, d, n_tiles, x.stride(0),
            TILE=tile, CAP=cap, NT_PAD=next_pow2(n_tiles), D_PAD=d_pad, SB=max(1, min(4, 8192 // d_pad)),
            LIST=LIST, HAS_MAP=unit_map is not None, IDX_IS_UNIT=idx_is_unit, num_warps=4,
        )
    return list_h, list_id, list_len, taken


def launch_down_cold(
    x: torch.Tensor,
    h_hot: torch.Tensor,
    w_down_hot_t: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
    counts: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    *,
    tile: int,
    unit_map: torch.Tensor | None,
    idx_is_unit: bool,
    out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``out`` for every token whose cold pairs can be listed; return ``(init, taken)``: the fp32 hot
    partial sums (written only for the other tokens) and the int8 per-token flag (1: done here) that the
    row-gather kernel's ``taken`` skips.  Inputs validated and contiguous, :func:`down_cold_supported`; ``counts``
    may be a column view of a wider buffer (the fused gate's), which is copied: this path's kernels index [M, T]."""
    counts = counts.contiguous()
    m, d = x.shape
    list_h, list_id, list_len, taken = launch_cold_list(x, values, indices, counts, w_up, tile=tile,
                                                        unit_map=unit_map, idx_is_unit=idx_is_unit)
    # only the unlisted tokens' rows are written: the allocator's block costs nothing more
    init = torch.empty((m, d), dtype=torch.float32, device=x.device)
    if m == 0:
        return init, taken
    bm, bn, bk, stages, warps, steps = _INTERPRET_CONFIG if interpreting() else _GPU_CONFIG
    h_hot, w_down_hot_t = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (h_hot, w_down_hot_t))
    h_desc = TensorDescriptor.from_tensor(h_hot, [bm, bk])
    wd_desc = TensorDescriptor.from_tensor(w_down_hot_t, [bk, bn])
    grid = (triton.cdiv(m, bm) * triton.cdiv(d, bn),)
    _down_cold_kernel[grid](
        h_desc, wd_desc, list_h, list_id, list_len, w_down_t, out, init, m, d, h_hot.shape[1],
        BM=bm, BN=bn, BK=bk, LIST=LIST, STEPS=steps, GROUP_M=8, DOT_FP32=interpreting() or x.dtype == torch.float32,
        num_stages=stages, num_warps=warps,
    )
    return init, taken
