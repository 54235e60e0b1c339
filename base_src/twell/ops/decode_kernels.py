"""Triton kernels of the small-batch (decode) gated FFN: M <= 64 tokens, two launches, no TwELL.

At decode sizes the FFN is bound by reading weights and by launches, not by FLOPs: the dense FFN reads
all of Wg, Wu and Wd (3 x 23 MB at d=2048, F=5632 in bf16) in five launches, while the TwELL paths add
a pack and a per-token gather on top of the gate GEMM (0.21-0.44 ms at M=1 against 0.07-0.08 ms dense on an
H200, bench_results/h200/ffn_small_m_dispatch.log).  Here:

* :func:`launch_decode_hidden` (one program per block of BU units): g = round(x Wg[blk]^T) by tensor-core
  dots (every Wg row is read: which units fire is only known from g), a = relu(g), and only for the
  units that fire for at least one of the M tokens u = x Wu[j]^T, from masked loads that fetch no other
  Wu row; h = round(a round(u)) is written as a dense [M, F] tile (zeros where inactive), plus one
  "fires for some token" flag per unit.
* :func:`launch_decode_down` (one program per BD output columns): out = round(h Wd^T) over the firing
  units only.  Each program first compacts the indices of the units whose flag is set into its own
  int32 scratch row (chunks of BC flags: exclusive prefix sum of the flags gives each firing unit its
  slot, in ascending unit order), then gathers h[:, idx] and Wd^T[idx, cols] for BU compacted units at
  a time and dots them.  The previous design looped over all F units in steps of 64, each step a
  dependent "load the flags -> masked loads of h and Wd^T -> dot" chain (~0.6 us on an H200): 88 steps at
  F=5632 and 224 at F=14336, 50-130 us although only ~20-30 units fire at M=1 (H200 bf16 at 0.5 %
  density: 0.065 ms against 0.044 ms dense at d=2048, F=5632; 0.163 ms against 0.112 ms at d=4096,
  F=14336).  Now the K loop runs cdiv(active units, BU) steps: one at M=1.
  Prediction (before measuring): the down kernel at M=1 takes a few microseconds (two dependent passes
  instead of F/64).  Measured (H200 bf16, 0.5 % density, CUDA-graph GPU time, scripts/decode_probe.py):
  M=1: 6.5 us at d=2048, F=5632 (was 49 us) and 15 us at d=4096, F=14336 (was 117 us); the whole op
  0.024 ms against 0.031 ms dense and 0.068 against 0.102 ms.  M=8: 19 us (was 108) and 55 us (was
  276), but the op (0.038 and 0.129 ms) is still slower than dense there; at M=64 (1500-3800 units in
  the union) the down kernel takes 0.09-0.24 ms, the op 3x dense.

Rounding as the dense bf16 FFN (``precision="match"``): g, u and h rounded to the input dtype, fp32
accumulation; ``precision="fp32"`` keeps u and h in fp32 (h is then an fp32 tensor).  Every sum runs
in a fixed order: bitwise reproducible.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._runtime import interpreting, next_pow2
from .gate_kernel import dot_acc, relu_keep_nan, round_to

#: Largest token count of the decode path: the hidden kernel keeps a [BM, BU] tile per program with
#: BM = next power of two >= M, and the down kernel a [BM, BD] accumulator.
DECODE_MAX_TOKENS = 64
#: Units per program of the hidden kernel: 352 programs at F=5632 for the 132 SMs of an H200.  At M=1
#: and 0.5 % density (~28 active units) a block holds an active unit with probability
#: 1 - (1 - 28/5632)^16 = 7.7 %, and only those blocks run the up projection loop, loading only the
#: active units' Wu rows.
_HIDDEN_BU = 16
#: Hidden kernel K loop, by token count: ``(BK, pipeline stages, warps, fused up)`` for BM = 16 (M <= 16)
#: and for larger M.  With BK = 128 and Triton's default 3 stages the kernel read Wg at 1.2-2.2 TB/s at
#: M=1 (19.3 us for 23 MB at d=2048, F=5632; 55.9 us for 117 MB at d=4096, F=14336; H200, CUDA-graph
#: times, bench_results/h200/decode_probe_hidden_variants.log).  The prediction that more bytes in flight
#: per SM (BK = 256, 4 stages) would halve that missed: at M=1 every configuration tried (BK 128-512,
#: 3-6 stages, 4 warps) landed within 8 % (18.4-19.3 us and 51.8-56.6 us), 8 warps cost 50 %, so the
#: kernel is not short of loads in flight; what bounds it is not yet known (an ncu profile is next).
#: BK = 512 with 3 stages: 18.8 / 51.8 us at M=1, 19.0 / 74.7 us at M=8 (BK = 128: 19.5 / 73.0 us).
#: At M > 16 the old configuration stayed the fastest of four (21.7 us at d=2048, M=64).
#: "Fused up" computes every unit's up projection in the gate's K loop (all of Wu read: twice the
#: bytes) instead of a second, masked pass over K in the blocks that hold a firing unit: if the kernel
#: is bound by that second pass's serial K loop (blocks with a firing unit run two K loops, the others
#: one) rather than by bytes, fusing shortens the critical path.  Not measured yet
#: (``scripts/decode_probe.py --hidden-variants`` times both); off.
_HIDDEN_SMALL_M, _HIDDEN_LARGE_M = (512, 3, 4, False), (128, 3, 4, False)
#: The gate through cuBLAS (``F.linear``) before the hidden kernel, which then reads g and runs only the
#: firing units' up projection, for gate weights of at least this many elements.  Why: in the whole 1.5B
#: model's CUDA-graphed decode step on an H200 (bench_results/h200/model/decode_step_profile_session5.log)
#: cuBLAS read each 22 MiB gate or up matrix in ~7.9 us (~2.9 TB/s) while the hidden kernel took 16.3 us
#: for Wg plus the firing Wu rows.  Prediction: ~16 -> ~11 us (7.9 + a ~3 us up pass).  Measured
#: (decode_probe_gate_gemm_session5.log, model/decode_step_profile_fused_session5.log): at d=2048,
#: F=5632 a wash -- cuBLAS's gate 8.0-8.3 us, but the up pass alone then takes 7.4-7.8 us (a serial K
#: loop over the firing rows, latency-bound), 15.7 vs 15.8 us in all, the model's step 2.995 vs 3.002 ms;
#: at d=4096, F=14336 the hidden phase 44.1 vs 48.7 us at one token and the op 5-10 % faster at every
#: token count and density measured.  So from that size up; unmeasured sizes in between keep the kernel.
GATE_BY_GEMM_MIN_ELEMENTS = 4096 * 14336
#: Force the choice (True / False) for every size; None: by :data:`GATE_BY_GEMM_MIN_ELEMENTS`.
GATE_BY_GEMM: bool | None = None
#: Down kernel, by token count (``(BD, BU, warps, K-loop stages)`` for BM = 16, i.e. M <= 16, and for
#: larger M): BD output columns per program, BU compacted units per K step; BC unit flags per compaction
#: chunk.  Chosen on an H200 (bf16, synthetic problem at 0.5 % density, per-kernel CUDA-graph times;
#: the old kernel's time in brackets): at M <= 16, BD = 16 (the smallest tl.dot operand: 128 programs at
#: d=2048, 256 at d=4096 for the 132 SMs) and BU = 64 with a 3-stage pipelined K loop (M=8: 17 us at
#: d=2048 [28 us], 55 us at d=4096 [92 us]; BU = 32 unpipelined: 22 and 75 us).  At M > 16 every program
#: gathers all of h[:, active] again, one 32-byte sector per element, so fewer programs win: BD = 32 (M=64
#: at d=4096, 4400 active units: 276 us against 424 us with BD = 16).  BC = 4096: the compaction pass
#: is F/BC dependent steps (2 at F=5632, 4 at F=14336) over flags the hidden kernel just wrote (in L2);
#: BC = 1024 cost 3 us more at d=2048 and 10 us more at d=4096 (M=1); BC = 8192 (8 warps) was slower at d=4096.
_DOWN_SMALL_M, _DOWN_LARGE_M, _DOWN_BC = (16, 64, 8, 3), (32, 32, 8, 1), 4096


@triton.jit
def _decode_hidden_kernel(
    x_ptr, wg_ptr, wu_ptr, g_ptr, h_ptr, act_ptr, cnt_ptr, M, D, F, stride_xm, stride_wg, stride_wu, stride_gm,
    stride_hm, n_blocks,
    BM: tl.constexpr, BU: tl.constexpr, BK: tl.constexpr, DOT_FP32: tl.constexpr, MATCH: tl.constexpr,
    K_STAGES: tl.constexpr, FUSED_UP: tl.constexpr, GATE_IN: tl.constexpr,
):
    units = tl.program_id(0) * BU + tl.arange(0, BU)
    u_ok = units < F
    rows = tl.arange(0, BM)
    r_ok = rows < M
    offs_k = tl.arange(0, BK)
    w_rows = units.to(tl.int64)
    acc_up = tl.zeros((BM, BU), dtype=tl.float32)
    if GATE_IN:  # g = x Wg^T computed by cuBLAS (already rounded to the input dtype): read the tile
        g = tl.load(g_ptr + rows[:, None] * stride_gm + units[None, :], mask=r_ok[:, None] & u_ok[None, :],
                    other=0.0)
        a = relu_keep_nan(g.to(tl.float32))
    else:
        acc = tl.zeros((BM, BU), dtype=tl.float32)
        for k0 in tl.range(0, D, BK, num_stages=K_STAGES):
            k = k0 + offs_k
            k_ok = k < D
            xt = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :], mask=r_ok[:, None] & k_ok[None, :],
                         other=0.0)
            wt = tl.load(wg_ptr + w_rows[None, :] * stride_wg + k[:, None], mask=u_ok[None, :] & k_ok[:, None],
                         other=0.0)
            acc = dot_acc(xt, wt, acc, DOT_FP32)
            if FUSED_UP:  # every unit's up projection in the same pass: all of Wu read, no second pass
                wt = tl.load(wu_ptr + w_rows[None, :] * stride_wu + k[:, None], mask=u_ok[None, :] & k_ok[:, None],
                             other=0.0)
                acc_up = dot_acc(xt, wt, acc_up, DOT_FP32)
        a = relu_keep_nan(round_to(acc, x_ptr.dtype.element_ty).to(tl.float32))  # g rounded as a dense linear
    act = (a != 0) & r_ok[:, None] & u_ok[None, :]
    unit_act = tl.max(act.to(tl.int32), axis=0) > 0
    acc = acc_up
    if (GATE_IN or not FUSED_UP) and tl.sum(unit_act.to(tl.int32), axis=0) > 0:
        # Rows of units that fire for no token are masked off: the loads fetch nothing for them.
        acc = up_projection(x_ptr, wu_ptr, rows, r_ok, w_rows, unit_act, acc, D, stride_xm, stride_wu, BK, K_STAGES,
                            DOT_FP32)
    if MATCH:
        h = round_to(a * round_to(acc, x_ptr.dtype.element_ty).to(tl.float32), h_ptr.dtype.element_ty)
    else:
        h = a * acc
    h = tl.where(act, h, 0.0)
    tl.store(h_ptr + rows[:, None] * stride_hm + units[None, :], h, mask=r_ok[:, None] & u_ok[None, :])
    tl.store(act_ptr + units, unit_act.to(tl.int8), mask=u_ok)
    tl.store(cnt_ptr + rows * n_blocks + tl.program_id(0), tl.sum(act.to(tl.int32), axis=1), mask=r_ok)


@triton.jit
def program_tile(pid, BD: tl.constexpr, D, BM: tl.constexpr, M):
    """``(cols, c_ok, rows, r_ok)``: the BD output columns of program ``pid`` and the BM token rows."""
    cols = pid * BD + tl.arange(0, BD)
    rows = tl.arange(0, BM)
    return cols, cols < D, rows, rows < M


@triton.jit
def up_projection(x_ptr, wu_ptr, rows, r_ok, w_rows, w_ok, acc, D, stride_xm, stride_wu, BK: tl.constexpr,
                  K_STAGES: tl.constexpr, DOT_FP32: tl.constexpr):
    """``acc + x[rows] Wu[w_rows]^T`` over the whole K in steps of BK; Wu rows with ``w_ok`` False are
    not read."""
    offs_k = tl.arange(0, BK)
    for k0 in tl.range(0, D, BK, num_stages=K_STAGES):
        k = k0 + offs_k
        k_ok = k < D
        xt = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(wu_ptr + w_rows[None, :] * stride_wu + k[:, None], mask=w_ok[None, :] & k_ok[:, None],
                     other=0.0)
        acc = dot_acc(xt, wt, acc, DOT_FP32)
    return acc


@triton.jit
def append_listed(idx_row, units, flags, n_listed):
    """Append the ``units`` whose int32 ``flags`` are set to the list at ``idx_row`` (in their order, after
    the ``n_listed`` already there: an exclusive prefix sum gives each its slot); the new length."""
    slot = n_listed + tl.cumsum(flags, axis=0) - flags
    tl.store(idx_row + slot, units, mask=flags != 0)
    return n_listed + tl.sum(flags, axis=0)


@triton.jit
def list_firing(idx_row, flags_ptr, lo, hi, BC: tl.constexpr):
    """List the units in [lo, hi) whose int8 flag is set at ``idx_row``, ascending, BC flags a step (an exclusive
    prefix sum gives each its slot); their number.  Ends with a CTA barrier, so every thread reads the list."""
    n_listed = tl.zeros((), dtype=tl.int32)
    for f0 in range(lo, hi, BC):
        units = f0 + tl.arange(0, BC)
        v = (tl.load(flags_ptr + units, mask=units < hi, other=0) != 0).to(tl.int32)
        n_listed = append_listed(idx_row, units, v, n_listed)
    tl.debug_barrier()  # the CTA's stores above are visible to all its threads below
    return n_listed


@triton.jit
def gather_wdt(wdt_ptr, units, cols, i_ok, c_ok, stride_wf, stride_wd):
    """The [units, cols] tile of Wd^T [F, d] through its two strides: unit-major rows (SparseGatedMLP's
    cached copy) or the nn.Linear weight [d, F] itself, transposed as a view (no copy)."""
    return tl.load(wdt_ptr + units.to(tl.int64)[:, None] * stride_wf + cols.to(tl.int64)[None, :] * stride_wd,
                   mask=i_ok[:, None] & c_ok[None, :], other=0.0)


@triton.jit
def _decode_down_kernel(
    h_ptr, act_ptr, wdt_ptr, out_ptr, idx_ptr, M, D, F, stride_hm, stride_wf, stride_wd, stride_om,
    BM: tl.constexpr, BD: tl.constexpr, BU: tl.constexpr, BC: tl.constexpr, DOT_FP32: tl.constexpr,
    K_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    cols, c_ok, rows, r_ok = program_tile(pid, BD, D, BM, M)
    # 1. Compaction: the firing units' indices, ascending, into this program's scratch row idx[pid, :].
    idx_row = idx_ptr + pid.to(tl.int64) * F
    n_active = list_firing(idx_row, act_ptr, 0, F, BC)
    # 2. K loop over the compacted units, BU at a time, in ascending unit order (fixed: reproducible).
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    for i0 in tl.range(0, n_active, BU, num_stages=K_STAGES):
        i = i0 + tl.arange(0, BU)
        i_ok = i < n_active
        units = tl.load(idx_row + i, mask=i_ok, other=0)
        ht = tl.load(h_ptr + rows[:, None] * stride_hm + units[None, :], mask=r_ok[:, None] & i_ok[None, :],
                     other=0.0)
        acc = dot_acc(ht, gather_wdt(wdt_ptr, units, cols, i_ok, c_ok, stride_wf, stride_wd), acc, DOT_FP32)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], round_to(acc, out_ptr.dtype.element_ty),
             mask=r_ok[:, None] & c_ok[None, :])


@functools.lru_cache(maxsize=1024)
def _meta(m: int, d: int, f: int) -> tuple[int, ...]:
    """``(BM, BK, unit blocks, BD, BU, BC, down-kernel programs, down-kernel warps, down K-loop stages,
    hidden K-loop stages, hidden warps, hidden fused up)`` of a shape: cached, since at decode sizes the launchers'
    Python is most of a call's host time (launch_decode_ffn: 11.7 us a call on the CPU with the launches
    stubbed, bench_results/cpu/module_overhead_session3.log)."""
    bm = max(16, next_pow2(m))  # tl.dot needs 16 rows at least
    bd, bu, warps, stages = _DOWN_SMALL_M if bm <= 16 else _DOWN_LARGE_M
    bk, hidden_stages, hidden_warps, fused_up = _HIDDEN_SMALL_M if bm <= 16 else _HIDDEN_LARGE_M
    bd = min(bd, max(16, next_pow2(d)))
    bu = min(bu, max(16, next_pow2(f)))
    return (bm, min(bk, max(16, next_pow2(d))), triton.cdiv(f, _HIDDEN_BU), bd, bu,
            min(_DOWN_BC, max(16, next_pow2(f))), triton.cdiv(d, bd), warps, stages, hidden_stages, hidden_warps,
            fused_up)


def decode_blocks(n_units: int) -> int:
    """Unit blocks of the hidden kernel: the second dimension of its per-token counts."""
    return triton.cdiv(n_units, _HIDDEN_BU)


def launch_decode_hidden(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, *, match: bool, gate_by_gemm: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(h [M, F], fires [F] int8, counts [M, decode_blocks(F)] int32)`` for x [M, d] (rows contiguous,
    1 <= M <= DECODE_MAX_TOKENS), Wg and Wu [F, d] (rows contiguous); h in x's dtype with ``match``, else
    fp32; ``counts`` the active units per (token, unit block): each row sums to the token's l0.
    ``gate_by_gemm``: the gate through ``F.linear`` (cuBLAS) first, the kernel then only reads g and runs
    the firing units' up projection; default :data:`GATE_BY_GEMM`, or by :data:`GATE_BY_GEMM_MIN_ELEMENTS`."""
    m, d = x.shape
    f = w_gate.shape[0]
    meta = _meta(m, d, f)
    bm, bk, n_blocks = meta[:3]
    h = torch.empty((m, f), dtype=x.dtype if match else torch.float32, device=x.device)
    fires = torch.empty((f,), dtype=torch.int8, device=x.device)
    counts = torch.empty((m, n_blocks), dtype=torch.int32, device=x.device)
    if gate_by_gemm is None:
        gate_by_gemm = GATE_BY_GEMM if GATE_BY_GEMM is not None else w_gate.numel() >= GATE_BY_GEMM_MIN_ELEMENTS
    # cuBLAS's GEMV of the gate, rounded to x's dtype as every path rounds g; the kernel then reads g
    g = torch.nn.functional.linear(x, w_gate) if gate_by_gemm else h
    _decode_hidden_kernel[(n_blocks,)](
        x, w_gate, w_up, g, h, fires, counts, m, d, f, x.stride(0), w_gate.stride(0), w_up.stride(0), g.stride(0),
        h.stride(0), n_blocks, BM=bm, BU=_HIDDEN_BU, BK=bk, DOT_FP32=x.dtype == torch.float32 or interpreting(),
        MATCH=match, K_STAGES=meta[9], FUSED_UP=meta[11] and not gate_by_gemm, GATE_IN=gate_by_gemm,
        num_warps=meta[10],
    )
    return h, fires, counts


def launch_decode_down(h: torch.Tensor, fires: torch.Tensor, w_down_t: torch.Tensor, out_dtype: torch.dtype
                       ) -> torch.Tensor:
    """``round(h Wd^T)`` [M, d] in ``out_dtype`` from h [M, F], the unit flags and Wd^T [F, d] (any
    strides: a contiguous unit-major copy, or ``w_down.t()`` of an nn.Linear weight); neither the Wd^T rows
    nor the h columns of units whose flag is 0 are read.  Sums in ascending unit order: reproducible."""
    m, f = h.shape
    d = w_down_t.shape[1]
    bm, _, _, bd, bu, bc, grid, warps, stages = _meta(m, d, f)[:9]
    out = torch.empty((m, d), dtype=out_dtype, device=h.device)
    scratch = torch.empty((grid, f), dtype=torch.int32, device=h.device)  # per-program list of firing units
    _decode_down_kernel[(grid,)](
        h, fires, w_down_t, out, scratch, m, d, f, h.stride(0), w_down_t.stride(0), w_down_t.stride(1),
        out.stride(0), BM=bm, BD=bd, BU=bu, BC=bc, DOT_FP32=h.dtype == torch.float32 or interpreting(),
        K_STAGES=stages, num_warps=warps,
    )
    return out
