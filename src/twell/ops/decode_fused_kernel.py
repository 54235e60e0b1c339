"""The small-batch FFN's up and down projections in one launch, after cuBLAS's gate GEMV (1-16 tokens).

Why: in the whole 1.5B model's CUDA-graphed decode step on an H200 every kernel costs a few
microseconds however little it reads (cuBLAS's GEMV of an 8 MiB attention matrix 5.7 us), and the
sparse FFN ran three of them -- cuBLAS's gate 8.0 us, the up pass over the firing rows 7.75 us, the
down kernel 8.2 us -- against the dense FFN's three GEMVs (~26 us;
bench_results/h200/model/decode_step_profile_fused_session5.log).  Here the up and the down
projections are one kernel: each program owns ``BD`` output columns, lists the firing units itself
from g (the union over the tokens, ascending), and for ``BU`` of them at a time computes
u = x Wu[units]^T over the whole K, h = round(relu(g) round(u)), and adds h Wd^T[units, cols] to its
accumulator.  Every program recomputes u for every firing unit (at l0 ~60, 60 Wu rows = 240 KB read
from L2 by each program): compute and L2 traffic traded for one launch and no h round trip.
Prediction (not measured yet): ~5-6 us instead of 7.75 + 8.2, i.e. the sparse FFN at ~14 us against
the dense ~26 us at one token; off by default (:data:`twell.ops.decode.FUSED_UPDOWN`) until measured.

Rounding as the dense bf16 FFN (``match``): g as cuBLAS rounds it, u and h rounded to the input dtype,
fp32 accumulation, sums over units in ascending unit order, ``BU`` at a time: bitwise reproducible.
A NaN gate counts as firing and reaches the output, as in the dense FFN.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._runtime import interpreting, next_pow2
from .decode_kernels import _HIDDEN_BU, append_listed, decode_blocks, gather_wdt, program_tile, up_projection
from .gate_kernel import dot_acc, relu_keep_nan, round_to

#: Largest token count of the fused kernel: one [16, BD] accumulator and [16, BU] u tile per program.
FUSED_MAX_TOKENS = 16
#: ``(BD, BU, BK, BC, warps, K-loop stages)``: output columns per program (128 programs at d=2048), firing
#: units per step, the up projection's K step, flags per compaction chunk.  First guesses, to be tuned.
_FUSED_CONFIG = (16, 32, 256, 4096, 4, 3)


@triton.jit
def _decode_fused_kernel(
    x_ptr, g_ptr, wu_ptr, wdt_ptr, out_ptr, idx_ptr, cnt_ptr, M, D, F, stride_xm, stride_gm, stride_wu, stride_wf,
    stride_wd, stride_om, n_blocks,
    BM: tl.constexpr, BD: tl.constexpr, BU: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, CB: tl.constexpr,
    DOT_FP32: tl.constexpr, DOWN_FP32: tl.constexpr, MATCH: tl.constexpr, K_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    cols, c_ok, rows, r_ok = program_tile(pid, BD, D, BM, M)
    # 1. The firing units (union over the M tokens), ascending, into this program's scratch row.
    idx_row = idx_ptr + pid.to(tl.int64) * F
    n_active = tl.zeros((), dtype=tl.int32)
    for f0 in range(0, F, BC):
        units = f0 + tl.arange(0, BC)
        u_ok = units < F
        fire = tl.zeros((BC,), dtype=tl.int32)
        blocks = f0 // CB + tl.arange(0, BC // CB)
        for r in range(0, M):
            gv = tl.load(g_ptr + r * stride_gm + units, mask=u_ok, other=0.0).to(tl.float32)
            act = (relu_keep_nan(gv) != 0).to(tl.int32)
            fire = fire | act
            # Program 0 also writes the token's active units per block of CB units (the l0 statistics
            # the two-kernel path's counts give).
            tl.store(cnt_ptr + r * n_blocks + blocks, tl.sum(tl.reshape(act, (BC // CB, CB)), axis=1),
                     mask=(blocks < n_blocks) & (pid == 0))
        n_active = append_listed(idx_row, units, fire, n_active)
    tl.debug_barrier()  # the CTA's stores above are visible to all its threads below
    # 2. BU firing units at a time: their up projection over the whole K, then their share of the output.
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    for i0 in range(0, n_active, BU):
        i = i0 + tl.arange(0, BU)
        i_ok = i < n_active
        units = tl.load(idx_row + i, mask=i_ok, other=0)
        u = up_projection(x_ptr, wu_ptr, rows, r_ok, units.to(tl.int64), i_ok, tl.zeros((BM, BU), dtype=tl.float32),
                          D, stride_xm, stride_wu, BK, K_STAGES, DOT_FP32)
        gt = tl.load(g_ptr + rows[:, None] * stride_gm + units[None, :], mask=r_ok[:, None] & i_ok[None, :],
                     other=0.0)
        a = relu_keep_nan(gt.to(tl.float32))
        if MATCH:
            h = round_to(a * round_to(u, x_ptr.dtype.element_ty).to(tl.float32), x_ptr.dtype.element_ty)
        else:
            h = a * u
        h = tl.where(a != 0, h, 0.0)
        wt = gather_wdt(wdt_ptr, units, cols, i_ok, c_ok, stride_wf, stride_wd)
        if DOWN_FP32:  # fp32 h (precision="fp32") or fp32 inputs
            acc = dot_acc(h, wt, acc, True)
        else:  # h holds values of the input dtype (rounded above): exact in it
            acc = dot_acc(h.to(wdt_ptr.dtype.element_ty), wt, acc, False)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], round_to(acc, out_ptr.dtype.element_ty),
             mask=r_ok[:, None] & c_ok[None, :])


@functools.lru_cache(maxsize=256)
def _meta(m: int, d: int, f: int) -> tuple[int, ...]:
    """``(BM, BD, BU, BK, BC, programs, warps, stages)`` of a shape (cached: launch-time host cost)."""
    bd, bu, bk, bc, warps, stages = _FUSED_CONFIG
    bd = min(bd, max(16, next_pow2(d)))
    return (16, bd, bu, min(bk, max(16, next_pow2(d))), min(bc, max(16, next_pow2(f))), triton.cdiv(d, bd), warps,
            stages)


def launch_decode_fused(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, *, match: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [M, d], counts [M, decode_blocks(F)])`` of the ReLU-gated FFN for x [M, d] (rows contiguous,
    1 <= M <= FUSED_MAX_TOKENS), as :func:`twell.ops.decode.launch_decode_ffn` returns them: the gate by
    ``F.linear`` (cuBLAS), then :func:`_decode_fused_kernel`.  Wg, Wu [F, d] rows contiguous; Wd^T [F, d]
    with any strides (the ``.t()`` view of the [d, F] weight reads it in place)."""
    m, d = x.shape
    f = w_gate.shape[0]
    if not 1 <= m <= FUSED_MAX_TOKENS:
        raise ValueError(f"the fused decode kernel takes 1 to {FUSED_MAX_TOKENS} tokens, got {m}")
    bm, bd, bu, bk, bc, grid, warps, stages = _meta(m, d, f)
    g = torch.nn.functional.linear(x, w_gate)  # rounded to x's dtype, as every path rounds g
    out = torch.empty((m, d), dtype=x.dtype, device=x.device)
    scratch = torch.empty((grid, f), dtype=torch.int32, device=x.device)  # per-program list of firing units
    n_blocks = decode_blocks(f)
    counts = torch.empty((m, n_blocks), dtype=torch.int32, device=x.device)
    dot_fp32 = x.dtype == torch.float32 or interpreting()
    _decode_fused_kernel[(grid,)](
        x, g, w_up, w_down_t, out, scratch, counts, m, d, f, x.stride(0), g.stride(0), w_up.stride(0),
        w_down_t.stride(0), w_down_t.stride(1), out.stride(0), n_blocks, BM=bm, BD=bd, BU=bu, BK=bk, BC=bc,
        CB=_HIDDEN_BU, DOT_FP32=dot_fp32, DOWN_FP32=dot_fp32 or not match, MATCH=match, K_STAGES=stages,
        num_warps=warps,
    )
    return out, counts
