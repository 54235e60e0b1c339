"""PTX for the fused gate's cold epilogue thread by thread: each thread finds the non-zeros among the
accumulator elements it holds and writes them to their TwELL slots itself.

Why: the Triton-level cold epilogue (``hot_cold_gate_kernel._twell_epilogue_by_keys``) works on whole
[BM, TILE] tensors: a key per element, then per slot a minimum over every key of the row, then a layout
change through shared memory to store the [BM, CAP] slots.  In the offline sm_90a build that is ~950 SASS
instructions per thread and cold half-tile at l0=28 (keys ~350, the slot loop 136 per step over 2.6 steps,
the stores ~220), for a tile whose rows hold 0.18 non-zeros on average.  The clock probe put the fused
gate's epilogue at ~0.68 J of the op's 5.54 J per call at M=131072 (bench_results/h200/
clock_probe_session15.log).  Here a thread spends two instructions per pair of elements on a bit mask of
its non-zeros, three shuffles per row and tile to see the other three threads' masks, and work per
non-zero only where there is one: its slot is its rank in column order, counted from the four masks.

What it relies on (checked on the GPU by tests/test_ops_hot_cold_gate.py, not by the interpreter, which
cannot run PTX): the accumulator of a ``BM x BN`` wgmma tile on ``BM / 16`` warps, as Triton 3.6 lays it
out, gives a thread the elements of two rows ``r`` and ``r + 8`` at columns ``8 i + 2 t + j`` (``t`` its
lane modulo 4, ``j`` < 2), and ``tl.inline_asm_elementwise`` hands them over packed two 16-bit values a
register in the order ``(i, row, j)``.  A [128, 128] accumulator on 4 warps (``pingpong_gate_kernel``) gives
a thread two such pairs of rows, r, r + 8 and r + 64, r + 72, the second after the first in register order
(``gl.to_linear_layout``: the last register basis is [64, 0]), so a call per pair sees the same layout
(checked by tests/test_ops_pingpong_gate.py on the GPU).  The rows are passed in (any order of rows works);
the columns are computed from the lane.

Operands of the generated asm (``pack`` = the thread's BM * BN / (32 * warps) elements; 16-bit ``act``
arrives as pack / 2 registers, every other argument as one operand per element):
``act`` (the ReLU output), ``lim`` (int32 per row: valid columns of the output tile from its first, 0
for rows past M), ``vrow`` / ``irow`` (int64 per row: the address of the row's value / index slots of
the output tile's first TwELL tile), ``crow`` (int64 per row: its count of that tile), ``mbase`` (int64:
the unit map at the output tile's first column, read only with ``map_ids``).  The output (int8, one per
element) is a dummy: the asm writes memory.
"""

from __future__ import annotations

import functools

__all__ = ["cold_slots_asm"]


def _mask_and_count(lines: list[str], ti: int, tile: int, n_t: int, half: str) -> None:
    """Own non-zero masks ``mk{rh}{tl}`` (bit ii: column 8 ii + 2 t, bit 16 + ii: column 8 ii + 2 t + 1),
    cleared past each row's valid columns, the quad's masks ``q{d}_{rh}{tl}`` and the counts ``c{rh}{tl}``
    for the ``n_t`` TwELL tiles of the output tile."""
    for rh in range(2):
        for tl in range(n_t):
            lines.append(f"mov.b32 mk{rh}{tl}, 0;")
            for ii in range(ti):
                reg = f"$A{2 * (tl * ti + ii) + rh}"
                lines.append(f"set.gtu.u32.{half}x2 f, {reg}, zero;")
                lines.append(f"and.b32 f, f, {0x10001 << ii};")
                lines.append(f"or.b32 mk{rh}{tl}, mk{rh}{tl}, f;")
    # columns past the valid ones (the last cold tile; rows past M have lim 0): a uniform skip otherwise
    lines.append(f"setp.ge.s32 pfull, lim0, {n_t * tile};")
    lines.append(f"setp.ge.s32 pf1, lim1, {n_t * tile};")
    lines.append("and.pred pfull, pfull, pf1;")
    lines.append("@pfull bra VALID_DONE;")
    for rh in range(2):
        for tl in range(n_t):
            # valid column c < L: j = 0 needs 8 ii + 2 t < L (ii < ceil((L - 2t) / 8)), j = 1 needs 8 ii + 2 t + 1 < L
            lines.append(f"sub.s32 v0, lim{rh}, {tl * tile};")
            lines.append("sub.s32 v0, v0, t2;")
            lines.append("add.s32 v1, v0, 6;")  # ceil((L - 2t - 1) / 8) = floor((L - 2t + 6) / 8)
            lines.append("add.s32 v0, v0, 7;")
            lines.append("shr.s32 v0, v0, 3;")
            lines.append("shr.s32 v1, v1, 3;")
            lines.append(f"max.s32 v0, v0, 0;\nmin.s32 v0, v0, {ti};")
            lines.append(f"max.s32 v1, v1, 0;\nmin.s32 v1, v1, {ti};")
            lines.append("shl.b32 v0, one, v0;\nsub.s32 v0, v0, 1;")  # (1 << n) - 1 (n <= 16)
            lines.append("shl.b32 v1, one, v1;\nsub.s32 v1, v1, 1;\nshl.b32 v1, v1, 16;")
            lines.append(f"or.b32 v0, v0, v1;\nand.b32 mk{rh}{tl}, mk{rh}{tl}, v0;")
    lines.append("VALID_DONE:")
    for rh in range(2):
        for tl in range(n_t):
            m = f"mk{rh}{tl}"
            for d in (1, 2, 3):
                lines.append(f"shfl.sync.bfly.b32 q{d}_{rh}{tl}, {m}, {d}, 0x1f, 0xffffffff;")
            lines.append(f"popc.b32 c{rh}{tl}, {m};")
            for d in (1, 2, 3):
                lines.append(f"popc.b32 f, q{d}_{rh}{tl};\nadd.s32 c{rh}{tl}, c{rh}{tl}, f;")


def _count_store(lines: list[str], tile: int, n_t: int) -> None:
    """Thread t of a quad stores the count of (row t & 1, tile t >> 1) where that tile holds valid columns (with
    one TwELL tile, threads 2 and 3 store nothing)."""
    lines.append("and.b32 f, tq, 1;\nsetp.ne.u32 prh, f, 0;")
    lines.append("and.b32 f, tq, 2;\nsetp.ne.u32 ptl, f, 0;")
    if n_t == 2:
        lines.append("selp.b32 v0, c10, c00, prh;\nselp.b32 v1, c11, c01, prh;\nselp.b32 v0, v1, v0, ptl;")
    else:
        lines.append("selp.b32 v0, c10, c00, prh;")
    lines.append("selp.b32 v1, lim1, lim0, prh;")
    lines.append(f"selp.b32 f, {tile}, 0, ptl;")
    lines.append("setp.gt.s32 pst, v1, f;")
    if n_t == 1:
        lines.append("not.pred pz, ptl;\nand.pred pst, pst, pz;")
    lines.append("selp.b64 addr, crow1, crow0, prh;")
    lines.append("selp.b64 off, 4, 0, ptl;\nadd.s64 addr, addr, off;")
    lines.append("@pst st.global.b32 [addr], v0;")


def _slot_stores(lines: list[str], ti: int, tile: int, n_t: int, cap: int, map_ids: bool) -> None:
    """For each own non-zero: its rank in the row's column order from the quad's masks; below CAP, its value
    and weight-row id (or column) into that slot."""
    # partner t ^ d comes before this thread in column order within an i: d = 1 when t is odd, d = 2, 3
    # when t >= 2
    lines.append("and.b32 f, tq, 1;\nsetp.ne.u32 pb1, f, 0;")
    lines.append("and.b32 f, tq, 2;\nsetp.ne.u32 pb2, f, 0;")
    for rh in range(2):
        for tl in range(n_t):
            tag = f"{rh}{tl}"
            lines.append(f"mov.b32 own, mk{tag};")
            lines.append(f"LOOP{tag}:")
            lines.append(f"setp.eq.u32 pz, own, 0;\n@pz bra DONE{tag};")
            lines.append("bfind.u32 pos, own;\nshl.b32 f, one, pos;\nxor.b32 own, own, f;")
            lines.append("and.b32 ii, pos, 15;\nshr.u32 jj, pos, 4;")
            # rank: earlier columns of this thread, and of the others (all of i <= ii for those before it,
            # i < ii for those after)
            lines.append("shl.b32 lo, one, ii;\nsub.s32 lo, lo, 1;")  # bits below ii
            lines.append("shl.b32 hi, lo, 1;\nor.b32 hi, hi, 1;")  # bits up to ii
            lines.append("shl.b32 f, lo, 16;\nor.b32 lo, lo, f;")
            lines.append("shl.b32 f, hi, 16;\nor.b32 hi, hi, f;")
            lines.append("shl.b32 f, jj, ii;\nor.b32 v0, lo, f;")  # own: j = 1 also counts its j = 0 pair
            lines.append(f"and.b32 v0, v0, mk{tag};\npopc.b32 rank, v0;")
            for d, pred in ((1, "pb1"), (2, "pb2"), (3, "pb2")):
                lines.append(f"selp.b32 v0, hi, lo, {pred};\nand.b32 v0, v0, q{d}_{tag};")
                lines.append("popc.b32 v0, v0;\nadd.s32 rank, rank, v0;")
            lines.append(f"setp.ge.u32 pz, rank, {cap};\n@pz bra LOOP{tag};")
            # the value: register of pair ii (a select tree over the tile's ti registers), half jj
            regs = [f"$A{2 * (tl * ti + k) + rh}" for k in range(ti)]
            level = 0
            while len(regs) > 1:
                lines.append(f"and.b32 f, ii, {1 << level};\nsetp.ne.u32 psel, f, 0;")
                nxt = []
                for k in range(0, len(regs), 2):
                    name = f"s{level}_{k // 2}"
                    lines.append(f"selp.b32 {name}, {regs[k + 1]}, {regs[k]}, psel;")
                    nxt.append(name)
                regs, level = nxt, level + 1
            lines.append(f"shl.b32 f, jj, 4;\nshr.u32 v1, {regs[0]}, f;\ncvt.u16.u32 hv, v1;")
            lines.append(f"cvt.u64.u32 off, rank;\nshl.b64 off, off, 1;\nadd.s64 off, off, {tl * cap * 2};")
            lines.append(f"add.s64 addr, vrow{rh}, off;\nst.global.b16 [addr], hv;")
            # column inside the TwELL tile: 8 ii + 2 t + jj
            lines.append("shl.b32 v1, ii, 3;\nadd.s32 v1, v1, t2;\nadd.s32 v1, v1, jj;")
            if map_ids:
                lines.append(f"add.s32 v1, v1, {tl * tile};\nmul.wide.u32 addr2, v1, 4;\nadd.s64 addr2, addr2, mbase;")
                lines.append("ld.global.b32 v1, [addr2];")
            lines.append("cvt.u16.u32 hv, v1;")
            lines.append(f"add.s64 addr, irow{rh}, off;\nst.global.b16 [addr], hv;")
            lines.append(f"bra LOOP{tag};")
            lines.append(f"DONE{tag}:")


@functools.cache
def cold_slots_asm(bn: int, tile: int, cap: int, pack: int, map_ids: bool, half: str) -> tuple[str, str]:
    """``(asm text, constraints)`` for ``tl.inline_asm_elementwise`` over one output tile's cold epilogue.

    Cached: the same string objects on every launch, so that neither building the ~20 KB text nor hashing
    it for Triton's kernel cache costs host time per call (uncached, the first H200 run spent ~1 ms of host
    time a call on it: at M=16384 the fused gate timed 1.31-1.69 ms against 0.72 for the Triton epilogue,
    host-bound; bench_results/h200/fused_gate_ab_ptx_slots_session15.log).

    ``bn``: the width of the columns a call sees, two TwELL tiles of ``tile`` columns (the fused gate's output
    tile) or one (``pingpong_gate_kernel``'s); ``pack``: elements a call (the thread's two rows times bn / 4
    columns; a thread holding more rows, as a 4-warp [128, 128] accumulator does, makes one call per pair of
    rows); ``half``: "bf16" or "f16".
    """
    if bn not in (tile, 2 * tile) or tile % 8 or tile // 8 > 16:
        raise ValueError(f"cold_slots_asm needs bn = tile or 2 * tile and tile a multiple of 8 up to 128; got {bn}, "
                         f"{tile}")
    if pack != bn // 2:
        raise ValueError(f"a thread of a wgmma accumulator holds 2 rows x {bn // 4} columns = {bn // 2} elements, "
                         f"got pack={pack}")
    if half not in ("bf16", "f16"):
        raise ValueError(f"half must be 'bf16' or 'f16', got {half!r}")
    ti = tile // 8
    n_t = bn // tile
    n_out = pack // 4  # int8 dummy outputs, four a register
    n_act = pack // 2
    # operand numbers: outputs, act registers, then one operand per element for each other argument
    base = {"act": n_out, "lim": n_out + n_act, "vrow": n_out + n_act + pack, "irow": n_out + n_act + 2 * pack,
            "crow": n_out + n_act + 3 * pack, "mbase": n_out + n_act + 4 * pack}
    lines = [
        ".reg .b32 f, zero, one, tq, t2, lim0, lim1, v0, v1, own, pos, ii, jj, lo, hi, rank;",
        ".reg .b32 mk00, mk01, mk10, mk11, c00, c01, c10, c11;",
        ".reg .b32 " + ", ".join(f"q{d}_{rh}{tl}" for d in (1, 2, 3) for rh in range(2) for tl in range(2)) + ";",
        ".reg .b32 " + ", ".join(f"s{lv}_{k}" for lv in range(4) for k in range(8)) + ";",
        ".reg .b16 hv;",
        ".reg .b64 addr, addr2, off, vrow0, vrow1, irow0, irow1, crow0, crow1, mbase;",
        ".reg .pred pz, psel, pfull, pf1, prh, ptl, pst, pb1, pb2;",
        "mov.b32 zero, 0;\nmov.b32 one, 1;",
        "mov.u32 tq, %laneid;\nand.b32 tq, tq, 3;\nshl.b32 t2, tq, 1;",
        # element 0 is (row r, i 0, j 0), element 2 is (row r + 8, i 0, j 0)
        f"mov.b32 lim0, ${base['lim']};\nmov.b32 lim1, ${base['lim'] + 2};",
        f"mov.b64 vrow0, ${base['vrow']};\nmov.b64 vrow1, ${base['vrow'] + 2};",
        f"mov.b64 irow0, ${base['irow']};\nmov.b64 irow1, ${base['irow'] + 2};",
        f"mov.b64 crow0, ${base['crow']};\nmov.b64 crow1, ${base['crow'] + 2};",
        f"mov.b64 mbase, ${base['mbase']};",
    ]
    _mask_and_count(lines, ti, tile, n_t, half)
    _count_store(lines, tile, n_t)
    _slot_stores(lines, ti, tile, n_t, cap, map_ids)
    lines += [f"mov.b32 ${k}, 0;" for k in range(n_out)]
    text = "{\n" + "\n".join(lines) + "\n}"
    for k in range(n_act - 1, -1, -1):  # highest first, so that $A1 does not match inside $A10
        text = text.replace(f"$A{k}", f"${base['act'] + k}")
    constraints = ",".join(["=r"] * n_out + ["r"] * n_act + ["r"] * pack + ["l"] * (4 * pack))
    return text, constraints
