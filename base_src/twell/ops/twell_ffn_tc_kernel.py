"""Triton kernel: the FFN output of a TwELL gate for blocks of tokens, the products on tensor cores.

Same result as the row-gather kernel (:mod:`twell.ops.twell_ffn_kernel`) in the "match" rounding for bf16
/ fp16, with the arithmetic moved from the FMA pipe to ``tl.dot``.  The row kernel's main loop spends ~216
instructions per warp on each pair slot, only 27 of them FFMA: the rest converts bf16 weights to fp32,
searches the step's slots and addresses them (bench_results/sm90_offline/session9_row_gather_loop_
instructions.log); at the measured 2.15 ms for the hot/cold split's cold gather (M=131072, l0=28) that
is ~40 % of the SM's issue slots.  A per-token tensor-core version (x in one column of a [d, 16]
operand) was built and discarded before measuring: its SASS issued ~5,200 instructions per warp and
token against the row kernel's ~2,000, the 16-wide token dimension of every product being 15/16 waste.

Here a program takes BT tokens and S pair slots, the tokens' pairs laid out in order (token 0's
first), and computes

    U [BT, S] = X [BT, d] @ Wu[unit(s)]^T [d, S]          (tensor cores, over d in BK chunks)
    H [t, s]  = round(a_s round(U[t, s])) where slot s is token t's, else 0
    out [BT, chunk] = init + H [BT, S] @ Wd^T[unit(s)] [S, chunk]   (tensor cores, per BD chunk of d)

Each live slot's weight rows are read once; the products a token does not need (U off its own slots,
H's zeros) cost tensor-core cycles only.  Accumulation is fp32, the output rounded once (the row kernel's
contract; the summation order differs, so results can differ in the last bit of the final rounding).

Rows the kernel takes (:func:`block_rows_taken`): rows without an overflowing row-tile and with at most
ROW_MAX pairs, in order, while their block's pairs fit in the S slots; the launcher runs the row kernel
on the others (``launch_twell_ffn(..., tensor_cores=True)``), which skips exactly these by the flags this
kernel writes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import interpreting, next_pow2
from .gate_kernel import dot_acc, round_to

#: Tokens per program (the M side of both products: the smallest ``tl.dot`` operand side).
BT = 16
#: Pair slots per program, shared by its tokens in order.  A cold row of the hot/cold split holds 6.95
#: pairs on average at l0=28 and 8.60 at l0=56, but 9.7 % / 13.6 % of the rows hold more than 16, with
#: 40.9 % / 48.2 % of the pairs (synthetic, 8192 tokens, on the CPU: bench_results/sm90_offline/
#: session9_row_gather_loop_instructions.log, part 4): 16 fixed slots per token would have left those to
#: the row kernel; 256 shared slots take a block whole unless its 16 rows hold more.
SLOTS = 256
#: Most pairs of a row the kernel takes: one long row would crowd its block's later rows out, and the
#: row kernel spreads its per-token work over more pairs there.  2.5 % of the cold rows hold more than 32
#: at l0=28 (same sample).
ROW_MAX = 64
#: Tiles per step of the pass that finds each slot's tile (an [SLOTS, TJ_TILES] comparison a step).  SASS
#: per warp and block at the cold split's 40 tiles, in an earlier form with 16 slots per token (ptxas /
#: nvdisasm sm_90a, 4 warps): one tile a step 79 instructions x 40, 8 tiles 339 x 5, 16 tiles 800 x 3,
#: 32 tiles 816 x 2; now 789 x 2 (bench_results/sm90_offline/session9_row_gather_loop_instructions.log).
TJ_TILES = 32
#: d per step of the up product (its [BK, SLOTS] Wu tile: 32 KB of bf16) and of the down product.
BK = 64
BD = 64


@triton.jit
def block_rows_taken(cnt, valid, CAP: tl.constexpr, S: tl.constexpr, ROW_MAX: tl.constexpr):
    """Which rows of a block (``cnt`` [BT, NT_PAD] per-tile counts, ``valid`` [BT] rows inside the batch) the
    tensor-core kernel takes, and their pair counts: rows without an overflowing tile and with at most
    ROW_MAX pairs, in order, while the block's pairs so far fit in S slots.  ROW_MAX keeps one long row
    from crowding its block's later rows out."""
    over = tl.sum((cnt > CAP).to(tl.int32), axis=1)
    total = tl.sum(tl.where(cnt <= CAP, cnt, 0), axis=1)
    eligible = valid & (over == 0) & (total <= ROW_MAX)
    total = tl.where(eligible, total, 0)
    taken = eligible & (tl.cumsum(total, axis=0) <= S)
    return taken, tl.where(taken, total, 0)


@triton.jit
def _twell_ffn_tc_kernel(
    x_ptr, wu_ptr, wdt_ptr, out_ptr, val_ptr, idx_ptr, cnt_ptr, unit_map_ptr, init_ptr, taken_ptr,
    M, D, n_tiles, stride_xm, stride_om, stride_im,
    TILE: tl.constexpr, CAP: tl.constexpr, NT_PAD: tl.constexpr,
    BT_: tl.constexpr, S: tl.constexpr, ROW_MAX_: tl.constexpr, TJ: tl.constexpr, BK_: tl.constexpr,
    BD_: tl.constexpr,
    GATED: tl.constexpr, HAS_MAP: tl.constexpr, HAS_INIT: tl.constexpr, IDX_IS_UNIT: tl.constexpr,
    EVEN_D: tl.constexpr, DOT_FP32: tl.constexpr,
):
    dtype = x_ptr.dtype.element_ty
    t = tl.arange(0, BT_)
    rows = tl.program_id(0).to(tl.int64) * BT_ + t
    tiles = tl.arange(0, NT_PAD)
    cnt = tl.load(cnt_ptr + rows[:, None] * n_tiles + tiles[None, :],
                  mask=(rows < M)[:, None] & (tiles < n_tiles)[None, :], other=0)
    mine, pairs = block_rows_taken(cnt, rows < M, CAP, S, ROW_MAX_)  # the rows this program reads and writes
    tl.store(taken_ptr + rows, mine.to(tl.int8), mask=rows < M)  # for the row kernel, which does the rest

    # slot s: its token (the first whose inclusive pair count exceeds s), its rank k among the token's pairs,
    # then its tile t_k (the number of the token's tiles whose inclusive prefix count is <= k) and its rank
    # in that tile.  Per-token rows are moved to slots by a one-hot [S, BT] product on tensor cores (exact:
    # small integers in fp16).
    s = tl.arange(0, S)
    incl_tok = tl.cumsum(pairs, axis=0)
    live = s < tl.sum(pairs, axis=0)
    owner = tl.sum((incl_tok[None, :] <= s[:, None]).to(tl.int32), axis=1)
    onehot = owner[:, None] == t[None, :]  # [S, BT]
    k = s - tl.sum(tl.where(onehot, (incl_tok - pairs)[None, :], 0), axis=1)
    onehot16 = onehot.to(tl.float16)
    jj = tl.arange(0, TJ)
    run = tl.zeros((BT_,), dtype=tl.int32)
    t_k = tl.zeros((S,), dtype=tl.int32)
    before_k = tl.zeros((S,), dtype=tl.int32)
    for j0 in range(0, n_tiles, TJ):
        # the counts again, TJ tiles a step, from L1 (the [BT, NT_PAD] tile above cannot be sliced by j0)
        c = tl.load(cnt_ptr + rows[:, None] * n_tiles + (j0 + jj)[None, :],
                    mask=mine[:, None] & (j0 + jj < n_tiles)[None, :], other=0)
        inc = tl.cumsum(c, axis=1) + run[:, None]
        run += tl.sum(c, axis=1)
        inc_s = dot_acc(onehot16, inc.to(tl.float16), tl.zeros((S, TJ), dtype=tl.float32), DOT_FP32).to(tl.int32)
        c_s = dot_acc(onehot16, c.to(tl.float16), tl.zeros((S, TJ), dtype=tl.float32), DOT_FP32).to(tl.int32)
        done = inc_s <= k[:, None]  # tile wholly before the slot's pair
        t_k += tl.sum(done.to(tl.int32), axis=1)
        before_k += tl.sum(tl.where(done, c_s, 0), axis=1)
    row_s = tl.program_id(0).to(tl.int64) * BT_ + owner
    slot = (row_s * n_tiles + t_k) * CAP + (k - before_k)
    a = tl.load(val_ptr + slot, mask=live, other=0.0).to(tl.float32)
    unit = tl.load(idx_ptr + slot, mask=live, other=0).to(tl.int32)
    if not IDX_IS_UNIT:
        unit += t_k * TILE
        if HAS_MAP:
            unit = tl.load(unit_map_ptr + unit, mask=live, other=0)
    unit = unit.to(tl.int64)
    own = tl.trans(onehot) & live[None, :]  # [BT, S]: slot s is token t's

    if GATED:
        kk = tl.arange(0, BK_)
        x_ptrs = x_ptr + rows[:, None] * stride_xm + kk[None, :]
        wu_ptrs = wu_ptr + unit[None, :] * D + kk[:, None]  # [BK_, S]: column s = slot s's Wu row
        acc_u = tl.zeros((BT_, S), dtype=tl.float32)
        for d0 in range(0, D, BK_):
            if EVEN_D:  # masks invariant over the loop: no per-step address or mask arithmetic
                xk = tl.load(x_ptrs + d0, mask=mine[:, None], other=0.0)
                wu_t = tl.load(wu_ptrs + d0, mask=live[None, :], other=0.0)
            else:
                k_ok = d0 + kk < D
                xk = tl.load(x_ptrs + d0, mask=mine[:, None] & k_ok[None, :], other=0.0)
                wu_t = tl.load(wu_ptrs + d0, mask=k_ok[:, None] & live[None, :], other=0.0)
            acc_u = dot_acc(xk, wu_t, acc_u, DOT_FP32)
        h = round_to(a[None, :] * round_to(acc_u, dtype).to(tl.float32), dtype).to(tl.float32)
        h = tl.where(own, h, 0.0)  # U off a token's own slots, and dead slots (0 * x), are dropped here
    else:
        h = tl.where(own, a[None, :], 0.0)  # non-gated: h = the activation itself
    h = h.to(wdt_ptr.dtype.element_ty)  # exact: h was rounded to the input dtype (or is a gate value)

    dd = tl.arange(0, BD_)
    wd_ptrs = wdt_ptr + unit[:, None] * D + dd[None, :]  # [S, BD_]
    out_ptrs = out_ptr + rows[:, None] * stride_om + dd[None, :]
    init_ptrs = init_ptr + rows[:, None] * stride_im + dd[None, :]
    for d0 in range(0, D, BD_):
        if EVEN_D:
            io_ok = mine[:, None]
            w_ok = live[:, None]
        else:
            d_ok = d0 + dd < D
            io_ok = mine[:, None] & d_ok[None, :]
            w_ok = live[:, None] & d_ok[None, :]
        if HAS_INIT:
            acc = tl.load(init_ptrs + d0, mask=io_ok, other=0.0).to(tl.float32)
        else:
            acc = tl.zeros((BT_, BD_), dtype=tl.float32)
        wd = tl.load(wd_ptrs + d0, mask=w_ok, other=0.0)
        acc = dot_acc(h, wd, acc, DOT_FP32)
        tl.store(out_ptrs + d0, round_to(acc, out_ptr.dtype.element_ty), mask=io_ok)


def tc_eligible(x: torch.Tensor, round_hidden: bool) -> bool:
    """Whether the tensor-core kernel computes what the row kernel does for these inputs: bf16 / fp16 in
    the "match" rounding (h is then exactly representable as a tensor-core operand) and d >= 16."""
    return round_hidden and x.dtype in (torch.bfloat16, torch.float16) and x.shape[1] >= 16


def launch_twell_ffn_tc(
    x: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
    counts: torch.Tensor,
    w_up: torch.Tensor | None,
    w_down_t: torch.Tensor,
    *,
    tile: int,
    out: torch.Tensor,
    unit_map: torch.Tensor | None = None,
    init: torch.Tensor | None = None,
    idx_is_unit: bool = False,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """Launch the tensor-core kernel over every block of BT rows; it writes the rows :func:`block_rows_taken`
    accepts and leaves the others to the row kernel (``launch_twell_ffn(..., tensor_cores=True)``).
    Inputs validated and contiguous, as for ``launch_twell_ffn``.  Returns which rows it wrote (int8 [M],
    1 = written), the row kernel's ``taken`` flags."""
    m, d = x.shape
    taken = torch.empty(m, dtype=torch.int8, device=x.device)
    if m == 0:
        return taken
    n_tiles = counts.shape[1]
    d_pad = next_pow2(d)
    bk, bd = min(BK, d_pad), min(BD, d_pad)
    dummy = values
    _twell_ffn_tc_kernel[(triton.cdiv(m, BT),)](
        x, w_up if w_up is not None else dummy, w_down_t, out, values, indices, counts,
        unit_map if unit_map is not None else counts, init if init is not None else dummy, taken,
        m, d, n_tiles, x.stride(0), out.stride(0), init.stride(0) if init is not None else 0,
        TILE=tile, CAP=values.shape[2], NT_PAD=next_pow2(n_tiles), BT_=BT, S=SLOTS, ROW_MAX_=ROW_MAX,
        TJ=max(16, min(TJ_TILES, next_pow2(n_tiles))), BK_=bk, BD_=bd, GATED=w_up is not None,
        HAS_MAP=unit_map is not None, HAS_INIT=init is not None, IDX_IS_UNIT=idx_is_unit,
        EVEN_D=d % bk == 0 and d % bd == 0,
        DOT_FP32=interpreting(),  # the interpreter multiplies bf16 operands' raw bits (Triton 3.6)
        num_warps=num_warps, num_stages=num_stages,
    )
    return taken
