"""Triton kernel: the FFN output from a TwELL gate, without the dense hidden state.

For each token row, with ``a`` the row's active gate values (TwELL):
    gated:     u_j = x . Wu[j],  h_j = a_j * u_j,  out = sum_j h_j * Wd[:, j]
    non-gated: h_j = a_j,                          out = sum_j h_j * Wd[:, j]

One program handles one row.  It flattens the row's non-overflowing row-tiles into one list of
active units (an inclusive prefix sum over the per-tile counts maps list position -> tile, slot), and
walks that list SB units at a time: SB rows of Wu and of Wd^T (unit-major) are gathered at once, so
2 * SB weight rows are in flight per step rather than one dependent load after another.  x and the
output row stay in registers in fp32.

Overflowing row-tiles (count > C) are then done densely over the whole tile: gate values come from
the spill area when the container has one, otherwise they are recomputed from x and Wg (fp32
accumulation, rounded like the gate GEMM), so the result is exact at any density.

Rounding ("match" precision) reproduces a dense PyTorch FFN in the input dtype: u and h are rounded
to it before use; "fp32" keeps them in fp32.  The output is accumulated in fp32 and rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from . import twell_list_kernel
from ._runtime import l2_bytes, next_pow2, pdl_supported, sm_count
from .gate_kernel import relu_keep_nan, round_to
from .twell_ffn_tc_kernel import launch_twell_ffn_tc, tc_eligible
from .twell_list_kernel import heavy_queue, launch_list_twell_rows, list_eligible, unpack_list_entries

#: Default of ``launch_twell_ffn``'s ``preload``: each program loads its row's whole TwELL container
#: ([n_tiles, CAP] values and indices, 2.5 KB at the hot/cold split's 40 cold tiles x 16 slots) with its
#: counts, takes a step's entries from registers, and requests a step's Wu and Wd rows together.  The
#: kernel is latency-bound (2 tokens per SM by registers; at M=131072, l0=28 the cold gather's 2.15 ms is
#: ~4 us per token on its SM, H200), and the shipped path's SASS (nvdisasm of the sm_90a build,
#: bench_results/sm90_offline/session8_row_gather_and_fused_gate.log) waits, per
#: step, on three dependent round trips: the step's slots (found from the counts), its Wu rows, then its
#: Wd rows, requested only after u's reduction.  A token of ~7 cold pairs in two steps of 4 waits on 7
#: round trips; with the preload on 3 (counts and container, then each step's rows).  Prediction: the
#: cold gather 2.15 -> ~1.1-1.4 ms (compute between round trips and the select over 640 slots per step
#: do not shrink; +4.5 % bytes over its weight rows).  The container held and searched grows with
#: n_tiles x CAP (640 slots here, 1792 for the 112 cold tiles of F=14336): ptxas figures above are for
#: 640.  Measured (H200, session 10, bench_results/h200/cold_pack_gather_probe_session10.log, unit ids):
#: slower, 2.347 vs 2.146 ms at M=131072, l0=28 and 0.335 vs 0.323 at M=16384; in the op 8.838 vs 8.583
#: ms (hot_cold_gate_probe_session10.log).  The prediction missed: the select over 640 slots per step
#: costs more issue time than the round trip it saves.  Off.
GATHER_PRELOAD = False
#: Default of ``launch_twell_ffn``'s ``prefetch`` (implies the preload): each step also requests the next
#: step's rows before its own arithmetic waits on its rows (two steps' rows in registers, so SB 2 holds
#: what SB 4 did: 227 registers).  With one step of lookahead two steps share a round trip: 4 steps of 2
#: pairs also wait on ~3.  Triton 3.6 does not pipeline this loop by itself (``tl.range(...,
#: num_stages=2)`` leaves the PTX without cp.async).  Measured (session 10, same logs): slower at every
#: SB and warp count tried, 2.439-3.836 vs 2.146 ms at M=131072, l0=28; the op 9.094 vs 8.583 ms.  Off.
GATHER_PREFETCH = False
#: Default of ``launch_twell_ffn``'s ``tensor_cores``: the rows the block tensor-core kernel takes
#: (:mod:`twell.ops.twell_ffn_tc_kernel`) go through it.  The row kernel's loop issues ~216 instructions
#: per warp and pair slot, 27 of them FFMA, the rest bf16 -> fp32 conversion, slot search and addressing
#: (bench_results/sm90_offline/session9_row_gather_loop_instructions.log); ~40 % of the SM's issue slots
#: at the measured 2.15 ms.  Measured (H200, session 10): slower, 3.195 ms (4 warps, 3 stages; 3.691 with 2
#: stages, 4.779 on 8 warps) against 2.146 at M=131072, l0=28, unit ids, and 0.551 vs 0.323 at M=16384;
#: in the op 9.418 vs 8.583 ms (cold_pack_gather_probe_session10.log, hot_cold_gate_probe_session10.log).
#: The same gathers without arithmetic took 1.342 ms over the cold set's 41 MB of rows with the x, init
#: and output rows (l2_gather_probe_session10.log): the row kernel is 1.6x over that floor, yet trading
#: its per-pair FFMAs for per-block set-up and tensor-core products did not pay.  Off.
GATHER_TENSOR_CORES = False
#: Default of ``launch_twell_ffn``'s ``rows_together``: each step of the shipped (non-preloaded) loop requests
#: its Wu and Wd rows at once, so a step waits on one L2 round trip instead of two (the Wd rows otherwise go
#: out after u's cross-warp reduction, and the compiler moves no load across its barriers: the sm_90a PTX has
#: 8 16-byte loads, the reduction's barriers, then 8 more per step; with the flag 16, then the barriers).  A
#: token of ~7 cold pairs in two steps of 4 then waits on 4 round trips (counts, container entries, two
#: steps) instead of 6.  ptxas (sm_90a, offline, built as launched: D and the row strides specialised as
#: multiples of 16, unit ids + init, SB 4 on 4 warps): 128 registers against 106, 4 programs per SM either
#: way (bench_results/sm90_offline/session13_row_gather_offline.log, as are the other register figures
#: here).  (Register figures quoted in this module before session 13 came from a build without that
#: specialisation, whose weight rows load 2 bytes at a time: 227 registers for the shipped kernel.)
#: Predicted: the cold gather 2.15 -> 1.6-1.8 ms at M=131072, l0=28.  Measured (H200, bf16, 2048 x 5632,
#: synthetic, unit ids + init as the split runs it; bench_results/h200/cold_pack_gather_probe_session13_together
#: .log): 2.145 -> 1.881 ms at M=131072 / l0=28, 2.416 -> 2.135 at l0=56, 0.323 -> 0.279 at M=16384 / l0=28,
#: bit for bit the same output.  SB 1 with it was faster at one point (1.782 at M=131072, l0=28) and slower at
#: the other two (0.405, 2.489); SB 2 (96 registers, 5 programs per SM) 1.977 / 2.359 / 0.319; SB 8 (182, 2
#: programs) 3.771.  On.  Requesting the next step's container entries a step ahead as well (one round trip
#: fewer per token) measured slower: 1.990 vs 1.861 ms at M=131072, l0=28 under a 128-register cap, 2.281 at
#: its uncapped 141 registers (cold_pack_gather_probe_session13_ahead.log; removed after commit 2d56834).
#: At d=4096 (SB 2) it holds 168 registers against 128 (3 programs per SM against 4), at d=8192 (SB 1) 222
#: against 168 (the latter spilling 28 B), both with 128 tile slots; timed at 4096 x 14336 in session 14
#: (cold_pack_gather_probe_session14_4096x14336.log, unit ids, the searched loop): at SB 4 15.954 -> 12.257 ms
#: at M=131072 / l0=72 and 2.073 -> 1.485 at 16384, the shipped SB 2 with it 11.759 / 1.535.  Not timed at
#: d=8192.
GATHER_ROWS_TOGETHER = True
#: Default of ``launch_twell_ffn``'s ``listed``: a pass of :mod:`twell.ops.twell_list_kernel` first writes each
#: row's entries as one flat list (16-bit value and weight-row id per int32), and the row kernel walks it with no
#: search for each entry's tile and slot (~70 SASS instructions per entry, ~280 of the 839-868 per step of 4 in
#: the offline sm_90a build) and with each step's entries requested a step ahead (a plain load, same 128-byte
#: line): a token of ~7 cold pairs waits on 3 L2 round trips (count + first entries, then each step's rows)
#: instead of 5.  Same bits (same entries in the same order).  Rows with an overflowing tile or more than
#: ``LIST_MAX`` entries keep the searched path.  Prediction (H200, 2048 x 5632, M=131072, l0=28): the cold gather
#: 1.88 -> ~1.4-1.6 ms, the list pass ~0.03-0.05 ms.  Measured (H200, bf16, synthetic, unit ids + init as the
#: split runs it; bench_results/h200/cold_pack_gather_probe_session14_listed_v2.log, the list pass included):
#: 1.865 -> 1.540 ms at M=131072 / l0=28 (the list pass 0.078-0.085 of it; 97.5 % of the rows listed), 2.172 ->
#: 1.813 at l0=56, 0.298 -> 0.273 at 16384; same bits.  The op with the fused gate (hot_cold_gate_probe_
#: session14_listed_v2.log, timed between two runs without): 7.537 vs 7.828 / 7.745 ms at 131072 / l0=28 (dense
#: 13.575), 8.837 vs 9.287 / 9.162 at l0=56, 0.960 vs 1.017 / 0.993 at 16384.  SB 2 over the lists: slower at
#: every point (1.572, 1.947, 0.312 ms).  On.
GATHER_LISTED = True
#: Default of ``launch_twell_ffn``'s ``heavy_first`` (with the lists, where :func:`heavy_first_default` says:
#: up to :data:`GATHER_HEAVY_FIRST_MAX_ROWS_PER_SM` rows an SM, the gathered rows in L2): the rows of more than
#: ``twell_list_kernel.HEAVY_MIN_ENTRIES`` cold pairs, and the searched ones, run first, from a queue the list pass
#: fills, and the rest in index order.  Why: the hardware starts a grid's programs in index order as slots free
#: up, so a heavy row late in the order (a sequence's first positions are ~4x denser, and some tokens are dense
#: throughout) runs on after the other slots have gone idle.  The gather costs 14.8 ns a token at M=16384 against
#: 11.9 at 131072 (0.242 / 1.562 ms, clock_probe_session15.log; 131072 at the power cap's lower clocks, 16384 at
#: 1980 MHz), and LIST_MAX 32 -> 128 gained 8.7 % at 16384 against 3.6 % at 131072
#: (fused_gate_ab_list_max_session16.log): both what such a tail would do.  scripts/gather_schedule_sim.py
#: schedules the benchmark problem's rows on the H200's 528 gather slots under a cost of 2 + 1 per step of 4
#: pairs (a searched step 1.36x, as measured in session 14): the makespan in index order is 1.307x its lower
#: bound at M=16384 / l0=28 and 1.031x at 131072, heavy rows first 1.049x / 1.006x.  Predicted: the gather -10 to
#: -20 % at 16384, -0 to -2 % at 131072.  Measured (H200, bf16, 2048 x 5632, l0=28, session 19,
#: bench_results/h200/fused_gate_ab_heavy_first_session19.log; in order / heavy first / in order, back to back at
#: the power cap): the gather with its list pass 0.223 / 0.204 / 0.225 ms at M=16384 (-9 %, the low end of the
#: prediction; 140.8 mJ either way) and the op 0.971 / 0.944 / 0.964 ms (-2.4 %); at 131072 the gather 1.519 /
#: 1.547 / 1.514 ms (+2 %: the queue's atomics and marks cost more than the short tail there) and the op 7.419 /
#: 7.452 / 7.432; same bits.  On, up to the row count below.  The gather builds at 128 registers either way,
#: spilling 4 B (one register stored after the listed loop and loaded after the searched one, once a program;
#: nvdisasm), the list pass at 40 against 39 (ptxas, sm_90a, ``compile_check``).
GATHER_HEAVY_FIRST = True
#: The heavy-first default holds up to this many rows a streaming multiprocessor (33,792 rows on the H200's 132),
#: and only while the cold units' Wu and Wd rows fit in L2 (below).  The model's index-order excess falls with the
#: rows a slot runs: 1.307x at M=16384 (124 rows an SM), 1.163x at 32768 (248), 1.026x at 65536 and 1.031x at
#: 131072 (scripts/gather_schedule_sim.py --m 16384 32768 65536 131072 --searched 1.36; heavy first 1.049x /
#: 1.030x / 1.016x / 1.006x).  Measured at 2048 x 5632, l0=28 (heavy first against in order, back to back):
#: the gather -9 % at 124 rows an SM (above), -15.5 % at 248 (0.395 / 0.394 vs 0.467 ms, the op 1.850 / 1.851 vs
#: 1.896; bench_results/h200/fused_gate_ab_heavy_first_32768_session19.log), +2 % at 993 (above).  The
#: interpreter, without SMs, counts the H200's 132.
GATHER_HEAVY_FIRST_MAX_ROWS_PER_SM = 256
#: ... and while the cold units' Wu and Wd rows (2 x cold units x d x itemsize) fit in the device's L2.  At
#: 4096 x 14336, l0=71.7, 1600 hot units, M=16384 (124 rows an SM; 209 MB of cold rows against the H200's
#: 50-60 MB of L2) heavy first lost: the gather 1.285 / 1.285 vs 1.252 ms in order, the op 4.752 / 4.755 vs 4.748
#: (fused_gate_ab_heavy_first_4096x14336_session19.log).  The model's constant step fits a gather that waits
#: on L2 round trips (2048 x 5632: 41 MB of cold rows); one that streams its rows from HBM is bound by
#: bandwidth, which a lone heavy row at the end has to itself, so its tail is short.  Two shapes measured: the
#: L2 test is the mechanism guessed between them.  The interpreter counts 50 MiB.
_INTERPRETER_SMS = 132
_INTERPRETER_L2_BYTES = 50 * 2**20


def default_sb(d: int, prefetch: bool = False) -> int:
    """Pair slots per step of the row kernel at hidden size ``d`` (``launch_twell_ffn``'s default, measured there)."""
    sb = max(1, min(4, 8192 // next_pow2(d)))
    if prefetch:  # two steps' rows in registers: SB 4 with the prefetch spills 172 B (ptxas), SB 2 none
        sb = max(1, sb // 2)
    return sb


def default_lists(x: torch.Tensor, w_down_t: torch.Tensor, n_cols: int, gated: bool) -> tuple[bool, bool]:
    """``(listed, heavy_first)``: whether :func:`launch_twell_ffn` with its defaults (no ``preload``, ``prefetch``,
    ``tensor_cores``, ``taken``, ``listed`` or ``heavy_first`` given) walks the rows of a container of ``x``'s
    dtype as lists, and in the heavy-first order; False where a switch could route rows elsewhere (the preload,
    the prefetch or the tensor-core gather on)."""
    listed = (GATHER_LISTED and not (GATHER_PRELOAD or GATHER_PREFETCH or GATHER_TENSOR_CORES)
              and list_eligible(x, w_down_t.shape[0]) is None
              and twell_list_kernel.LIST_MAX >= default_sb(x.shape[1]))
    return listed, listed and _heavy_first_for(x, w_down_t, n_cols, gated)


def _heavy_first_for(x: torch.Tensor, w_down_t: torch.Tensor, n_cols: int, gated: bool) -> bool:
    """:func:`heavy_first_default` for a gather of ``x``'s rows over ``n_cols`` units: the Wu and Wd rows it may read
    (Wd only when not ``gated``)."""
    row_bytes = (2 if gated else 1) * n_cols * x.shape[1] * w_down_t.element_size()
    return heavy_first_default(x.shape[0], row_bytes, x.device)


def heavy_first_default(m: int, cold_row_bytes: int, device: torch.device) -> bool:
    """Whether the gather of ``m`` rows over cold units whose Wu and Wd rows take ``cold_row_bytes`` takes its
    heavy rows first by default on ``device``: :data:`GATHER_HEAVY_FIRST`, up to
    :data:`GATHER_HEAVY_FIRST_MAX_ROWS_PER_SM` rows an SM, the rows fitting in L2."""
    cuda = device.type == "cuda"
    sms = sm_count(device.index) if cuda else _INTERPRETER_SMS
    l2 = l2_bytes(device.index) if cuda else _INTERPRETER_L2_BYTES
    return GATHER_HEAVY_FIRST and m <= GATHER_HEAVY_FIRST_MAX_ROWS_PER_SM * sms and cold_row_bytes <= l2


@triton.jit
def _hidden(a, live, wu, x, dtype: tl.constexpr, GATED: tl.constexpr, ROUND_HIDDEN: tl.constexpr):
    """h of SB units from their gate values ``a`` (fp32) and, gated, their Wu rows ``wu`` (fp32); 0 where
    not ``live``."""
    if GATED:
        u = tl.sum(wu * x[None, :], axis=1)
        if ROUND_HIDDEN:
            u = round_to(u, dtype).to(tl.float32)
        h = a * u
    else:
        h = a
    if ROUND_HIDDEN:
        h = round_to(h, dtype).to(tl.float32)
    return tl.where(live, h, 0.0)


@triton.jit
def _units_contribution(a, live, unit, x, offs_d, d_ok, wu_ptr, wdt_ptr, D, dtype: tl.constexpr,
                        GATED: tl.constexpr, ROUND_HIDDEN: tl.constexpr):
    """sum_j h_j * Wd[:, j] over SB units ``unit`` with gate values ``a`` (fp32) where ``live``, the Wd rows
    requested after u (one more round trip than :func:`_unit_rows`; the list loop uses that one when
    ``GATHER_ROWS_TOGETHER`` is on, the dense pass over overflowing tiles this one)."""
    w_off = unit[:, None] * D + offs_d[None, :]
    w_ok = live[:, None] & d_ok[None, :]
    wu = x[None, :]
    if GATED:
        wu = tl.load(wu_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
    h = _hidden(a, live, wu, x, dtype, GATED, ROUND_HIDDEN)
    wd = tl.load(wdt_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
    return tl.sum(h[:, None] * wd, axis=0)


@triton.jit
def _unit_rows(live, unit, offs_d, d_ok, wu_ptr, wdt_ptr, D, GATED: tl.constexpr):
    """The Wu rows (gated; else the Wd rows again) and the Wd^T rows of SB units, in fp32, both requested
    before either is used."""
    w_off = unit[:, None] * D + offs_d[None, :]
    w_ok = live[:, None] & d_ok[None, :]
    if GATED:
        wu = tl.load(wu_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
    wd = tl.load(wdt_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
    if not GATED:
        wu = wd
    return wu, wd


@triton.jit
def _rows_contribution(a, live, wu, wd, x, dtype: tl.constexpr, GATED: tl.constexpr, ROUND_HIDDEN: tl.constexpr):
    """sum_j h_j * Wd[:, j] over SB units whose rows ``wu``, ``wd`` (fp32, from :func:`_unit_rows`) are loaded."""
    return tl.sum(_hidden(a, live, wu, x, dtype, GATED, ROUND_HIDDEN)[:, None] * wd, axis=0)


@triton.jit
def _picked_entries(k, total, pos, row_vals, row_idx, flat, unit_map_ptr, TILE: tl.constexpr, CAP: tl.constexpr,
                    HAS_MAP: tl.constexpr, IDX_IS_UNIT: tl.constexpr):
    """Entries ``k`` of a row's list from its preloaded container: (gate values fp32, weight rows, live)."""
    live = k < total
    pick = pos[None, :] == k[:, None]  # [SB, NT_PAD * CAP], at most one slot per entry
    a = tl.sum(tl.where(pick, row_vals[None, :], 0.0), axis=1)
    unit = tl.sum(tl.where(pick, row_idx[None, :], 0), axis=1).to(tl.int64)
    if not IDX_IS_UNIT:
        unit += tl.sum(tl.where(pick, (flat // CAP)[None, :], 0), axis=1).to(tl.int64) * TILE
        if HAS_MAP:
            unit = tl.load(unit_map_ptr + unit, mask=live, other=0).to(tl.int64)
    return a, unit, live


@triton.jit
def _row_input_and_acc(x_ptr, init_ptr, row, stride_xm, stride_im, offs_d, d_ok, D_PAD: tl.constexpr,
                       HAS_INIT: tl.constexpr):
    """The token's x row in fp32 and its output accumulator: the ``init`` row when given, else zeros."""
    x = tl.load(x_ptr + row * stride_xm + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    if HAS_INIT:
        out = tl.load(init_ptr + row * stride_im + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    else:
        out = tl.zeros((D_PAD,), dtype=tl.float32)
    return x, out


@triton.jit
def _tile_of_entry(k, incl, excl, tiles):
    """For entries ``k`` of a row's tile-by-tile flattened list (``incl``/``excl``: inclusive and
    exclusive prefix sums of the per-tile counts): the tile of each entry and its rank inside it."""
    t_k = tl.sum((incl[None, :] <= k[:, None]).to(tl.int32), axis=1)
    base = tl.sum(tl.where(tiles[None, :] == t_k[:, None], excl[None, :], 0), axis=1)
    return t_k, k - base


@triton.jit
def _listed_entries(k, total, incl, excl, tiles, row, n_tiles, val_ptr, idx_ptr, unit_map_ptr, TILE: tl.constexpr,
                    CAP: tl.constexpr, HAS_MAP: tl.constexpr, IDX_IS_UNIT: tl.constexpr):
    """Entries ``k`` of row ``row``'s tile-by-tile list (``incl``/``excl``: prefix sums of its non-overflowing
    tiles' counts, ``total`` entries): (gate values fp32, weight rows int64, live), read from the container."""
    k_ok = k < total
    t_k, rank = _tile_of_entry(k, incl, excl, tiles)
    slot = (row * n_tiles + t_k) * CAP + rank
    a = tl.load(val_ptr + slot, mask=k_ok, other=0.0).to(tl.float32)
    col = tl.load(idx_ptr + slot, mask=k_ok, other=0).to(tl.int64)
    if IDX_IS_UNIT:  # the pack stored weight-row ids: no map lookup between the index and the rows
        unit = col
    else:
        unit = t_k.to(tl.int64) * TILE + col
        if HAS_MAP:
            unit = tl.load(unit_map_ptr + unit, mask=k_ok, other=0).to(tl.int64)
    return a, unit, k_ok


@triton.jit
def _twell_ffn_row_kernel(
    x_ptr,
    wg_ptr,
    wu_ptr,
    wdt_ptr,
    out_ptr,
    val_ptr,
    idx_ptr,
    cnt_ptr,
    spill_slot_ptr,
    spill_ptr,
    unit_map_ptr,
    init_ptr,
    taken_ptr,
    F,
    D,
    n_tiles,
    stride_xm,
    stride_om,
    stride_im,
    stride_cm,
    TILE: tl.constexpr,
    CAP: tl.constexpr,
    NT_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    SB: tl.constexpr,
    GATED: tl.constexpr,
    HAS_SPILL: tl.constexpr,
    ROUND_HIDDEN: tl.constexpr,
    HAS_MAP: tl.constexpr,
    HAS_INIT: tl.constexpr,
    IDX_IS_UNIT: tl.constexpr = False,
    PRELOAD: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
    SKIP_TC_ROWS: tl.constexpr = False,
    ROWS_TOGETHER: tl.constexpr = False,
    lst_ptr=None,
    lst_n_ptr=None,
    LISTED: tl.constexpr = False,
    LIST_MAX: tl.constexpr = 1,
    heavy_ptr=None,
    heavy_n_ptr=None,
    H_SLOTS=0,
    HEAVY_FIRST: tl.constexpr = False,
    MARK: tl.constexpr = 1,
    skip_ptr=None,
    SKIP_OVERFLOW_ROWS: tl.constexpr = False,
    SKIP_FLAGGED_ROWS: tl.constexpr = False,
    res_ptr=None,
    stride_rm=0,
    HAS_RESIDUAL: tl.constexpr = False,
    PDL_WAIT: tl.constexpr = False,
):
    if PDL_WAIT:  # launched as a programmatic dependent of the list pass: nothing is read before it is done
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    if HEAVY_FIRST:  # (LISTED too) the first H_SLOTS programs take the list pass's heavy queue, the others row
        # pid - H_SLOTS, returning where the queue took it (seen in the row's count below, after its x and init
        # loads have gone out: the loop waits on that count anyway, so no round trip is added to a row): each row
        # computed by one program, in one order
        if row < H_SLOTS:
            if row >= tl.load(heavy_n_ptr):
                return
            row = tl.load(heavy_ptr + row).to(tl.int64)
        else:
            row = row - H_SLOTS
    dtype = val_ptr.dtype.element_ty
    tiles = tl.arange(0, NT_PAD)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    keep = True
    if SKIP_TC_ROWS:  # the tensor-core kernel wrote this row (its flag): read and write nothing (keep masks)
        keep = tl.load(taken_ptr + row) == 0
        d_ok = d_ok & keep
    x, out = _row_input_and_acc(x_ptr, init_ptr, row, stride_xm, stride_im, offs_d, d_ok, D_PAD, HAS_INIT)
    if SKIP_FLAGGED_ROWS:  # (SKIP_OVERFLOW_ROWS too) every flagged row is the caller's, long rows without an
        # overflowing tile included: nothing written.  The flag is requested with the row's first loads and its list
        # count, and tested once those are out, so the test adds no round trip of its own (session 48's GPU run,
        # b3a14df, tested it before the count's load).
        flagged = tl.load(skip_ptr + row)
    n_list = -1
    if LISTED:  # the row's entries as one flat list (twell_list_kernel): no search, rows -1 take the path below
        n_list = tl.load(lst_n_ptr + row)
    if SKIP_FLAGGED_ROWS:
        if flagged != 0:
            return
    if LISTED:
        if HEAVY_FIRST:  # a queued row: done by a queue program; there, its mark off (its count, or -1: searched)
            if (n_list >= MARK - 1) & (tl.program_id(0) >= H_SLOTS):  # (the id read again: nothing held for it)
                return
            n_list = tl.where(n_list >= MARK - 1, n_list - MARK, n_list)
        k = tl.arange(0, SB)
        # the first step's entries, requested with the row's count (in bounds: LIST_MAX >= SB; slots past the
        # count hold whatever was there and are never used)
        p = tl.load(lst_ptr + row * LIST_MAX + k)
        for k0 in range(0, n_list, SB):
            live = k0 + k < n_list
            a, unit = unpack_list_entries(p, live, dtype)
            nxt = k0 + SB + k
            p = tl.load(lst_ptr + row * LIST_MAX + nxt, mask=nxt < n_list, other=0)  # the next step's (same line)
            wu_s, wd_s = _unit_rows(live, unit, offs_d, d_ok, wu_ptr, wdt_ptr, D, GATED)
            out += _rows_contribution(a, live, wu_s, wd_s, x, dtype, GATED, ROUND_HIDDEN)
    searched = n_list < 0

    if PRELOAD or PREFETCH:
        # the row's whole container (every slot, used or not: [n_tiles, CAP] values and indices, contiguous)
        # in the same round trip as its counts, so a step's entries come from registers, not a load that
        # waits on the counts (see launch_twell_ffn's ``preload``)
        flat = tl.reshape(tiles[:, None] * CAP + tl.arange(0, CAP)[None, :], (NT_PAD * CAP,))
        flat_ok = flat < n_tiles * CAP
        row_vals = tl.load(val_ptr + row * n_tiles * CAP + flat, mask=flat_ok & keep, other=0.0).to(tl.float32)
        row_idx = tl.load(idx_ptr + row * n_tiles * CAP + flat, mask=flat_ok & keep, other=0).to(tl.int32)
    cnt = tl.load(cnt_ptr + row * stride_cm + tiles, mask=(tiles < n_tiles) & searched, other=0)
    if SKIP_OVERFLOW_ROWS:  # a flagged row with an overflowing tile is the caller's whole (the hot/cold op's
        # dense rows): nothing more read, nothing written.  Other rows' flags are not read (a listed row's counts
        # stay masked to 0 here: listing excludes an overflowing tile).
        if tl.sum((cnt > CAP).to(tl.int32), axis=0) > 0:
            if tl.load(skip_ptr + row) != 0:
                return
    ell = tl.where(cnt <= CAP, cnt, 0)  # overflowing tiles are handled densely below
    if SKIP_TC_ROWS:
        ell = tl.where(keep, ell, 0)  # such a row has no overflowing tile either: nothing runs below
    incl = tl.cumsum(ell, axis=0)
    excl = incl - ell
    total = tl.sum(ell, axis=0)
    if PRELOAD or PREFETCH:
        # list position of each used slot (a tile's used slots are its first ell ones), -1 elsewhere
        pos2 = excl[:, None] + tl.arange(0, CAP)[None, :]
        pos2 = tl.where(tl.arange(0, CAP)[None, :] < ell[:, None], pos2, -1)
        pos = tl.reshape(pos2, (NT_PAD * CAP,))

    if PREFETCH:
        # the next step's weight rows are requested before this step's arithmetic waits on its own, so a
        # token's steps overlap their round trips (rows of two steps live in registers)
        a_p, unit_p, live_p = _picked_entries(tl.arange(0, SB), total, pos, row_vals, row_idx, flat, unit_map_ptr,
                                              TILE, CAP, HAS_MAP, IDX_IS_UNIT)
        wu_p, wd_p = _unit_rows(live_p, unit_p, offs_d, d_ok, wu_ptr, wdt_ptr, D, GATED)
        for k0 in range(0, total, SB):
            a_n, unit_n, live_n = _picked_entries(k0 + SB + tl.arange(0, SB), total, pos, row_vals, row_idx, flat,
                                                  unit_map_ptr, TILE, CAP, HAS_MAP, IDX_IS_UNIT)
            wu_n, wd_n = _unit_rows(live_n, unit_n, offs_d, d_ok, wu_ptr, wdt_ptr, D, GATED)
            out += _rows_contribution(a_p, live_p, wu_p, wd_p, x, dtype, GATED, ROUND_HIDDEN)
            a_p, live_p, wu_p, wd_p = a_n, live_n, wu_n, wd_n
    else:
        for k0 in range(0, total, SB):
            k = k0 + tl.arange(0, SB)
            if PRELOAD:
                a, unit, k_ok = _picked_entries(k, total, pos, row_vals, row_idx, flat, unit_map_ptr, TILE, CAP,
                                                HAS_MAP, IDX_IS_UNIT)
                # the step's Wu and Wd rows requested together (the shipped path asks for Wd after u)
                wu_s, wd_s = _unit_rows(k_ok, unit, offs_d, d_ok, wu_ptr, wdt_ptr, D, GATED)
                out += _rows_contribution(a, k_ok, wu_s, wd_s, x, dtype, GATED, ROUND_HIDDEN)
            else:
                a, unit, k_ok = _listed_entries(k, total, incl, excl, tiles, row, n_tiles, val_ptr, idx_ptr,
                                                unit_map_ptr, TILE, CAP, HAS_MAP, IDX_IS_UNIT)
                if ROWS_TOGETHER:  # Wu and Wd rows in one round trip (see launch_twell_ffn's ``rows_together``)
                    wu_s, wd_s = _unit_rows(k_ok, unit, offs_d, d_ok, wu_ptr, wdt_ptr, D, GATED)
                    out += _rows_contribution(a, k_ok, wu_s, wd_s, x, dtype, GATED, ROUND_HIDDEN)
                else:
                    out += _units_contribution(a, k_ok, unit, x, offs_d, d_ok, wu_ptr, wdt_ptr, D, dtype, GATED,
                                               ROUND_HIDDEN)

    n_over = tl.sum((cnt > CAP).to(tl.int32), axis=0)
    if n_over > 0:
        for t in range(0, n_tiles):
            c_t = tl.load(cnt_ptr + row * stride_cm + t)
            if c_t > CAP:
                for c0 in range(0, TILE, SB):
                    unit = t * TILE + c0 + tl.arange(0, SB)
                    u_ok = unit < F
                    unit64 = unit.to(tl.int64)
                    if HAS_MAP:
                        unit64 = tl.load(unit_map_ptr + unit64, mask=u_ok, other=0).to(tl.int64)
                    if HAS_SPILL:
                        s_t = tl.load(spill_slot_ptr + row * n_tiles + t).to(tl.int64)
                        a = tl.load(spill_ptr + s_t * TILE + c0 + tl.arange(0, SB), mask=u_ok, other=0.0)
                        a = a.to(tl.float32)
                    else:
                        wg = tl.load(wg_ptr + unit64[:, None] * D + offs_d[None, :], mask=u_ok[:, None] & d_ok[None, :],
                                     other=0.0).to(tl.float32)
                        g = round_to(tl.sum(wg * x[None, :], axis=1), dtype).to(tl.float32)
                        a = relu_keep_nan(g)
                    live = u_ok & (a != 0)
                    out += _units_contribution(a, live, unit64, x, offs_d, d_ok, wu_ptr, wdt_ptr, D, dtype, GATED,
                                               ROUND_HIDDEN)

    y = round_to(out, out_ptr.dtype.element_ty)
    if HAS_RESIDUAL:  # the decoder layer's residual added after the FFN's own rounding, then rounded again: the
        # bits of ``residual + ffn(x)`` in the output dtype (read here, at the end: the loop's registers are free)
        r = tl.load(res_ptr + row * stride_rm + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        y = round_to(y.to(tl.float32) + r, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_om + offs_d, y, mask=d_ok)



def launch_twell_ffn(
    x: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
    counts: torch.Tensor,
    spill_slot: torch.Tensor | None,
    spill_values: torch.Tensor | None,
    w_source: torch.Tensor | None,
    w_up: torch.Tensor | None,
    w_down_t: torch.Tensor,
    *,
    n_cols: int,
    tile: int,
    round_hidden: bool,
    out: torch.Tensor,
    unit_map: torch.Tensor | None = None,
    init: torch.Tensor | None = None,
    sb: int | None = None,
    num_warps: int | None = None,
    idx_is_unit: bool = False,
    preload: bool | None = None,
    prefetch: bool | None = None,
    tensor_cores: bool | None = None,
    tc_config: tuple[int, int] = (4, 3),
    taken: torch.Tensor | None = None,
    rows_together: bool | None = None,
    listed: bool | None = None,
    heavy_first: bool | None = None,
    skip_overflow_rows: torch.Tensor | None = None,
    skip_flagged: bool = False,
    residual: torch.Tensor | None = None,
    heavy: tuple[torch.Tensor, torch.Tensor] | None = None,
    pdl: bool = False,
    lists: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Launch the row kernel.  All tensors validated and contiguous (``counts`` may be a column view of a wider
    buffer: unit stride along its tiles); ``w_down_t`` is Wd^T [F, d].

    ``w_source`` is the weight that produced the activation (Wg, or Wu for the non-gated FFN); it is
    read only to recompute overflowing row-tiles of a container without a spill area.
    ``w_up=None`` selects the non-gated FFN.  ``unit_map`` (int32 [n_cols]) maps the container's
    columns to weight rows (the hot/cold split packs only the cold units); ``init`` ([M, d], any float
    dtype) is added to the output before rounding (the hot units' fp32 partial sums).
    ``idx_is_unit``: the container's indices are weight-row ids (``launch_pack_twell(unit_map=...)``),
    not columns inside a tile; ``unit_map`` is then read only for overflowing row-tiles.
    ``preload`` (None: :data:`GATHER_PRELOAD`): each program reads its row's whole container up front
    (same results, bit for bit; fewer dependent round trips per step).  ``prefetch`` (None:
    :data:`GATHER_PREFETCH`): the preload, and each step's weight rows requested one step ahead.
    ``tensor_cores`` (None: :data:`GATHER_TENSOR_CORES`): rows without an overflowing tile and with at
    most 64 pairs, while their block of 16 holds at most 256, go through
    :mod:`twell.ops.twell_ffn_tc_kernel` (bf16 / fp16 with ``round_hidden`` only; elsewhere the row
    kernel does all), the row kernel then skipping them;
    ``tc_config``: that kernel's ``(num_warps, num_stages)``.
    ``taken`` (int8 [M]; then the tensor-core gather is not used): rows flagged 1 were written by another kernel
    (:mod:`twell.ops.cold_down_kernel`); the row kernel reads and writes nothing for them.
    ``rows_together`` (None: :data:`GATHER_ROWS_TOGETHER`; without the preload): each step requests its Wu and
    Wd rows together instead of the Wd rows after u's reduction (same results, bit for bit).
    ``listed`` (None: :data:`GATHER_LISTED` where the container allows it): the rows' entries are first written
    as flat lists (:mod:`twell.ops.twell_list_kernel`), which the row kernel walks without searching (same
    results, bit for bit); it needs 16-bit values and weight-row ids below 2**16, and excludes the preload, the
    prefetch, the tensor-core gather and ``taken``: asking for it where they are raises ValueError.
    ``heavy_first`` (None: :func:`heavy_first_default` for the ``n_cols`` units' rows, where the rows are listed):
    the heavy rows first, then the others in index order (same results, bit for bit); it needs the lists
    (ValueError without them).
    ``skip_overflow_rows`` (int8 [M]): rows flagged non-zero that have an overflowing tile are neither read nor
    written (the caller computes them whole: ``hot_cold_dense_rows``); a flag on a row without one is not read
    (the row is computed as usual) unless ``skip_flagged``: then every flagged row is skipped (the dense-row pass's
    long rows, ``hot_cold_dense_rows.HEAVY_ROW_PAIRS``).  Not with the tensor-core gather or ``taken`` (ValueError).
    ``residual`` ([M, d], ``out``'s dtype, unit stride along d): every row the kernel writes gets
    ``round(round(ffn) + residual)``, what ``residual + ffn(x)`` gives in that dtype; rows skipped for
    ``skip_overflow_rows`` are the caller's, residual included.  Not with the tensor-core gather or ``taken``
    (their rows are written by another kernel without it; ValueError).
    ``heavy``: the heavy-first queue (``twell_list_kernel.heavy_queue``'s pair, its counter already 0 on the
    device, e.g. zeroed by an earlier kernel) to use where the rows go heavy first; None: allocated here.
    ``pdl``: the caller allows the list pass and this kernel to be launched as programmatic dependents
    (``launch_list_twell_rows``'s ``pdl``), which happens where the rows are listed on a device that supports it
    (:func:`twell.ops._runtime.pdl_supported`): the list pass may then run beside the kernel before it on the
    stream, and this kernel's launch waits behind the list pass's.  Only for a caller whose container was
    written before that kernel, which does not touch the lists either (the hot/cold op: its hot down GEMM);
    everything else the gather reads is complete when it starts.  Same results either way.
    ``lists``: the rows' lists ``(lst, lst_n)`` already written by ``launch_list_twell_rows`` for this container
    (with ``heavy`` iff it filled a heavy queue, which this kernel then takes first; :func:`default_lists` says
    what the defaults would do), so no list pass runs here; with ``pdl`` the gather alone is then launched as a
    programmatic dependent (it waits for the kernel ahead of it before reading anything).
    """
    m, d = x.shape
    if counts.stride(-1) != 1:
        raise ValueError(f"launch_twell_ffn: counts need unit stride along their tiles, got strides {counts.stride()}")
    n_tiles = counts.shape[1]
    if m == 0:
        return out
    d_pad = next_pow2(d)
    # Two [SB, D_PAD] fp32 weight tiles per step, SB * D_PAD <= 8192 (64 registers a thread at 4
    # warps).  Measured on H200 at d=2048, M=131072, l0=28 (scripts/kernel_variants.py): 4 warps with
    # SB=4 took 1.51 ns per active pair, SB=2 1.52, SB=8 1.91; 8 warps 2.17 (more programs per SM win).
    preload = GATHER_PRELOAD if preload is None else preload
    prefetch = GATHER_PREFETCH if prefetch is None else prefetch
    if sb is None:
        sb = default_sb(d, prefetch)
    has_spill = spill_values is not None
    if skip_flagged and skip_overflow_rows is None:
        raise ValueError("launch_twell_ffn: `skip_flagged` needs the flags, `skip_overflow_rows`")
    if skip_overflow_rows is not None:
        if taken is not None or tensor_cores:
            raise ValueError("launch_twell_ffn: `skip_overflow_rows` does not combine with `taken` or the tensor-core "
                             "gather (each picks rows to leave to another kernel); pass one of them")
        if skip_overflow_rows.shape != (m,) or skip_overflow_rows.dtype != torch.int8:
            raise ValueError(f"launch_twell_ffn: skip_overflow_rows must be int8 [{m}], got "
                             f"{skip_overflow_rows.dtype} {tuple(skip_overflow_rows.shape)}")
        tensor_cores = False
    if residual is not None:
        if taken is not None or tensor_cores:
            raise ValueError("launch_twell_ffn: `residual` does not combine with `taken` or the tensor-core gather "
                             "(their rows are written by another kernel, which does not add it)")
        if residual.shape != (m, d) or residual.dtype != out.dtype or residual.stride(1) != 1:
            raise ValueError(f"launch_twell_ffn: residual must be [{m}, {d}] {out.dtype} with unit stride along d, "
                             f"got {residual.dtype} {tuple(residual.shape)} strides {residual.stride()}")
        tensor_cores = False
    if taken is not None and tensor_cores:
        raise ValueError("launch_twell_ffn: `taken` (rows done by another kernel) and the tensor-core gather "
                         "both pick rows to skip; pass one of them")
    use_tc = taken is None and (GATHER_TENSOR_CORES if tensor_cores is None else tensor_cores) and tc_eligible(
        x, round_hidden)
    skip_tc_rows = use_tc or taken is not None
    if (use_tc or taken is not None) and not counts.is_contiguous():
        counts = counts.contiguous()  # the tensor-core gather and the cold-down kernels index [M, n_tiles] counts
    if use_tc:
        taken = launch_twell_ffn_tc(x, values, indices, counts, w_up, w_down_t, tile=tile, out=out, unit_map=unit_map,
                                    init=init, idx_is_unit=idx_is_unit, num_warps=tc_config[0],
                                    num_stages=tc_config[1])
    list_max = twell_list_kernel.LIST_MAX
    unlisted = list_eligible(values, w_down_t.shape[0])
    if unlisted is None and (preload or prefetch or skip_tc_rows):
        unlisted = "it excludes the preload, the prefetch, the tensor-core gather and `taken`"
    if unlisted is None and list_max < sb:
        unlisted = f"the list holds {list_max} entries a row (LIST_MAX), fewer than a step's {sb}"
    if lists is not None:
        if unlisted or listed is False:
            raise ValueError(f"launch_twell_ffn: `lists` given but the rows cannot be walked as lists here: "
                             f"{unlisted or 'listed=False'}")
        if heavy_first is not None and heavy_first != (heavy is not None):
            raise ValueError("launch_twell_ffn: with `lists`, the heavy-first order is the lists' (a `heavy` queue "
                             "or not); heavy_first contradicts it")
        listed, heavy_first = True, heavy is not None
    if listed and unlisted:
        raise ValueError(f"launch_twell_ffn: listed=True but {unlisted}")
    if listed is None:
        listed = GATHER_LISTED and unlisted is None
    if heavy_first and not listed:
        raise ValueError("launch_twell_ffn: heavy_first=True needs the rows listed (listed=True or the default "
                         f"where the container allows it); here they are not{': ' + unlisted if unlisted else ''}")
    if heavy_first is None:
        heavy_first = bool(listed) and _heavy_first_for(x, w_down_t, n_cols, w_up is not None)
    pdl = bool(listed) and pdl and pdl_supported(x.device)
    lst = lst_n = None
    if not heavy_first:
        heavy = None
    if lists is not None:
        lst, lst_n = lists
    elif listed:
        if heavy_first and heavy is None:
            heavy = heavy_queue(m, x.device)
        lst, lst_n = launch_list_twell_rows(values, indices, counts, tile=tile, unit_map=unit_map,
                                            idx_is_unit=idx_is_unit, list_max=list_max, heavy=heavy, pdl=pdl)
    h_slots = heavy[0].numel() if heavy_first else 0
    dummy = values  # any pointer for unused arguments (their loads are compiled out)
    _twell_ffn_row_kernel[(m + h_slots,)](
        x,
        w_source if w_source is not None else dummy,
        w_up if w_up is not None else dummy,
        w_down_t,
        out,
        values,
        indices,
        counts,
        spill_slot if has_spill else counts,
        spill_values if has_spill else dummy,
        unit_map if unit_map is not None else counts,
        init if init is not None else dummy,
        taken if taken is not None else counts,
        n_cols,
        d,
        n_tiles,
        x.stride(0),
        out.stride(0),
        init.stride(0) if init is not None else 0,
        counts.stride(0),
        TILE=tile,
        CAP=values.shape[2],
        NT_PAD=next_pow2(n_tiles),
        D_PAD=d_pad,
        SB=sb,
        GATED=w_up is not None,
        HAS_SPILL=has_spill,
        ROUND_HIDDEN=round_hidden,
        HAS_MAP=unit_map is not None,
        HAS_INIT=init is not None,
        IDX_IS_UNIT=idx_is_unit,
        PRELOAD=preload,
        PREFETCH=prefetch,
        SKIP_TC_ROWS=skip_tc_rows,
        ROWS_TOGETHER=GATHER_ROWS_TOGETHER if rows_together is None else rows_together,
        lst_ptr=lst if listed else counts,
        lst_n_ptr=lst_n if listed else counts,
        LISTED=bool(listed),
        LIST_MAX=lst.shape[1] if listed else 1,
        heavy_ptr=heavy[0] if heavy_first else counts,
        heavy_n_ptr=heavy[1] if heavy_first else counts,
        H_SLOTS=h_slots,
        HEAVY_FIRST=heavy_first,
        MARK=twell_list_kernel.HEAVY_MARK,
        skip_ptr=skip_overflow_rows if skip_overflow_rows is not None else counts,
        SKIP_OVERFLOW_ROWS=skip_overflow_rows is not None,
        SKIP_FLAGGED_ROWS=skip_overflow_rows is not None and skip_flagged,
        res_ptr=residual if residual is not None else dummy,
        stride_rm=residual.stride(0) if residual is not None else 0,
        HAS_RESIDUAL=residual is not None,
        PDL_WAIT=pdl,
        num_warps=num_warps or 4,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out
