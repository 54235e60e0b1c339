"""Small-batch (2-64 tokens) gated FFN in four launches, the down projection split over unit ranges.

Why: the two decode kernels of :mod:`twell.ops.decode_kernels` lose to the dense FFN from two tokens on
(H200, bf16, CUDA-graph GPU time, d=2048, F=5632, 0.5 %: 33.4 vs 31.1 us at two tokens, 38 vs 31 us at
eight, about 3x dense at 64; bench_results/h200/decode_probe_onepass_m124_session6.log and the docstring
of decode_kernels).  Two causes, both in how the work is spread, not in the bytes moved:

* their down kernel gives each program a few output columns and the whole union of firing units, so its
  K loop is a chain of ``union / BU`` dependent gathers (6 steps at two tokens, 25-60 at 64 tokens on the
  synthetic problem, whose union is 470-1800 units at 8-64 tokens and 0.5 %), and every program gathers
  all of h[:, union] again, one 32-byte sector per element of the token-major h;
* their hidden kernel computes the gate itself at 1.2-2.2 TB/s, where cuBLAS reads Wg at ~2.9 TB/s.

Here:

1. g = x Wg^T through cuBLAS (``F.linear``: rounded to x's dtype, as every path rounds g).
2. :func:`_batch_up_kernel`, one program per ``BU`` units: a = relu(g) for the block, one "fires for some
   token" flag per unit and the per-(token, block) counts; blocks where some unit fires run the up
   projection of those units only (masked loads fetch no other Wu row) and store h = round(a round(u))
   unit-major, h^T [F, M]: a firing unit's M values are contiguous.  Rows of units that do not fire are
   neither computed nor written.
3. :func:`_batch_down_kernel`, a (column block, unit range) grid: each program lists the firing units of
   its range (a prefix sum of their flags) and sums h^T[units]^T Wd^T[units, cols] over them, BU units a
   step, in ascending unit order, into an fp32 partial [M, BD] of its own range.  With ``S`` ranges the
   chain of dependent steps is ``S`` times shorter, and h^T rows are whole 2M-byte runs.
4. :func:`_partial_sum_kernel`: out = round(sum of the S partials, in range order).  With S = 1 the down
   kernel writes out itself and this launch is skipped.

Measured (H200, bf16, CUDA-graph GPU time, weights read from DRAM, unit-major Wd^T; session 33's calls 1-6,
bench_results/h200/decode_probe_*_session33.log).  As first built (call 2), d=2048, F=5632, 0.5 %: 27.5 / 28.3 /
29.1 / 29.0 us at 2 / 4 / 8 / 16 tokens against the two decode kernels' 33.4 / 32.5 / 37.7 / 42.2 and dense
30.9-31.8; the prediction had been ~20 us.  Each launch was a short chain of dependent round trips (up 10.2 us,
down with its partial sum 7.7-8.6 us whatever the token count), and ncu (call 4, caches flushed, eight tokens) put
the partial sum at 8.5-9.1 us: 16 programs loading the 15 partials one after the other.  Unrolled on 4x the
programs (call 5) it cut the op to 25.0 / 26.3 us at 2 / 8 tokens (predicted ~25 / ~26).  The final sweep (call 6,
decode_probe_final_call6_session33.log), against dense:

* d=2048, F=5632: 24.7 / 25.5 / 26.2 / 26.4 / 30.4 / 32.2 us at 2 / 4 / 8 / 16 / 32 / 64 tokens, 1.20-1.26x of dense
  to 16 tokens and 1.08-1.09x at 32-64 at 0.5 %; at 2 % 1.13x to 4 tokens, 1.02-1.07x at 8-16, 0.97x / 0.87x at
  32 / 64.
* d=4096, F=14336, 0.5 %: 1.73x / 1.30x / 1.23x / 1.11x / 1.05x at 2-32 tokens, 0.86x at 64; at 2 % 1.27x at two
  tokens, 1.00x at four, 0.89-0.90x at 8-32, 0.68x at 64.

A single kernel for up and down over a (column block, unit range) grid, each program computing u for its range's
firing units, was slower (32.8-39.9 us at d=2048, 0.5 %, 2-16 tokens; call 2) and was removed.

Every sum runs in a fixed order (units ascending inside a range, ranges in order): bitwise reproducible.
Rounding as the dense FFN with ``match``; without it u and h stay fp32 (h^T is then fp32).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._runtime import cdiv, interpreting, next_pow2, pdl_supported, sm_count
from .decode_kernels import _HIDDEN_BU, gather_wdt, list_firing, program_tile, up_projection
from .gate_kernel import dot_acc, relu_keep_nan, round_to

#: Token counts of this path: the up kernel holds a [BM, BU] tile and the down kernel a [BM, BD]
#: accumulator, BM the next power of two >= M (at least 16, tl.dot's smallest operand).
BATCH_MAX_TOKENS = 64
#: Up kernel up to 16 tokens (BM = 16): ``(BK, K-loop stages, warps)``.  Two warps at BK = 256: with four, each warp
#: loads the [16, 16] dot's operands from shared memory itself (192 ldmatrix per K step where 64 do,
#: bench_results/sm90_offline/batch_up_ptx_session36.log).  H200, CUDA-graph GPU time, weights from DRAM
#: (bench_results/h200/batch_up_probe_call1_session38.log): d=2048 / F=5632 7.4 against 10.0 us for the earlier
#: (512, 3, 4) at two tokens and 7.8 against 10.1 at eight, 4096 x 14336 21.7 / 21.5 against 29.2 / 33.2; session 39
#: repeated 7.3 / 7.8 and 21.5 / 21.4 (batch_up_probe_call1_session39.log) and the decode GPU tests passed with it.
_UP_CONFIG = (256, 3, 2)
#: Above 16 tokens: BK = 128, since a [64, 512] x tile in 3 stages needs 240 KB of shared memory (the H200 has
#: 227 KB; bench_results/h200/decode_probe_batch_call1_session33.log).  One warp at 17-32 tokens (BM = 32): 9.8
#: against 12.4 us for four at 32 tokens and d=2048, 30.5-30.6 against 40.8 at 4096 x 14336 (session 38's probe;
#: session 39: 10.1 and 30.4 with it shipped).  Four at 33-64 tokens (BM = 64): one warp spills 932 bytes a thread
#: built for sm_90 and two 200 (four: 52).
_UP_LARGE_M_CONFIG = {32: (128, 3, 1), 64: (128, 3, 4)}
#: Token tiles were tried for 33-64 tokens (BM = 64): two programs of 32 rows a unit block, one warp each, as 17-32
#: tokens run, each flagging the block's firing units over all M tokens and projecting its own rows.  Measured (H100,
#: session 40, bench_results/h100/batch_up_probe_calluptiles_session40.log): slower everywhere, d=2048 12.3 -> 16.0 us,
#: 4096 x 14336 53.0 -> 63.8 (likely because the two tiles read most of the same Wu rows at 0.5 %; not profiled).
#: Removed in session 41 (the kernel is 2c8cb42's again); the variant is in git history at 5dc5870.


def up_config(bm: int) -> tuple[int, int, int]:
    """The up kernel's ``(BK, K-loop stages, warps)`` for a token tile of ``bm`` rows (16, 32 or 64)."""
    return _UP_CONFIG if bm <= 16 else _UP_LARGE_M_CONFIG[bm]


#: Down kernel: ``(BD, BU, warps, K-loop stages, programs per SM)``: BD output columns per program (a
#: 256-byte run of each Wd^T row at BD = 128 in bf16), BU units per K step; the unit ranges S are
#: chosen so that the grid holds about ``programs per SM`` x SMs programs (two: each SM keeps a second
#: program's loads in flight while one waits).
_DOWN_CONFIG = (128, 32, 4, 2, 2)
#: At most this many bytes of fp32 partials (S x M x d x 4): past it S shrinks, since the partials are
#: written and read once more (at 64 tokens, d=2048, S=16 would be 8 MB, as much as the Wd^T rows of a
#: 2000-unit union).
_MAX_PARTIAL_BYTES = 4 * 2**20
#: Partial-sum kernel: elements per program.  With a loop over the S partials that was not unrolled, 16
#: programs of 1024 elements took 8.5-9.1 us at eight tokens (ncu, caches flushed: S = 15 loads one after the
#: other; bench_results/h200/ncu_batch_decode_call4_session33.log); now S is a compile-time constant, the
#: loop unrolled so that all S loads are in flight at once, and the programs 4x as many (the op at eight
#: tokens, d=2048, CUDA-graph time: 0.0302 ms against 0.0320 with 1024 elements a program;
#: decode_probe_pdl_call5_session33.log).
_SUM_BLOCK = 256
#: Up, down and partial-sum kernels launched as programmatic dependents (PDL, compute capability >= 9.0):
#: each is launched while the kernel before it runs and waits (griddepcontrol.wait) before it reads that
#: kernel's outputs, so its launch latency hides behind the previous kernel.
PDL = True
#: Where the up and down kernels let their dependents launch: False (the default) after their last store,
#: True at their start.  At their start the dependents' programs wait on SMs that the kernel before them still
#: fills: at d=4096, F=14336 and eight tokens the op took 0.1188 ms against 0.1055 without PDL (at d=2048
#: 0.0301 against 0.0308; decode_probe_pdl_call5_session33.log); after the last store 0.1056 against 0.1051
#: (decode_probe_final_call6_session33.log).
PDL_EARLY = False


@triton.jit
def _batch_up_kernel(
    x_ptr, g_ptr, wu_ptr, ht_ptr, fires_ptr, cnt_ptr, M, D, F, stride_xm, stride_gm, stride_wu, stride_ht,
    n_blocks,
    BM: tl.constexpr, BU: tl.constexpr, BK: tl.constexpr, DOT_FP32: tl.constexpr, MATCH: tl.constexpr,
    K_STAGES: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr,
):
    units = tl.program_id(0) * BU + tl.arange(0, BU)
    u_ok = units < F
    rows = tl.arange(0, BM)
    r_ok = rows < M
    if PDL:  # g comes from the gate GEMM launched just before
        gdc_wait()
        if EARLY:
            gdc_launch_dependents()
    g = tl.load(g_ptr + rows[:, None] * stride_gm + units[None, :], mask=r_ok[:, None] & u_ok[None, :], other=0.0)
    a = relu_keep_nan(g.to(tl.float32))
    act = (a != 0) & r_ok[:, None] & u_ok[None, :]
    unit_act = tl.max(act.to(tl.int32), axis=0) > 0
    tl.store(fires_ptr + units, unit_act.to(tl.int8), mask=u_ok)
    tl.store(cnt_ptr + rows * n_blocks + tl.program_id(0), tl.sum(act.to(tl.int32), axis=1), mask=r_ok)
    if tl.sum(unit_act.to(tl.int32), axis=0) > 0:
        acc = up_projection(x_ptr, wu_ptr, rows, r_ok, units.to(tl.int64), unit_act, tl.zeros((BM, BU), tl.float32),
                            D, stride_xm, stride_wu, BK, K_STAGES, DOT_FP32)
        if MATCH:
            h = round_to(a * round_to(acc, x_ptr.dtype.element_ty).to(tl.float32), ht_ptr.dtype.element_ty)
        else:
            h = a * acc
        h = tl.where(act, h, 0.0)
        # h^T [F, M]: only the firing units' rows, which are all that the down kernel reads
        tl.store(ht_ptr + units.to(tl.int64)[None, :] * stride_ht + rows[:, None], h,
                 mask=r_ok[:, None] & unit_act[None, :])
    if PDL and not EARLY:
        gdc_launch_dependents()


@triton.jit
def _batch_down_kernel(
    ht_ptr, fires_ptr, wdt_ptr, dst_ptr, idx_ptr, M, D, F, R, stride_ht, stride_wf, stride_wd,
    BM: tl.constexpr, BD: tl.constexpr, BU: tl.constexpr, BC: tl.constexpr, DOT_FP32: tl.constexpr,
    K_STAGES: tl.constexpr, DIRECT: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_s = tl.program_id(1)
    if PDL:  # the flags and h^T come from the up kernel
        gdc_wait()
        if EARLY:
            gdc_launch_dependents()
    cols, c_ok, rows, r_ok = program_tile(pid_c, BD, D, BM, M)
    # 1. The firing units of this program's range [lo, hi), ascending, into its own scratch row.
    lo = pid_s * R
    hi = tl.minimum(lo + R, F)
    idx_row = idx_ptr + (pid_s * tl.num_programs(0) + pid_c).to(tl.int64) * R
    n_active = list_firing(idx_row, fires_ptr, lo, hi, BC)
    # 2. K loop over the listed units, BU at a time, in ascending order (fixed: reproducible).
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    for i0 in tl.range(0, n_active, BU, num_stages=K_STAGES):
        i = i0 + tl.arange(0, BU)
        i_ok = i < n_active
        units = tl.load(idx_row + i, mask=i_ok, other=0)
        ht = tl.load(ht_ptr + units.to(tl.int64)[None, :] * stride_ht + rows[:, None],
                     mask=r_ok[:, None] & i_ok[None, :], other=0.0)
        acc = dot_acc(ht, gather_wdt(wdt_ptr, units, cols, i_ok, c_ok, stride_wf, stride_wd), acc, DOT_FP32)
    if DIRECT:  # one range: this is the output
        tl.store(dst_ptr + rows[:, None] * D + cols[None, :], round_to(acc, dst_ptr.dtype.element_ty),
                 mask=r_ok[:, None] & c_ok[None, :])
    else:
        tl.store(dst_ptr + (pid_s * M + rows)[:, None].to(tl.int64) * D + cols[None, :], acc,
                 mask=r_ok[:, None] & c_ok[None, :])
    if PDL and not EARLY:
        gdc_launch_dependents()


@triton.jit
def _partial_sum_kernel(part_ptr, out_ptr, N, S: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    if PDL:  # the partials come from the down kernel
        gdc_wait()
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(S):
        acc += tl.load(part_ptr + s * N + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, round_to(acc, out_ptr.dtype.element_ty), mask=ok)


def _pdl(device: torch.device, trigger: bool = True) -> dict[str, bool]:
    """The launch arguments of a programmatic dependent: ``PDL`` (and, for kernels that trigger their own
    dependents, ``EARLY``) for the kernel, ``launch_pdl`` for Triton."""
    on = PDL and pdl_supported(device)
    args = {"PDL": on, "launch_pdl": True} if on else {"PDL": False}
    return {**args, "EARLY": PDL_EARLY} if trigger else args


@functools.lru_cache(maxsize=1024)
def down_split(m: int, d: int, f: int, n_sm: int) -> tuple[int, int, int]:
    """``(BD, S, R)`` of the down kernel at M tokens: BD output columns per program, S unit ranges of R
    units each (R a multiple of 64, S x R >= F, no range empty).  Cached: decode calls are host-bound."""
    bd, _, _, _, per_sm = _DOWN_CONFIG
    bd = min(bd, max(16, next_pow2(d)))
    n_cols = cdiv(d, bd)
    s = max(1, min(cdiv(per_sm * n_sm, n_cols), _MAX_PARTIAL_BYTES // (m * d * 4), cdiv(f, 64)))
    return (bd, *unit_ranges(f, s))


def unit_ranges(f: int, splits: int) -> tuple[int, int]:
    """``(S, R)``: F units cut into at most ``splits`` ranges of R units, R a multiple of 64, none empty."""
    r = cdiv(cdiv(f, max(1, splits)), 64) * 64
    return cdiv(f, r), r


def launch_batch_up(
    x: torch.Tensor, g: torch.Tensor, w_up: torch.Tensor, *, match: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(h^T [F, M], fires [F] int8, counts [M, decode_blocks(F)] int32)`` from x [M, d] and g = x Wg^T
    [M, F] (rows contiguous), Wu [F, d] rows contiguous; h^T rows are written only for firing units."""
    m, d = x.shape
    f = g.shape[1]
    n_blocks = cdiv(f, _HIDDEN_BU)
    ht = torch.empty((f, m), dtype=x.dtype if match else torch.float32, device=x.device)
    fires = torch.empty((f,), dtype=torch.int8, device=x.device)
    counts = torch.empty((m, n_blocks), dtype=torch.int32, device=x.device)
    bm = max(16, next_pow2(m))
    bk, stages, warps = up_config(bm)
    _batch_up_kernel[(n_blocks,)](
        x, g, w_up, ht, fires, counts, m, d, f, x.stride(0), g.stride(0), w_up.stride(0), ht.stride(0), n_blocks,
        BM=bm, BU=_HIDDEN_BU, BK=min(bk, max(16, next_pow2(d))),
        DOT_FP32=x.dtype == torch.float32 or interpreting(), MATCH=match, K_STAGES=stages, **_pdl(x.device),
        num_warps=warps,
    )
    return ht, fires, counts


def launch_batch_down(
    ht: torch.Tensor, fires: torch.Tensor, w_down_t: torch.Tensor, out_dtype: torch.dtype, *, splits: int | None = None
) -> torch.Tensor:
    """``round(h Wd^T)`` [M, d] in ``out_dtype`` from h^T [F, M], the unit flags and Wd^T [F, d] (any
    strides); only the firing units' h^T and Wd^T rows are read.  ``splits`` overrides the number of unit
    ranges (tests, probes)."""
    f, m = ht.shape
    d = w_down_t.shape[1]
    _, bu, warps, stages, _ = _DOWN_CONFIG
    n_sm = sm_count(ht.device.index) if ht.device.type == "cuda" else 132
    bd, s, r = down_split(m, d, f, n_sm)
    if splits is not None:
        s, r = unit_ranges(f, splits)
    n_cols = cdiv(d, bd)
    out = torch.empty((m, d), dtype=out_dtype, device=ht.device)
    dst = out if s == 1 else torch.empty((s, m, d), dtype=torch.float32, device=ht.device)
    scratch = torch.empty((s * n_cols, r), dtype=torch.int32, device=ht.device)  # per-program unit lists
    _batch_down_kernel[(n_cols, s)](
        ht, fires, w_down_t, dst, scratch, m, d, f, r, ht.stride(0), w_down_t.stride(0), w_down_t.stride(1),
        BM=max(16, next_pow2(m)), BD=bd, BU=min(bu, max(16, next_pow2(f))), BC=min(1024, next_pow2(r)),
        DOT_FP32=ht.dtype == torch.float32 or interpreting(), K_STAGES=stages, DIRECT=s == 1, **_pdl(ht.device),
        num_warps=warps,
    )
    if s > 1:
        n = m * d
        _partial_sum_kernel[(cdiv(n, _SUM_BLOCK),)](dst, out, n, S=s, BLOCK=_SUM_BLOCK, **_pdl(ht.device, False),
                                                    num_warps=4)
    return out


def launch_batch_ffn(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, *, match: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [M, d], counts [M, decode_blocks(F)])`` for x [M, d] with 1 <= M <= BATCH_MAX_TOKENS, no
    checks (as :func:`twell.ops.decode.launch_decode_ffn`)."""
    m = x.shape[0]
    if not 1 <= m <= BATCH_MAX_TOKENS:
        raise ValueError(f"the batch decode kernels take 1 to {BATCH_MAX_TOKENS} tokens, got {m}")
    x = x.contiguous()
    g = torch.nn.functional.linear(x, w_gate)
    ht, fires, counts = launch_batch_up(x, g, w_up.contiguous(), match=match)
    return launch_batch_down(ht, fires, w_down_t, x.dtype), counts
