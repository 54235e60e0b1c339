"""The small-batch (decode) FFN in one pass over the weights: gate, up and down in one kernel, then a
small column-sum kernel (1-8 tokens).

Why: in the 1.5B model's CUDA-graphed decode step on an H200 the sparse FFN took three kernels of
~8 us each (gate GEMV, up over the firing rows, down), against the dense FFN's ~31 us, because each
step after the gate was a chain of dependent round trips to memory (the up pass a serial K loop over
the firing rows, the down kernel a compaction pass and then its K loop; bench_results/h200/
decode_probe_fused_variants_session6.log: 15.9 us for gate + up, 6.5 us for the down kernel at one
token, d=2048, F=5632, 0.5 %).  cuBLAS's gate followed by one kernel for up and down (each program owning output
columns and recomputing u for every firing unit; removed in session 6) only reached 21.9 us there, and
lost to the two kernels at 2 % density and in the model's step (decode_probe_fused_variants_session6.log,
model/decode_step_fused_session6.log: 3.130 vs 2.955 ms).

Here each program owns ``BU`` consecutive units and does everything for them while their gate rows are
still in its registers:

1. g = round(x Wg[blk]^T) for the (at most 8) tokens: a matrix-vector product by elementwise products
   and row sums (no tensor cores: at 1-8 tokens they would multiply mostly padding), reading Wg in
   ``BK``-column chunks with 16-byte loads.  Every Wg row is read (which units fire is only known from g).
2. a = relu(g); blocks where no token fires store a "no partial" flag and stop: at 0.5 % density and
   BU = 16, 92 % of the blocks at one token.
3. The others load only the firing units' Wu rows (masked loads fetch nothing for the rest), form
   h = round(a round(x Wu^T)), load the same units' Wd^T rows and store, per token that fires in the
   block, the partial output h Wd^T[blk] [d] in fp32 to a scratch row of their own, with a flag.

:func:`_decode_column_sum_kernel` then adds, per token and ``BD`` output columns, the flagged partial
rows (masked loads: the rows of blocks without a partial are never read) and rounds to the output
dtype.  Two launches, no atomics, each sum in a fixed order: bitwise reproducible.  The scratch holds
M x (F / BU) x d fp32 (2.9 MB at one token, d=2048, F=5632), of which only the flagged rows are written.

Prediction (before measuring): the one-pass kernel at the speed of a GEMV over Wg (cuBLAS: 8.3 us at
d=2048, F=5632) plus ~2 us for the firing blocks' two further round trips, the column sum ~2 us: ~12 us
for the FFN at one token against 23.4 us for the hidden + down kernels and 31 us dense.  Measured
(H200, CUDA-graph GPU time, decode_probe_onepass_session6.log): 17.5 us at 0.5 % and 21.5 us at 2 %
(dense 31.2, the two kernels 23.3 and 30.1); 10.9 us when nothing fires.  Part of the miss: ptxas gives
the shipped configuration 153 registers a thread on 8 warps, so an SM holds one program and the 352
programs run in 2.7 waves (``scripts/decode_probe.py --registers``: BK 512 needs 79, three per SM).
That was not it: every configuration with more programs per SM was slower (BK 512 on 8 warps 23.3
against 20.0 us, decode_probe_onepass_variants_session7.log).  At one token with a unit-major Wd^T the
firing units now go row by row (:func:`_fire_units`): 14.9 us at 0.5 %, 16.9 us at 2 %
(decode_probe_fire_units_session7.log).

Rounding as the dense bf16 FFN (``match``): g, u and h rounded to the input dtype, fp32 accumulation;
``match=False`` keeps u and h in fp32.  A NaN gate counts as firing and reaches the output, as in the
dense FFN.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._runtime import next_pow2
from .decode_kernels import _HIDDEN_BU
from .gate_kernel import relu_keep_nan, round_to

#: Largest token count of the one-pass kernel: it unrolls a loop over the tokens (each keeps a [d] fp32
#: partial per firing block), and the scratch grows with M.
ONEPASS_MAX_TOKENS = 8
#: Units per program: the same blocks as the hidden kernel, so that the per-(token, block) active counts
#: have the shape :func:`twell.ops.decode_kernels.decode_blocks` gives (352 programs at F=5632).
_BU = _HIDDEN_BU
#: ``(BK, warps, column-sum BD, column-sum BP, column-sum warps, unrolled gate, up/down chunks at once)``:
#: the weight-row chunk of the one-pass kernel (a [BU, BK] tile per load) and its warps; the column-sum
#: kernel's output columns per program and partial rows per step; whether the gate's K loop is unrolled
#: (all its chunk loads issued before the first is used); the most BK chunks of the firing units' Wu and
#: Wd^T rows requested together (1 or 2: d up to that many chunks goes in one round trip; else a loop).
#: Chosen on an H200 (bf16, 2048 x 5632 / 4096 x 14336, 0.5 %, one token, the sweep's problem; logs
#: bench_results/h200/decode_probe_onepass_{v1,m124,}_session6.log): BK 1024 on 8 warps 19.9 / 79.1 us;
#: one chunk (BK 2048) 21.6 / 86.4, 16 warps 20.7 / 85.2, 4 warps 21.9 / 82.9 (m124); the unrolled gate
#: 22.7-28.3 us at 2048 x 5632; a 16-column sum over 1024 partial rows 19.8 against 23.0 us for 32
#: columns over 512 (v1).  The two-chunk up/down (one round trip instead of four for the ~27 firing
#: blocks, which add 6.6 us to the 10.9 us of a call where nothing fires) is not measured yet: off.
_ONEPASS_CONFIG = (1024, 8, 16, 1024, 4, False, 1)
#: At one token with unit-major Wd^T rows (what SparseGatedMLP passes), up and down of a firing block go
#: unit by unit through whole rows (:func:`_fire_units`) instead of [BU, BK] tiles, for d up to this
#: (the token's x row, its partial and two weight rows are held whole: 4 x 32 values a thread at
#: 8192 on 8 warps).  False: the tile path at every token count (probes compare the two).
FIRE_UNITS_MAX_D: int | bool = 8192


@triton.jit
def _token_row(tile, rows, r):
    """Row ``r`` of a [BM, BU] tile as a [BU] vector (a masked sum: Triton has no dynamic row index)."""
    return tl.sum(tl.where(rows[:, None] == r, tile, 0.0), axis=0)


@triton.jit
def _tile_matvec(w, x_ptr, k, k_ok, rows, M, stride_xm, BM: tl.constexpr):
    """``x[:M, k] w^T`` for a loaded [BU, BK] weight tile ``w``: a [BM, BU] fp32 tile."""
    acc = tl.zeros((BM, w.shape[0]), dtype=tl.float32)
    for r in tl.static_range(BM):
        xr = tl.load(x_ptr + r * stride_xm + k, mask=k_ok & (r < M), other=0.0).to(tl.float32)
        acc += tl.where(rows[:, None] == r, tl.sum(w.to(tl.float32) * xr[None, :], axis=1)[None, :], 0.0)
    return acc


@triton.jit
def _chunk_matvec(x_ptr, w_ptr, w_rows, w_ok, k, rows, M, D, stride_xm, stride_w, BM: tl.constexpr):
    """``x[:M, k] W[w_rows, k]^T`` for the columns ``k`` of one chunk (those >= D masked off)."""
    k_ok = k < D
    w = _load_rows(w_ptr, w_rows, w_ok, k, k_ok, stride_w, 1)
    return _tile_matvec(w, x_ptr, k, k_ok, rows, M, stride_xm, BM)


@triton.jit
def _block_matvec(x_ptr, w_ptr, w_rows, w_ok, rows, M, D, stride_xm, stride_w, BM: tl.constexpr,
                  BU: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr):
    """``x[:M] W[w_rows]^T`` as a [BM, BU] fp32 tile, reading W in [BU, BK] chunks; rows with ``w_ok``
    False are not read.  NK > 0: the NK = cdiv(D, BK) chunks unrolled (their loads can all be in flight at
    once); 0: a loop."""
    acc = tl.zeros((BM, BU), dtype=tl.float32)
    offs_k = tl.arange(0, BK)
    if NK > 0:
        for kc in tl.static_range(NK):
            acc += _chunk_matvec(x_ptr, w_ptr, w_rows, w_ok, kc * BK + offs_k, rows, M, D, stride_xm, stride_w, BM)
    else:
        for k0 in range(0, D, BK):
            acc += _chunk_matvec(x_ptr, w_ptr, w_rows, w_ok, k0 + offs_k, rows, M, D, stride_xm, stride_w, BM)
    return acc


@triton.jit
def _store_partials(h, wd, part_ptr, c, c_ok, rows, n_act, pid, M, D, n_blocks, BM: tl.constexpr):
    """Per token that fires in the block, ``h[r] wd`` ([BK] columns ``c`` of its partial) to its scratch row."""
    for r in tl.static_range(BM):
        part = tl.sum(_token_row(h, rows, r)[:, None] * wd, axis=0)
        fires_r = tl.sum(tl.where(rows == r, n_act, 0), axis=0) > 0
        slot = (r * n_blocks + pid).to(tl.int64) * D
        tl.store(part_ptr + slot + c, part, mask=c_ok & fires_r & (r < M))


@triton.jit
def _decode_onepass_kernel(
    x_ptr, wg_ptr, wu_ptr, wdt_ptr, part_ptr, flag_ptr, cnt_ptr, M, D, F, n_blocks, stride_xm, stride_wg,
    stride_wu, stride_wf, stride_wd,
    BM: tl.constexpr, BU: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, NUD: tl.constexpr,
    DP: tl.constexpr, MATCH: tl.constexpr,
):
    pid = tl.program_id(0)
    units = pid * BU + tl.arange(0, BU)
    u_ok = units < F
    w_rows = units.to(tl.int64)
    rows = tl.arange(0, BM)
    r_ok = rows < M
    g = _block_matvec(x_ptr, wg_ptr, w_rows, u_ok, rows, M, D, stride_xm, stride_wg, BM, BU, BK, NK)
    a = relu_keep_nan(round_to(g, x_ptr.dtype.element_ty).to(tl.float32))  # g rounded as a dense linear
    act = (a != 0) & r_ok[:, None] & u_ok[None, :]
    n_act = tl.sum(act.to(tl.int32), axis=1)  # [BM]: firing units per token in this block
    tl.store(cnt_ptr + rows * n_blocks + pid, n_act, mask=r_ok)
    tl.store(flag_ptr + rows * n_blocks + pid, (n_act > 0).to(tl.int8), mask=r_ok)
    unit_act = tl.max(act.to(tl.int32), axis=0) > 0  # fires for some token
    if DP > 0:  # one token, Wd^T rows contiguous: the firing units one at a time (see _fire_units)
        if tl.sum(unit_act.to(tl.int32), axis=0) > 0:
            _fire_units(tl.sum(tl.where(act, a, 0.0), axis=0), unit_act, x_ptr, wu_ptr, wdt_ptr, part_ptr, pid,
                        D, stride_wu, stride_wf, BU, DP, MATCH)
    elif tl.sum(unit_act.to(tl.int32), axis=0) > 0:
        # The firing units' Wu and Wd^T rows: with NUD = 1 or 2 (d in one or two BK chunks) every chunk of
        # both is requested before any is used, one round trip in all; else a loop over the chunks.
        k = tl.arange(0, BK)
        if NUD == 1:
            k_ok = k < D
            wu = _load_rows(wu_ptr, w_rows, unit_act, k, k_ok, stride_wu, 1)
            wd = _load_rows(wdt_ptr, w_rows, unit_act, k, k_ok, stride_wf, stride_wd)
            h = _hidden(a, _tile_matvec(wu, x_ptr, k, k_ok, rows, M, stride_xm, BM), act, x_ptr, MATCH)
            _store_partials(h, wd.to(tl.float32), part_ptr, k, k_ok, rows, n_act, pid, M, D, n_blocks, BM)
        elif NUD == 2:
            k1 = BK + k
            k1_ok = k1 < D
            wu0 = _load_rows(wu_ptr, w_rows, unit_act, k, k < D, stride_wu, 1)
            wu1 = _load_rows(wu_ptr, w_rows, unit_act, k1, k1_ok, stride_wu, 1)
            wd0 = _load_rows(wdt_ptr, w_rows, unit_act, k, k < D, stride_wf, stride_wd)
            wd1 = _load_rows(wdt_ptr, w_rows, unit_act, k1, k1_ok, stride_wf, stride_wd)
            u = (_tile_matvec(wu0, x_ptr, k, k < D, rows, M, stride_xm, BM)
                 + _tile_matvec(wu1, x_ptr, k1, k1_ok, rows, M, stride_xm, BM))
            h = _hidden(a, u, act, x_ptr, MATCH)
            _store_partials(h, wd0.to(tl.float32), part_ptr, k, k < D, rows, n_act, pid, M, D, n_blocks, BM)
            _store_partials(h, wd1.to(tl.float32), part_ptr, k1, k1_ok, rows, n_act, pid, M, D, n_blocks, BM)
        else:
            u = _block_matvec(x_ptr, wu_ptr, w_rows, unit_act, rows, M, D, stride_xm, stride_wu, BM, BU, BK, 0)
            h = _hidden(a, u, act, x_ptr, MATCH)
            for c0 in range(0, D, BK):
                c = c0 + k
                c_ok = c < D
                wd = _load_rows(wdt_ptr, w_rows, unit_act, c, c_ok, stride_wf, stride_wd).to(tl.float32)
                _store_partials(h, wd, part_ptr, c, c_ok, rows, n_act, pid, M, D, n_blocks, BM)


@triton.jit
def _fire_units(a_row, unit_act, x_ptr, wu_ptr, wdt_ptr, part_ptr, pid, D, stride_wu, stride_wf,
                BU: tl.constexpr, DP: tl.constexpr, MATCH: tl.constexpr):
    """One token's partial ``sum_j h_j Wd^T[j]`` over the block's firing units ``j``, each as a whole row.

    A firing unit's Wu and Wd^T rows are two contiguous d-element loads issued together (one round trip,
    8 bf16 a thread at d=2048 on 8 warps); the [BU, BK] tiles of the block path take four dependent round
    trips at d=2048 (Wu in two chunks, then Wd^T in two), and at 0.5 % density a firing block holds one
    firing unit of 16.  Predicted: the one-pass kernel at one token 15.1 -> ~10.5 us (its gate pass
    alone 8.3).  Measured (H200, bench_results/h200/decode_probe_fire_units_session7.log): 12.3 us, the
    op with its column sum 14.9 against 17.8 us on the tile path (2 %: 16.9 against 21.7); the compiled,
    graphed 1.5B decode step 1.742 -> 1.633 ms once it passed the unit-major copy
    (model/decode_step_session7_1b41db0.log).
    """
    cols = tl.arange(0, DP)
    c_ok = cols < D
    offs_u = tl.arange(0, BU)
    xr = tl.load(x_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)
    part = tl.zeros((DP,), dtype=tl.float32)
    for j in range(BU):
        if tl.sum(tl.where(offs_u == j, unit_act.to(tl.int32), 0), axis=0) > 0:
            row = (pid * BU + j).to(tl.int64)
            wu = tl.load(wu_ptr + row * stride_wu + cols, mask=c_ok, other=0.0).to(tl.float32)
            wd = tl.load(wdt_ptr + row * stride_wf + cols, mask=c_ok, other=0.0).to(tl.float32)
            a_j = tl.sum(tl.where(offs_u == j, a_row, 0.0), axis=0)
            part += _round_hidden(a_j, tl.sum(xr * wu, axis=0), x_ptr, MATCH) * wd
    tl.store(part_ptr + pid.to(tl.int64) * D + cols, part, mask=c_ok)


@triton.jit
def _load_rows(w_ptr, w_rows, w_ok, k, k_ok, stride_row, stride_col):
    """The [BU, BK] tile of rows ``w_rows`` (those with ``w_ok``; the others are not read), columns ``k``."""
    return tl.load(w_ptr + w_rows[:, None] * stride_row + k.to(tl.int64)[None, :] * stride_col,
                   mask=w_ok[:, None] & k_ok[None, :], other=0.0)


@triton.jit
def _round_hidden(a, u, x_ptr, MATCH: tl.constexpr):
    """h = a u, with ``MATCH`` rounded as the dense FFN rounds u and h (to x's dtype)."""
    if MATCH:
        return round_to(a * round_to(u, x_ptr.dtype.element_ty).to(tl.float32), x_ptr.dtype.element_ty).to(tl.float32)
    return a * u


@triton.jit
def _hidden(a, u, act, x_ptr, MATCH: tl.constexpr):
    """h = a u (see :func:`_round_hidden`), 0 where the unit does not fire."""
    return tl.where(act, _round_hidden(a, u, x_ptr, MATCH), 0.0)


@triton.jit
def _decode_column_sum_kernel(part_ptr, flag_ptr, out_ptr, D, n_blocks, stride_om, BD: tl.constexpr,
                              BP: tl.constexpr):
    cols = tl.program_id(0) * BD + tl.arange(0, BD)
    c_ok = cols < D
    r = tl.program_id(1)
    acc = tl.zeros((BD,), dtype=tl.float32)
    for p0 in range(0, n_blocks, BP):
        p = p0 + tl.arange(0, BP)
        flagged = tl.load(flag_ptr + r * n_blocks + p, mask=p < n_blocks, other=0) != 0
        slot = (r * n_blocks + p).to(tl.int64) * D
        t = tl.load(part_ptr + slot[:, None] + cols[None, :], mask=flagged[:, None] & c_ok[None, :], other=0.0)
        acc += tl.sum(t, axis=0)
    tl.store(out_ptr + r * stride_om + cols, round_to(acc, out_ptr.dtype.element_ty), mask=c_ok)


@functools.lru_cache(maxsize=256)
def _meta(m: int, d: int, f: int) -> tuple[int, ...]:
    """``(BM, BK, NK, NUD, blocks, warps, BD, BP, column-sum warps)`` of a shape (cached: launch-time host
    cost)."""
    bk, warps, bd, bp, sum_warps, unroll, ud_chunks = _ONEPASS_CONFIG
    n_blocks = triton.cdiv(f, _BU)
    bk = min(bk, max(16, next_pow2(d)))
    nk = triton.cdiv(d, bk)
    return (next_pow2(m), bk, nk if unroll else 0, nk if nk <= ud_chunks else 0, n_blocks, warps,
            min(bd, max(16, next_pow2(d))), min(bp, max(16, next_pow2(n_blocks))), sum_warps)


def fire_units_width(m: int, d: int, *, unit_major: bool) -> int:
    """The one-pass kernel's ``DP``: the row width of the unit-by-unit up/down (:func:`_fire_units`), or 0
    for the [BU, BK] tile path (more than one token, Wd^T not unit-major, d above ``FIRE_UNITS_MAX_D``)."""
    dp = next_pow2(d)
    return dp if m == 1 and unit_major and FIRE_UNITS_MAX_D and dp <= FIRE_UNITS_MAX_D else 0


def launch_decode_onepass(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, *, match: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [M, d], counts [M, decode_blocks(F)])`` of the ReLU-gated FFN for x [M, d] (rows contiguous,
    1 <= M <= ONEPASS_MAX_TOKENS), as :func:`twell.ops.decode.launch_decode_ffn` returns them.  Wg, Wu
    [F, d] rows contiguous; Wd^T [F, d] with any strides (the ``.t()`` view of the [d, F] weight reads it
    in place, a unit-major copy reads whole rows)."""
    partials, flags, counts = launch_onepass_partials(x, w_gate, w_up, w_down_t, match=match)
    return launch_column_sum(partials, flags, x.dtype), counts


def launch_onepass_partials(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, *, match: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first launch of :func:`launch_decode_onepass`: ``(partials [M, blocks, d] fp32, flags [M, blocks]
    int8, counts [M, blocks] int32)``; a partial row is written only where its flag is 1."""
    m, d = x.shape
    f = w_gate.shape[0]
    if not 1 <= m <= ONEPASS_MAX_TOKENS:
        raise ValueError(f"the one-pass decode kernel takes 1 to {ONEPASS_MAX_TOKENS} tokens, got {m}")
    bm, bk, nk, nud, n_blocks, warps = _meta(m, d, f)[:6]
    dp = fire_units_width(m, d, unit_major=w_down_t.stride(1) == 1)
    partials = torch.empty((m, n_blocks, d), dtype=torch.float32, device=x.device)
    flags = torch.empty((m, n_blocks), dtype=torch.int8, device=x.device)
    counts = torch.empty((m, n_blocks), dtype=torch.int32, device=x.device)
    _decode_onepass_kernel[(n_blocks,)](
        x, w_gate, w_up, w_down_t, partials, flags, counts, m, d, f, n_blocks, x.stride(0), w_gate.stride(0),
        w_up.stride(0), w_down_t.stride(0), w_down_t.stride(1), BM=bm, BU=_BU, BK=bk, NK=nk, NUD=nud, DP=dp,
        MATCH=match, num_warps=warps,
    )
    return partials, flags, counts


def launch_column_sum(partials: torch.Tensor, flags: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The second launch of :func:`launch_decode_onepass`: the flagged partial rows summed per token,
    rounded to ``out_dtype`` ([M, d])."""
    m, n_blocks, d = partials.shape
    bd, bp, sum_warps = _meta(m, d, n_blocks * _BU)[6:]
    out = torch.empty((m, d), dtype=out_dtype, device=partials.device)
    _decode_column_sum_kernel[(triton.cdiv(d, bd), m)](
        partials, flags, out, d, n_blocks, out.stride(0), BD=bd, BP=bp, num_warps=sum_warps,
    )
    return out
