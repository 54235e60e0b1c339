"""Triton kernel: each row's TwELL entries as one flat list, for the row-gather kernel (``GATHER_LISTED``).

The row-gather kernel (:mod:`twell.ops.twell_ffn_kernel`) walks a row's active units SB at a time.  Over
the TwELL container it must find, for each list position k, the tile holding entry k (a search over the
prefix sums of the row's per-tile counts, reduced across the program's lanes) and the slot inside it, then
load that slot: ~70 SASS instructions per entry before any arithmetic (sm_90a, offline, the shipped loop at
d=2048: ~280 of its 839-868 instructions per step of 4 entries), and one more dependent L2 round trip per
step.  This kernel inverts the mapping instead of searching it: every used slot (t, s) of row r goes to
position ``excl[t] + s`` of the row's list (``excl``: the exclusive prefix sum of the row's non-overflowing
tiles' counts), the order the search walks, so the gather sums the same products in the same order and its
output keeps its bits.  It runs a few rows per program, slot rank by slot rank (a row's tiles hold one or two
entries each at the densities it serves).

One list entry is one int32: the gate value's 16 bits (bf16 or fp16) above the weight row's 16-bit id
(after the unit map, when there is one), so the gather reads a step's entries in one 16-byte load and gets
both with a shift and a mask.  ``lst_n[r]`` is the row's entry count, or -1 where the row has an
overflowing tile or more than ``LIST_MAX`` entries: those rows keep the searched path (and its dense pass
over overflowing tiles), so nothing is dropped at any density.

With ``heavy`` buffers (the gather's heavy-first order, ``twell_ffn_kernel.GATHER_HEAVY_FIRST``) the pass also
lists the heavy rows (more than :data:`HEAVY_MIN_ENTRIES` entries, or searched) in a queue of ``H`` slots,
one atomic add per program that holds one, and marks each queued row's ``lst_n`` by adding
:data:`HEAVY_MARK`; the gather's first ``H`` programs take the queue and its in-order programs skip the
marked rows.  A heavy row beyond the queue's slots stays unmarked and runs in order.  The queue's order
depends on the atomics, but every row is still computed by one program in one fixed order: same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._runtime import interpreting, next_pow2, pdl_supported, prefer_max_shared_carveout

#: List entries per row (int32 each: 67 MB at M=131072, a fifth of the cold container's 335 MB).  Rows with more entries
#: keep the searched path.  The hot/cold split at d=2048, F=5632 leaves ~7 cold pairs per token at 0.5 % density (l0 28)
#: and ~17 at 4096 x 14336 (l0 72; bench_results/h200/cold_pack_gather_probe_session14_4096x14336.log), but few tokens
#: hold many: on the synthetic problem at M=16384 (counted on the CPU in session 16,
#: bench_results/cpu_counts/session16_cold_list_lengths.log) the rows over 32 entries were 2.4 % of the rows at l0=28
#: and held 17.8 % of the cold pairs (23.2 % at l0=56); over 64, 6.2 % (8.2 %); over 96, 2.1 % (4.0 %).  Session 14's
#: runs put a searched pair at ~1.36x a listed one (all searched 1.865 ms, 82 % of the pairs listed 1.46 ms at M=131072,
#: l0=28). Prediction for 128 against 32: the gather -3 to -6 % (-0.04 to -0.08 ms at M=131072, l0=28), same bits.
#: Measured (H200, bf16, session 16, scripts/fused_gate_ab.py, 128 / 32 / 128 back to back at the power cap,
#: bench_results/h200/fused_gate_ab_list_max_session16.log): the gather with its list pass 1.519 / 1.525 vs 1.578 ms
#: (-3.6 %) and 1.06 / 1.07 vs 1.10 J at M=131072, l0=28, 0.221 / 0.221 vs 0.242 ms at 16384 (-8.7 %); the op 7.475 /
#: 7.474 vs 7.552 ms and 0.979 / 0.978 vs 0.986; same bits.  As predicted; 128.
LIST_MAX = 128
#: Rows per program of the list pass (at most 1024 // next_pow2(tiles) of them).  One row per program took
#: 0.219 ms at M=131072 (H200, 40 cold tiles of 16 slots tested whole as one [tiles, 16] tensor; bench_results/
#: h200/cold_pack_gather_probe_session14_listed_v1.log), 5x the ~0.04 ms predicted: two dependent round trips
#: per row, one 4-warp program per row, every slot tested.  Several rows a program, slot rank by slot rank
#: (_listed_v2.log): 4 rows 0.078 ms, 16 rows 0.085 ms at M=131072, l0=28; 0.015 / 0.016 ms at 16384.
LIST_ROWS = 4
#: Heavy-first order (``twell_ffn_kernel.GATHER_HEAVY_FIRST``): rows over this many entries go first.  At M=16384,
#: l0=28 they are 396 rows, 2.4 % (scripts/gather_schedule_sim.py); a row of 32 entries is 8 steps of the gather
#: against the median row's 1.
HEAVY_MIN_ENTRIES = 32
#: As a programmatic dependent (``launch_list_twell_rows``'s ``pdl`` / ``after_gate``): only the last program waits for
#: the kernel before it to complete (``griddepcontrol.wait``), which is all that the stream order after this kernel
#: needs (a grid completes when its last program does).  Why: with every program waiting, each list program that had
#: done its rows held its SM until the fused gate ended, so beside the gate the pass's first programs parked and the
#: rest ran after the gate: the pass spanned 0.036-0.047 ms at M=16384, l0=28 and ended ~0.014 ms after the gate,
#: whether it launched from the gate's start or its last round, with the hot tiles last or not (H200, session 26,
#: bench_results/h200/tail_probe_call{2,3}_session26.log).  Predicted with one waiting program and the list pass
#: beside the gate (hot tiles last): the pass's 0.015 ms inside the gate's last round, the op -0.008 to -0.013 ms at
#: M=16384 against the list pass after the hot down GEMM; after the GEMM (``hot_cold.LIST_PDL``) no change.
#: Measured (H200, session 27, interleaved, bench_results/h200/tail_probe_call1_session27.log): beside the gate 0.8075
#: against 0.8157 ms with every program waiting and 0.8128 for the shipped launches at 16384 (the pass's span 0.028
#: against 0.037 ms); after the GEMM 0.8124 against 0.8128 (no change, as predicted).  On.
LIST_ONE_WAITS = True
#: One heavy-queue slot per this many rows (the gather launches cdiv(M, HEAVY_SLOT_EVERY) heavy-first programs, the
#: unused ones returning at once): 1024 slots at M=16384 against the 396 / 619 heavy rows at l0 = 28 / 56.
HEAVY_SLOT_EVERY = 16
#: Added to ``lst_n`` of a row in the heavy queue (unmarked values are -1 .. LIST_MAX, so a marked searched row
#: is HEAVY_MARK - 1 and a marked listed row HEAVY_MARK + its count).
HEAVY_MARK = 1 << 20


@triton.jit
def _list_twell_rows_kernel(val_ptr, idx_ptr, cnt_ptr, unit_map_ptr, lst_ptr, lst_n_ptr, M, n_tiles, stride_cm,
                            TILE: tl.constexpr, CAP: tl.constexpr, NT_PAD: tl.constexpr, LIST_MAX: tl.constexpr,
                            ROWS: tl.constexpr, HAS_MAP: tl.constexpr, IDX_IS_UNIT: tl.constexpr,
                            heavy_ptr=None, heavy_n_ptr=None, H_SLOTS=0, HEAVY_FIRST: tl.constexpr = False,
                            HEAVY_MIN: tl.constexpr = 32, MARK: tl.constexpr = 1, PDL: tl.constexpr = False,
                            done_ptr=None, done_target=0, GATE_BM: tl.constexpr = 1, WAIT_DONE: tl.constexpr = False,
                            PTX_WAIT: tl.constexpr = False, CACHE: tl.constexpr = "", ONE_WAITS: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent of the kernel before it (see launch_list_twell_rows's ``pdl``)
        gdc_launch_dependents()
    if WAIT_DONE:  # beside the fused gate: wait until it has written every cold tile of this row block
        rb = (tl.program_id(0) * ROWS) // GATE_BM
        seen = _load_acquire(done_ptr + rb, PTX_WAIT)
        while seen < done_target:
            if PTX_WAIT:
                _nanosleep()
            seen = _load_acquire(done_ptr + rb, PTX_WAIT)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    tiles = tl.arange(0, NT_PAD)
    cnt = tl.load(cnt_ptr + rows[:, None] * stride_cm + tiles[None, :],
                  mask=row_ok[:, None] & (tiles < n_tiles)[None, :], other=0, cache_modifier=CACHE)
    ell = tl.where(cnt <= CAP, cnt, 0)
    n_over = tl.sum((cnt > CAP).to(tl.int32), axis=1)
    excl = tl.cumsum(ell, axis=1) - ell
    total = tl.sum(ell, axis=1)
    listed = (n_over == 0) & (total <= LIST_MAX) & row_ok
    ell = tl.where(listed[:, None], ell, 0)
    # slot rank by slot rank: a row's tiles hold a few entries each (at 0.5 % density ~7 over 40 tiles), so
    # this loop runs 1-3 times where a [ROWS, tiles, CAP] tensor would test every slot
    for s in range(0, tl.max(tl.max(ell, axis=1), axis=0)):
        used = s < ell
        flat = (rows[:, None] * n_tiles + tiles[None, :]) * CAP + s
        v = tl.load(val_ptr + flat, mask=used, other=0.0, cache_modifier=CACHE)
        unit = tl.load(idx_ptr + flat, mask=used, other=0, cache_modifier=CACHE).to(tl.int32)
        if not IDX_IS_UNIT:  # a column inside its tile: the tile's first column, then the unit map
            unit += tiles[None, :] * TILE
            if HAS_MAP:
                unit = tl.load(unit_map_ptr + unit, mask=used, other=0)
        bits = v.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        tl.store(lst_ptr + rows[:, None] * LIST_MAX + excl + s, (bits << 16) | (unit & 0xFFFF), mask=used)
    n_out = tl.where(listed, total, -1)
    if HEAVY_FIRST:  # the program's heavy rows into the queue: one atomic add for all of them
        heavy = row_ok & (~listed | (total > HEAVY_MIN))
        hv = heavy.to(tl.int32)
        n_heavy = tl.sum(hv, axis=0)
        base = tl.atomic_add(heavy_n_ptr, n_heavy, mask=n_heavy > 0)
        slot = base + tl.cumsum(hv, axis=0) - hv
        queued = heavy & (slot < H_SLOTS)
        tl.store(heavy_ptr + slot, rows.to(tl.int32), mask=queued)
        n_out = tl.where(queued, n_out + MARK, n_out)
    tl.store(lst_n_ptr + rows, n_out, mask=row_ok)
    if PDL:  # the grid done only once the kernel before it is: what follows may read that kernel's outputs too
        if ONE_WAITS:  # one program waits for that (the last one), the others leave their SMs as they finish
            if tl.program_id(0) == tl.num_programs(0) - 1:
                gdc_wait()
        else:
            gdc_wait()


@triton.jit
def _load_acquire(ptr, PTX: tl.constexpr):
    """The int32 at ``ptr`` read with gpu-scope acquire: with ``PTX`` a plain ``ld.acquire`` (GPU; session 25 polled
    with an atomic add of 0, a read-modify-write at L2 on the counters that the gate's releases update), else an atomic
    add of 0 (the interpreter, which runs no PTX)."""
    if PTX:
        return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                         is_pure=False, pack=1)
    else:
        return tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def _nanosleep():
    """A short sleep of the calling threads (PTX ``nanosleep``: the spin above issues less beside the gate)."""
    tl.inline_asm_elementwise("nanosleep.u32 200; // dummy $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def unpack_list_entries(p, live, dtype: tl.constexpr):
    """Gate values (fp32, 0 where not ``live``) and weight rows (int64, 0 where not) of packed list entries."""
    a = (p >> 16).to(tl.int16).to(dtype, bitcast=True).to(tl.float32)
    return tl.where(live, a, 0.0), tl.where(live, p & 0xFFFF, 0).to(tl.int64)


def rows_per_program(nt_pad: int) -> int:
    """Rows a list-pass program takes for a container of ``nt_pad`` (padded) tiles: :data:`LIST_ROWS`, at most
    1024 // nt_pad (a [rows, nt_pad] tile of counts per program), at least one."""
    return max(1, min(LIST_ROWS, 1024 // nt_pad))


def list_eligible(values: torch.Tensor, n_weight_rows: int) -> str | None:
    """Why a container cannot be listed (None: it can): values of 16 bits, weight-row ids below 2**16."""
    if values.element_size() != 2:
        return f"the list packs 16-bit gate values; got {values.dtype}"
    if n_weight_rows > 1 << 16:
        return f"the list packs 16-bit weight-row ids; got {n_weight_rows} rows"
    return None


def launch_list_twell_rows(values: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor, *, tile: int,
                           unit_map: torch.Tensor | None, idx_is_unit: bool, list_max: int | None = None,
                           heavy: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: bool = False,
                           after_gate: tuple[torch.Tensor, int, int] | None = None,
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lst int32 [M, list_max], lst_n int32 [M])`` of a TwELL container (values [M, T, CAP] and indices
    contiguous, counts [M, T] with unit stride along T; validated by the caller): see the module docstring.
    ``list_max`` None: :data:`LIST_MAX`.  ``heavy``: ``(queue int32 [H], queued int32 [1] holding 0)`` to fill
    with the heavy rows (:func:`heavy_queue` allocates them); ``queued`` then holds how many heavy rows there
    were (the queue took the first H).  Check :func:`list_eligible` first.

    ``pdl`` (CUDA, sm_90 and up: :func:`twell.ops._runtime.pdl_supported`): launched as a programmatic
    dependent of the kernel before it on the stream, which it does not read (the container comes from an
    earlier one, complete by then), so its work may overlap that kernel's; its programs let the next kernel
    launch at once and the grid finishes only after that kernel has (every program waits for it, or with
    :data:`LIST_ONE_WAITS` the last one), so the stream order seen from later kernels holds.
    Only for a caller whose inputs were written before the kernel ahead of it.

    ``after_gate`` ``(done, target, row_block)``: launched right after the fused hot/cold gate that writes the
    container and counts each row block's finished cold tiles into ``done`` (``launch_hot_cold_gate``'s ``done``);
    each program waits until its row block's count reaches ``target`` and reads the container past L1, so the pass
    runs beside the gate (programmatic dependent launch on sm_90, as with ``pdl``); under the interpreter, which
    runs the gate's grid first, the waits pass at once.  A program's rows must lie in one row block
    (``row_block`` a multiple of its rows).  The heavy queue's counter must be zero before the gate starts."""
    list_max = LIST_MAX if list_max is None else list_max
    if list_max < 1:
        raise ValueError(f"list_max must be >= 1, got {list_max}")
    if list_max >= HEAVY_MARK - 1:
        raise ValueError(f"list_max must be below {HEAVY_MARK - 1} (HEAVY_MARK - 1), got {list_max}")
    m, n_tiles, cap = values.shape
    lst = torch.empty(m, list_max, dtype=torch.int32, device=values.device)
    lst_n = torch.empty(m, dtype=torch.int32, device=values.device)
    if m == 0:
        return lst, lst_n
    nt_pad = next_pow2(n_tiles)
    rows = rows_per_program(nt_pad)
    wait = {}
    if after_gate is not None:
        done, target, row_block = after_gate
        if row_block % rows:
            raise ValueError(f"after_gate: the gate's row block ({row_block}) must be a multiple of the pass's rows "
                             f"per program ({rows})")
        gpu = pdl_supported(values.device)
        if not (gpu or interpreting()):
            raise ValueError("after_gate needs programmatic dependent launch (CUDA, compute capability >= 9.0) or "
                             "the interpreter")
        pdl = gpu
        wait = {"done_ptr": done, "done_target": target, "GATE_BM": row_block, "WAIT_DONE": True, "PTX_WAIT": gpu,
                "CACHE": ".cg" if gpu else ""}
    kernel = _list_twell_rows_kernel[(triton.cdiv(m, rows),)](
        values, indices, counts, unit_map if unit_map is not None else counts, lst, lst_n, m, n_tiles, counts.stride(0),
        TILE=tile, CAP=cap, NT_PAD=nt_pad, LIST_MAX=list_max, ROWS=rows, HAS_MAP=unit_map is not None,
        IDX_IS_UNIT=idx_is_unit, heavy_ptr=heavy[0] if heavy else lst_n, heavy_n_ptr=heavy[1] if heavy else lst_n,
        H_SLOTS=heavy[0].numel() if heavy else 0, HEAVY_FIRST=heavy is not None, HEAVY_MIN=HEAVY_MIN_ENTRIES,
        MARK=HEAVY_MARK, PDL=pdl, ONE_WAITS=pdl and LIST_ONE_WAITS, num_warps=4,
        **({"launch_pdl": True} if pdl else {}), **wait,
    )
    if after_gate is not None and gpu:
        from .hot_cold_gate_kernel import BESIDE_MAX_CARVEOUT

        if BESIDE_MAX_CARVEOUT:  # the gate's shared-memory configuration, so that its SMs take these programs too
            prefer_max_shared_carveout(kernel)
    return lst, lst_n


def heavy_queue(m: int, device: torch.device, *, zeroed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(queue int32 [cdiv(m, HEAVY_SLOT_EVERY)], queued int32 [1] = 0)`` for :func:`launch_list_twell_rows`'s
    ``heavy`` (the zero is one small fill on the device; with ``zeroed=False`` the counter is left as allocated,
    for a caller that has an earlier kernel write its zero)."""
    queued = torch.zeros if zeroed else torch.empty
    return (torch.empty(triton.cdiv(m, HEAVY_SLOT_EVERY), dtype=torch.int32, device=device),
            queued(1, dtype=torch.int32, device=device))
