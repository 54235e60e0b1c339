"""The hot/cold split's gate GEMM in one Triton kernel whose epilogue writes the hot units' hidden
state and the cold units' TwELL container: the dense [M, F + H] gate + hot-up output never reaches
memory.

Why: the split (``twell.ops.hot_cold``) runs its GEMM in cuBLAS, then a kernel for the hot hidden
state and a pack of the cold columns, which reads the dense output back: at M=131072, l0=28 on an H200
the GEMM takes 4.85 ms, the cold pack 1.63 ms (bench_results/h200/cold_pack_gather_probe_session7.log)
and the [M, 6208] bf16 output is 1.6 GB written and read.  A persistent Triton GEMM on TMA loads
(128 x 256 x 64 tiles, 3 stages, 8 warps) ran at 0.98x of cuBLAS on that shape (4.975 vs 4.851 ms,
bench_results/h200/triton_gemm_probe_session7.log), where our pointer-based one ran at 0.62x, so the
pack can move into the epilogue.  Prediction (session 7): GEMM + hot hidden + cold pack from
~6.9 ms to ~5.5-6 ms at M=131072, 0.5 % (the epilogue's prefix product and scattered stores ~0.5-1 ms
over the mainloop), the op 9.5 -> ~8.3 ms.  Measured (H200, session 8,
bench_results/h200/hot_cold_gate_probe_session8.log): 6.797 -> 6.038 ms for the three kernels it replaces
(the GEMM alone 4.896: the epilogue costs 1.14 ms), the op 9.383 -> 8.559 ms; on by default
(``hot_cold_plan.FUSED_GATE``).  ``scripts/hot_cold_gate_probe.py`` times it against the three kernels.

Layout (``hot_cold_plan.fused_gate_weight``): the weight holds, per TwELL tile of ``TILE`` hot units,
their Wg and Wu rows interleaved (unit j's gate row, then its up row), zero rows padding the last hot
tile, then the cold units' Wg rows.  An output tile is ``BN = 2 * TILE`` columns wide, so a hot output
tile holds the gate and up pre-activations of TILE whole units, adjacent column pairs (which the
accumulator layout keeps in one thread: the split into g and u moves no data), and a cold output tile
holds two TwELL tiles of the cold container.

Results are those of the three kernels it replaces on the same GEMM values (g and u rounded to the
input dtype as a dense linear rounds them, h = round(relu(g) u), NaN gates firing; the cold container
what ``gate_kernel.launch_pack_twell`` writes, weight-row ids with ``unit_ids``, except that with
``FUSED_LEAN_KEYS`` a NaN gate's stored value is a positive NaN, not necessarily the same NaN bits); only
the GEMM's summation order differs from cuBLAS's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents
from triton.tools.tensor_descriptor import TensorDescriptor

from ._runtime import interpreting, pdl_supported, prefer_max_shared_carveout, sm_count
from .cold_slots_ptx import cold_slots_asm
from .gate_kernel import _twell_epilogue, dot_acc, nonzeros_and_counts, relu_keep_nan, round_to, tile_coords
from .hot_cold_plan import FUSED_TILES

#: ``(BM, BK, stages, warps)`` on the GPU: the best configuration of the probe at M=131072, l0=28 (H200,
#: session 8, bench_results/h200/hot_cold_gate_probe_session8.log): 128 x 256 x 64 on 3 stages and 8
#: warps 6.038 ms; 4 stages 6.350; BM 64 7.239-8.141 (BN is 2 * TILE = 256 at the default tile).  The
#: interpreter runs small tiles.  4 stages again with the PTX cold epilogue (session 16: 196,640 B of shared
#: memory, 205 registers, no spill, offline: bench_results/sm90_offline/session16_fused_gate_builds.log;
#: scripts/fused_gate_ab.py, bench_results/h200/
#: fused_gate_ab_4_stages_session16.log, back to back at the power cap): slower, the fused gate 5.387 vs 5.303 /
#: 5.297 ms and 3.80 vs 3.65 / 3.62 J at M=131072, l0=28, 0.676 vs 0.668 / 0.668 at 16384; same bits.
_GPU_CONFIG = (128, 64, 3, 8)
_INTERPRET_CONFIG = (16, 16, 1, 4)
#: With ``done`` (the list pass beside the gate): the gate and that pass's kernel launched with all of each SM's
#: unified L1 / shared memory as shared memory (``_runtime.prefer_max_shared_carveout``), so that list programs fit
#: beside a gate program.  Why: the pipelined gate takes 163,864 B of shared memory (sm_90a offline, session 26), which
#: a 164 KB carveout holds with ~3 KB to spare, against the 2 KB + 1 KB reserved of a list program; its registers leave
#: room for two (196 x 256 of 65,536, the list program 40 x 128).  In session 26's first run the list programs
#: began only as gate programs ended (the pass spanned 0.046 ms, from the gate's last round on, with the gate 0.521 ms).
#: Measured (H200, session 26, bench_results/h200/tail_probe_call2_session26.log): no change; the pass still began
#: in the gate's last round (0.046 / 0.044 ms with / without; the op 0.8035 / 0.8032 ms at M=16384, l0=28): off.
BESIDE_MAX_CARVEOUT = False
#: The cold epilogue's slot positions by a tensor-core product (True) or ``tl.cumsum`` (False; see
#: ``gate_kernel._twell_epilogue``).  The product spills 1308 bytes (ptxas, sm_90a, BN = 256, 8 warps)
#: against 324 with the scan and ran 8.871 vs 6.038 ms at M=131072, l0=28 (session 8 probe): the scan.
FUSED_PREFIX_DOT = False
#: Flatten the persistent loop over output tiles with the K loop (``tl.range(..., flatten=True)``), so
#: that the software pipeliner issues the next tile's TMA loads during this tile's epilogue.  On since
#: session 17: with the PTX slots it builds at 202 registers and no spill against 175 unflattened (ptxas,
#: sm_90a, bench_results/sm90_offline/session16_fused_gate_builds.log), and timed shipped / flattened /
#: shipped back to back at the power cap (H200, l0=28) the fused gate took 5.385 vs 5.456 / 5.444 ms and
#: 3.74 vs 3.81 / 3.86 J at M=131072, 0.678 vs 0.686 / 0.687 ms at 16384; the op 7.456 vs 7.529 / 7.533
#: and 0.971 vs 0.981 / 0.986 ms; same bits (bench_results/h200/fused_gate_ab_flatten_session17.log):
#: ~1 % at both sizes, outside the unflattened runs' 0.2 % spread.  Earlier builds did not gain: session
#: 8, spilling 556 B, 6.346 vs 6.148 ms (hot_cold_gate_probe_flatten_session8.log); session 13 with the
#: lean keys, within the two runs' order effect (5.672 vs 5.671 and 5.450 vs 5.498 ms,
#: hot_cold_gate_probe_session13_flat.log, _flat_first.log).  ``warp_specialize=True`` on the same loop
#: compiles to the identical PTX with Triton 3.6 on sm_90 (no producer warps), so it is not a knob here.
#: The interpreter runs the loop unflattened (it does not model the pipeliner).
FUSED_FLATTEN = True
#: The cold epilogue's slots rank by rank (``_twell_epilogue_by_rank``: per step one min over each row
#: of int32 ``column << 16 | value bits`` keys, the steps running to the tile's largest row count) instead
#: of ``tl.cumsum`` over the [BM, TILE] tile and a masked store per element; 16-bit inputs only (fp32
#: values do not fit a key).  Offline sm_90a build (session 11): 4104 SASS instructions against 6048,
#: no spills against 76 B, a loop body of ~190 instructions with no barrier; the rows' largest count per
#: 128 x 128 cold tile averages 2.6 steps at l0=28 (synthetic generator, M=16384, H=576).  Predicted:
#: the fused gate 6.04 -> ~5.6-5.75 ms at M=131072, l0=28.  Measured (H200, session 11, the same run,
#: bench_results/h200/hot_cold_gate_probe_session11.log): 6.028 vs 6.075 ms with the scan at M=131072,
#: l0=28 (op 8.554 vs 8.637), 0.727 vs 0.793 at M=16384 (op 1.110 vs 1.153), 6.762 vs 6.676 at
#: M=131072, l0=56 (op 9.960 vs 9.946).  The prediction missed at 131072 (the epilogue is not bound by
#: its instruction count there); on, for the 8 % at 16384 (the op at 1 % within 0.2 %).
FUSED_RANK_SLOTS = True
#: Programs launched per SM.  With 1 (the shipped value) each SM runs one program whose epilogue (1.14 ms
#: of the 6.04 at M=131072) leaves the tensor cores idle; 2 needs a configuration two of which fit on an
#: SM: by ptxas and Triton's shared-memory figure (bench_results/sm90_offline/session8_*.log), BM 64 on
#: 4 warps with 2 stages (255 registers x 128 threads, 82 KB) does, BM 128 on 8 warps (255 x 256 threads,
#: the whole register file) does not.  The
#: price is a B tile per 64 rows instead of 128 (1.67x the shared-memory fill per FLOP).  Measured (H200,
#: session 10, bench_results/h200/hot_cold_gate_probe_session10.log): slower, 7.035 ms for BM 64 two per
#: SM against 6.128 for the shipped one at M=131072, l0=28 (11.491 for BM 64 one per SM).  Session 12
#: (bench_results/h200/hot_cold_gate_probe_session12.log, triton_gemm_probe_session12.log): 128 x 128
#: output tiles (one TwELL tile, half a hot tile) two per SM, 4 warps on 3 stages (98 KB, 255 registers:
#: two fit) 6.616 ms, on 2 stages 6.943, 8 warps under a 128-register ceiling 6.458, against 6.081 for the
#: shipped kernel; their mainloop alone, a plain TMA GEMM of 128 x 128 tiles two per SM, ran 7.118 /
#: 6.249 / 7.210 ms against 5.033 for 128 x 256 one per SM (cuBLAS 4.970).  Two programs per SM starve
#: each other's mainloop more than the overlap gives.  1.
FUSED_PROGRAMS_PER_SM = 1
#: The cold epilogue by ``_twell_epilogue_by_keys`` (16-bit inputs): the ReLU and rounding by one PTX
#: ``cvt.rn.relu`` per two elements, keys from the magnitude bits without row and column masks, slots by
#: an unsigned minimum over ``key - threshold`` that retires no key.  The session 12 ncu source view of
#: the shipped epilogue (M=131072, l0=28, bench_results/h200/ncu_fused_gate_session12_sass.csv.gz): per 128 x
#: 128 cold half-tile and warp ~880-1050 instructions before the slot loop (~14 per element: conversion,
#: ReLU, NaN test, masks packed into predicates and back, keys, counts) and 193 per loop step (a compare
#: and a select per element to retire the taken key); the epilogue executed 555 M warp instructions,
#: as many as the mainloop, and took 26 % of the kernel's stall samples.  Why instructions matter
#: beyond their issue time: back to back at M=131072 the board sits at its power cap (661-671 W,
#: clock events sw-power-cap; scripts/clock_probe.py), where time per call follows energy per call:
#: the fused gate 4.38 J per call against cuBLAS's GEMM 3.45 J (bench_results/h200/clock_probe_session12.log).
#: Predicted: epilogue 555 -> ~300 M instructions, the fused gate 6.08 -> ~5.8 ms, 4.38 -> ~4.0 J.
#: Measured (H200, M=131072, l0=28): with the ReLU by PTX and the keys in Triton, 5.638 vs 5.973 ms rank by
#: rank, epilogue 470 M instructions (LLVM turned the keys' compare into predicates stashed in a register,
#: ~10 per element; _session12_lean logs); with the keys by PTX too (``_keys``), 5.525 vs 6.033 ms (op
#: 8.031 vs 8.481, dense 13.578: 1.69x vs 1.60x), 0.695 vs 0.734 ms at M=16384, 6.269 vs 6.670 at l0=56
#: (hot_cold_gate_probe_session12_asm_keys.log); back to back 3.92 J and 5.732 ms per call
#: (clock_probe_session12_final.log).  BK 128 on 2 stages, which halves the K loop's ~78 scalar
#: instructions per step, ran slower: 6.254 ms (hot_cold_gate_probe_session12_bk128.log).
FUSED_LEAN_KEYS = True
#: The lean cold epilogue's [BM, CAP] slots of a TwELL tile stored by TMA (one tensor-descriptor store of
#: the values and one of the weight-row ids, every slot written: unused ones as 0) instead of masked
#: scattered 2-byte stores.  Why: clock_probe (H200, session 15, bench_results/h200/clock_probe_session15.log,
#: M=131072, l0=28) split the fused gate's joules: its mainloop as a plain TMA GEMM without stores 3.333 J per
#: call (cuBLAS's GEMM with its 1.6 GB output 3.431, ours with it 3.510), the fused gate 4.012: the epilogue
#: costs ~0.68 J, 12 % of the op's 5.536.  In the offline sm_90a build the slot stores of each cold half-tile
#: take ~220 of its ~870 SASS instructions per thread (a layout conversion through shared memory, 8 map
#: loads, 16 predicated 2-byte stores per thread); a TMA store is a shared-memory write and one bulk copy.
#: The price: the whole container is written (369 MB at M=131072, 44 tiles x 16 slots x 4 bytes per row,
#: against ~4 MB of used slots), ~0.08 ms of HBM write bandwidth beside a compute-bound GEMM.  Needs CAP
#: x 2 bytes >= 16 (TMA's smallest box row): CAP >= 8; smaller capacities keep the scattered stores.
#: Offline (sm_90a): the half-tile's store phase 217 -> 154 SASS lines, spills 80 -> 36 B.  Predicted: the
#: fused gate -0.03 to -0.06 J and ~-0.05 ms at M=131072.  Measured (H200, session 15, scripts/fused_gate_ab.py,
#: bench_results/h200/fused_gate_ab_tma_slots_session15.log; on, off, on again, back to back): slower, the fused
#: gate 5.848 / 5.850 vs 5.779 ms and 4.10 / 4.16 vs 4.07 J at M=131072, l0=28, 0.734 / 0.738 vs 0.728 ms at
#: 16384; the op 7.966 / 7.979 vs 7.909 ms (same bits): the whole-container writes and each store's wait for
#: its shared-memory buffer cost more than the scattered stores' instructions.  Off.
FUSED_TMA_SLOTS = False
#: The cold epilogue thread by thread in PTX (``cold_slots_ptx``; 16-bit inputs, on the GPU): each thread
#: masks its own non-zeros (two instructions per pair of elements), sees its quad's masks by shuffles and
#: writes each of its non-zeros to the slot its rank in column order names; no [BM, TILE] keys, no slot loop
#: over whole rows, no layout change for the stores.  Same container as the Triton epilogues, so the same
#: bits downstream.  Offline sm_90a build: ~370 SASS instructions per thread and cold output tile before its
#: non-zeros (64 F2FP, 64 HSET2, 74 LOP3, 12 shuffles, 16 POPC) against ~1900 (two half-tiles of ~950),
#: 175 registers and no spill against 255 and 80 B.  Predicted: the fused gate 4.07 -> ~3.7-3.8 J and 5.78
#: -> ~5.4-5.5 ms at M=131072, l0=28; the op 7.91 -> ~7.5-7.6 ms.  Measured (H200, session 15, on / off / on
#: back to back, bench_results/h200/fused_gate_ab_ptx_slots_session15_cached.log): the fused gate 5.288 /
#: 5.310 vs 5.711 ms and 3.75 / 3.72 vs 3.96 J, the op 7.395 / 7.396 vs 7.822 ms at M=131072; at 16384 the
#: gate 0.669 / 0.667 vs 0.720 ms, the op 0.975 / 0.977 vs 1.022; same bits.  On.
FUSED_PTX_SLOTS = True
#: The hot epilogue's [BM, TILE] block of h stored by one TMA store (``_hot_epilogue``' TMA_HOT; H x itemsize
#: a multiple of 16 bytes) instead of masked stores with H a runtime row stride.  Why: with the cold
#: epilogue in PTX the hot half is about half of the epilogue's instructions (offline sm_90a: ~1730 SASS
#: instructions per thread and hot tile, a shared-memory transpose and 64 two-byte stores per thread, 5 of
#: a row block's 27 output tiles at H=576, against ~370 per cold tile; ~1120 with the TMA store).  Unlike
#: the cold slots (the TMA slot stores above lost: they wrote the whole container), h is a dense block
#: written whole either way.
#: Measured (H200, session 16, scripts/fused_gate_ab.py, off / on / off back to back, bench_results/h200/
#: fused_gate_ab_tma_hot_session16.log): no change, the fused gate 5.399 vs 5.383 / 5.385 ms and 3.76 vs 3.85 /
#: 3.78 J at M=131072, l0=28, the op 7.556 vs 7.562 / 7.539 ms; 0.688 vs 0.679 / 0.679 ms at 16384.  Off.
FUSED_TMA_HOT = False
#: The hot epilogue's arithmetic in PTX (``_hot_hidden_ptx``; 16-bit inputs, on the GPU, Triton 3.6.x like
#: the PTX slots): per two units' (g, u) pairs two ``cvt.rn`` to 16-bit pairs, a NaN-keeping maximum with 0,
#: one 16-bit product (the exact product of two 16-bit values rounded once, as the fp32 product rounded
#: is) and the firing flags, where the Triton code spends ~9.5 SASS instructions per unit (offline sm_90a:
#: 128 F2F, 133 IMAD.U32, 64 FSETP.GT, 64 FSETP.NEU, 64 FSEL, 64 FMUL per thread and hot tile); the count's
#: unit mask only in the last hot tile.  A zero h may differ from the Triton path's in its sign (max(-0, +0)),
#: never in value.  Measured with the TMA store above (H200, session 16; its GPU test passed natively, bench_
#: results/h200/pytest_gpu_hot_epilogue_s16.log; fused_gate_ab_ptx_hot_tma_hot_session16.log, off / on / off):
#: no change, the fused gate 5.403 vs 5.410 / 5.378 ms and 3.77 vs 3.74 / 3.74 J at M=131072, l0=28, the op
#: 7.516 vs 7.526 / 7.566 ms; at 16384 the op 0.993 vs 0.989 / 0.992 ms; same bits.  The prediction (-0.1 J)
#: scaled the epilogue's ~0.4 J by its share of instructions; scaled instead by what the PTX slots' 1530
#: fewer instructions on 22 of a row block's 27 output tiles bought (0.24 J), 1110 fewer on 5 hot tiles buy
#: ~0.04 J, under the runs' spread.  By that rate the ~17,000 instructions per row block left in the epilogue
#: cost ~0.1 J: most of the fused gate's ~0.4 J above its mainloop is not epilogue instructions.  Off.
FUSED_PTX_HOT = False
#: Timing probes only (``scripts/epilogue_ablation_probe.py``): bit 1 skips the cold output tiles' epilogue, bit
#: 2 the hot ones', so that a probe can split the fused gate's time and joules between its mainloop and the
#: two epilogues.  The outputs a skipped epilogue should write are left as allocated (garbage): never nonzero
#: outside such a probe, which times the fused gate alone.  In the flattened loop a skip changes the pipeliner's
#: schedule (slower: 7.155 vs 5.337 ms at M=131072, epilogue_ablation_probe_session17.log), so the probe skips
#: with FUSED_FLATTEN off.
PROBE_SKIP_EPILOGUE = 0
#: Triton releases whose accumulator layout and inline-asm operand order the PTX slots were checked against
#: on the GPU (tests/test_ops_hot_cold_gate.py natively: the containers equal the three unfused kernels'
#: bit for bit).  The asm reads its elements' columns from the lane and the register order, which a Triton
#: release could change without notice: under any other release the Triton keys run instead.
PTX_SLOTS_TRITON = ("3.6.",)


def ptx_slots_supported(triton_version: str) -> bool:
    """Whether the PTX cold slots may run under this Triton release (see :data:`PTX_SLOTS_TRITON`)."""
    return triton_version.startswith(PTX_SLOTS_TRITON)


def _hot_pair_asm(half: str) -> str:
    """The PTX of :func:`_hot_hidden_ptx` for 16-bit type ``half`` ("bf16" or "f16")."""
    return f"""{{
            .reg .b32 g, u, a, h, f, z;
            mov.b32 z, 0;
            cvt.rn.{half}x2.f32 g, $5, $3;
            cvt.rn.{half}x2.f32 u, $6, $4;
            max.NaN.{half}x2 a, g, z;
            mul.rn.{half}x2 h, a, u;
            set.neu.u32.{half}x2 f, a, z;
            prmt.b32 $0, h, 0, 0x1010;
            prmt.b32 $1, h, 0, 0x3232;
            prmt.b32 f, f, 0, 0x2200;
            and.b32 $2, f, 0x01010101;
            }}"""


_HOT_PAIR_ASM_BF16 = tl.constexpr(_hot_pair_asm("bf16"))
_HOT_PAIR_ASM_F16 = tl.constexpr(_hot_pair_asm("f16"))


@triton.jit
def _hot_hidden_ptx(acc, dtype: tl.constexpr):
    """``(h, fires)`` shaped like ``acc`` (the [BM, 2 TILE] accumulator of (g, u) column pairs): at both columns
    of a unit's pair its h = round(relu(round(g)) round(u)) (NaN g firing) and its firing flag (int8 0 / 1).
    PTX per four elements: two units' pairs, the ones a thread holds in consecutive registers."""
    if dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(_HOT_PAIR_ASM_BF16, "=r,=r,=r,r,r,r,r", [acc],
                                         dtype=(tl.bfloat16, tl.int8), is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(_HOT_PAIR_ASM_F16, "=r,=r,=r,r,r,r,r", [acc],
                                         dtype=(tl.float16, tl.int8), is_pure=True, pack=4)


@triton.jit
def _hot_epilogue(acc, pid_m, hot_tile, M, H, h_ptr, hcnt_ptr, cnt_stride, dtype: tl.constexpr,
                  BM: tl.constexpr, TILE: tl.constexpr, h_desc, TMA_HOT: tl.constexpr, PTX_HOT: tl.constexpr):
    """h = round(relu(g) u) for the TILE hot units of ``hot_tile`` and their per-row non-zero count (rows
    ``cnt_stride`` apart; with ``TMA_HOT`` the [BM, TILE] block of h goes out by one TMA store, which drops
    rows past M and units past H)."""
    if PTX_HOT:
        h2, fires2 = _hot_hidden_ptx(acc, dtype)
        h, _ = tl.split(tl.reshape(h2, (BM, TILE, 2)))
        fires, _ = tl.split(tl.reshape(fires2, (BM, TILE, 2)))
        rows = pid_m * BM + tl.arange(0, BM)
        units = hot_tile * TILE + tl.arange(0, TILE)
        m_ok = rows < M
        if TMA_HOT:
            h_desc.store([pid_m * BM, hot_tile * TILE], h)
        else:
            ok = m_ok[:, None] & (units < H)[None, :]
            tl.store(h_ptr + rows.to(tl.int64)[:, None] * H + units[None, :], h, mask=ok)
        nz = fires.to(tl.int32)
        if (hot_tile + 1) * TILE > H:  # the last hot tile's padding units (zero rows; a NaN x still fires them)
            nz = tl.where((units < H)[None, :], nz, 0)
        tl.store(hcnt_ptr + rows.to(tl.int64) * cnt_stride + hot_tile, tl.sum(nz, axis=1), mask=m_ok)
    else:  # the order of these lines is the measured build's (its register allocation follows it)
        g, u = tl.split(tl.reshape(acc, (BM, TILE, 2)))
        g = round_to(g, dtype).to(tl.float32)
        u = round_to(u, dtype).to(tl.float32)
        act = relu_keep_nan(g)
        rows = pid_m * BM + tl.arange(0, BM)
        units = hot_tile * TILE + tl.arange(0, TILE)
        m_ok = rows < M
        ok = m_ok[:, None] & (units < H)[None, :]
        if TMA_HOT:
            h_desc.store([pid_m * BM, hot_tile * TILE], round_to(act * u, dtype))
        else:
            tl.store(h_ptr + rows.to(tl.int64)[:, None] * H + units[None, :], round_to(act * u, dtype), mask=ok)
        nz = ((act != 0) & ok).to(tl.int32)
        tl.store(hcnt_ptr + rows.to(tl.int64) * cnt_stride + hot_tile, tl.sum(nz, axis=1), mask=m_ok)


@triton.jit
def _twell_epilogue_by_rank(act, pid_m, twell_tile, m_ok, n_ok, map_ptr, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles,
                            cnt_stride, BM: tl.constexpr, TILE: tl.constexpr, CAP: tl.constexpr, MAP_IDS: tl.constexpr):
    """The TwELL tile of ``_twell_epilogue`` (counts, then each row's first CAP non-zeros in column order)
    for a 16-bit ``act``, found rank by rank instead of by a prefix scan of the [BM, TILE] tile: each
    non-zero is one int32 key ``column << 16 | value bits``, so one min over a row gives its next
    non-zero's column and value together; step k stores that slot for every row and retires the key.
    The steps run to the tile's largest row count (at most CAP)."""
    nz, count = nonzeros_and_counts(act, pid_m, twell_tile, m_ok, n_ok, ccnt_ptr, cnt_stride, BM)
    none: tl.constexpr = 0x7FFFFFFF
    bits = act.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    key = tl.where(nz, (tl.arange(0, TILE)[None, :] << 16) | bits, none)
    # the keys of each row's first CAP non-zeros, in column order, gathered in registers and stored at once
    slot = tl.arange(0, CAP)[None, :]
    firsts = tl.full((BM, CAP), none, tl.int32)
    for k in range(0, tl.minimum(tl.max(count), CAP)):
        first = tl.min(key, axis=1)
        firsts = tl.where(slot == k, first[:, None], firsts)
        key = tl.where(key == first[:, None], none, key)
    _store_slots(firsts, firsts != none, pid_m, twell_tile, map_ptr, val_ptr, idx_ptr, n_cold_tiles, BM, TILE, CAP,
                 MAP_IDS)


@triton.jit
def _store_slots(firsts, live, pid_m, twell_tile, map_ptr, val_ptr, idx_ptr, n_cold_tiles, BM: tl.constexpr,
                 TILE: tl.constexpr, CAP: tl.constexpr, MAP_IDS: tl.constexpr):
    """Store the [BM, CAP] slots of one TwELL tile from their keys ``column << 16 | value bits`` where
    ``live``: values and (with ``MAP_IDS``, through ``map_ptr``) weight-row ids."""
    col = (firsts >> 16).to(tl.int32)
    value = (firsts & 0xFFFF).to(tl.int16).to(val_ptr.dtype.element_ty, bitcast=True)
    if MAP_IDS:
        unit = tl.load(map_ptr + twell_tile * TILE + col, mask=live, other=0)
    else:
        unit = col
    # int64 base of the tile, int32 offsets inside it (BM * n_cold_tiles * CAP < 2**31)
    base = (pid_m.to(tl.int64) * BM * n_cold_tiles + twell_tile) * CAP
    off = tl.arange(0, BM)[:, None] * (n_cold_tiles * CAP) + tl.arange(0, CAP)[None, :]
    tl.store(val_ptr + base + off, value, mask=live)
    tl.store(idx_ptr + base + off, unit.to(tl.int16), mask=live)


@triton.jit
def _store_slots_tma(firsts, live, pid_m, twell_tile, map_ptr, val_desc, idx_desc, BM: tl.constexpr,
                     TILE: tl.constexpr, CAP: tl.constexpr, MAP_IDS: tl.constexpr):
    """:func:`_store_slots` by two TMA stores of the whole [BM, CAP] block (rows past M are dropped by the
    copy): values and weight-row ids where ``live``, 0 in the unused slots."""
    col = (firsts >> 16).to(tl.int32)
    value = tl.where(live, firsts & 0xFFFF, 0).to(tl.int16).to(val_desc.dtype, bitcast=True)
    if MAP_IDS:
        unit = tl.load(map_ptr + twell_tile * TILE + col, mask=live, other=0)
    else:
        unit = tl.where(live, col, 0)
    val_desc.store([pid_m * BM, twell_tile * CAP], value)
    idx_desc.store([pid_m * BM, twell_tile * CAP], unit.to(tl.int16))


@triton.jit
def round_relu(acc, dtype: tl.constexpr, ASM: tl.constexpr):
    """``relu_keep_nan(round_to(acc, dtype))`` in ``dtype``.  With ``ASM`` (bf16 or fp16 only) one PTX
    ``cvt.rn.relu`` per two elements, where Triton's lowering spends a conversion, a compare against the
    smallest value that rounds to non-zero and a select per element and a NaN test per pair (SASS of the
    session 12 ncu source view).  ``cvt.rn.relu`` writes a NaN as the canonical NaN and may keep the sign
    of a zero; the keys below read neither bit."""
    if ASM:
        if dtype == tl.bfloat16:
            return tl.inline_asm_elementwise("cvt.rn.relu.bf16x2.f32 $0, $2, $1;", "=r,r,r", [acc],
                                             dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            return tl.inline_asm_elementwise("cvt.rn.relu.f16x2.f32 $0, $2, $1;", "=r,r,r", [acc],
                                             dtype=tl.float16, is_pure=True, pack=2)
    else:
        return relu_keep_nan(round_to(acc, dtype)).to(dtype)


@triton.jit
def _keys(act, col_bits, ASM: tl.constexpr):
    """``(key, fires)`` of a 16-bit ReLU output: ``col_bits | magnitude bits`` (all ones where the value is 0)
    as uint32 and 1 / 0 as int32.  With ``ASM`` in PTX per two elements (a mask, a minimum, an add and
    two ors each, no predicate): written as Triton ops, LLVM turns the minimum back into a compare and a
    select, keeps the 64 compares of a thread's row-tile live as predicates stashed in a register and
    sums them by a packed-bit trick, ~10 SASS instructions per element in the session 12 ncu source view."""
    if ASM:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 b0, b1, f0, f1;
            and.b32 b0, $4, 0x7FFF;
            bfe.u32 b1, $4, 16, 15;
            min.u32 f0, b0, 1;
            min.u32 f1, b1, 1;
            mov.b32 $2, f0;
            mov.b32 $3, f1;
            add.s32 f0, f0, -1;
            add.s32 f1, f1, -1;
            or.b32 b0, b0, $5;
            or.b32 b1, b1, $6;
            or.b32 $0, b0, f0;
            or.b32 $1, b1, f1;
            }""",
            "=r,=r,=r,=r,r,r,r", [act, col_bits], dtype=(tl.uint32, tl.int32), is_pure=True, pack=2)
    else:
        bits = act.to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF
        nz = bits != 0
        return tl.where(nz, col_bits | bits, -1).to(tl.uint32, bitcast=True), nz.to(tl.int32)


@triton.jit
def _twell_epilogue_by_keys(act, pid_m, twell_tile, M, N_COLD, map_ptr, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles,
                            cnt_stride, BM: tl.constexpr, TILE: tl.constexpr, CAP: tl.constexpr, MAP_IDS: tl.constexpr,
                            ASM: tl.constexpr, val_desc, idx_desc, TMA_SLOTS: tl.constexpr):
    """``_twell_epilogue_by_rank`` with fewer instructions per element: the key is built from the value's
    magnitude bits alone (a ReLU output is +0, positive or NaN, so ``bits & 0x7FFF`` is non-zero exactly
    where it fires; stored values carry a clear sign bit), rows past M are left out at the stores only
    (TMA fills them with zeros) and columns past the cold units only in the last tile (zero weight rows,
    which a NaN in x still turns into NaN), and a step retires no key: the next slot is the unsigned
    minimum of ``key - threshold``, where the keys at or below the last slot wrap above every live one."""
    cols = tl.arange(0, TILE)
    if (twell_tile + 1) * TILE > N_COLD:
        act = tl.where((twell_tile * TILE + cols < N_COLD)[None, :], act, 0.0)
    key, fires = _keys(act, cols[None, :] << 16, ASM)
    count = tl.sum(fires, axis=1)
    rows = pid_m * BM + tl.arange(0, BM)
    m_ok = rows < M
    tl.store(ccnt_ptr + rows.to(tl.int64) * cnt_stride + twell_tile, count, mask=m_ok)
    slot = tl.arange(0, CAP)[None, :]
    firsts = tl.full((BM, CAP), 0xFFFFFFFF, tl.uint32)
    below = tl.zeros((BM,), tl.uint32)  # keys under it are taken; 0 (all live) again after a row's last key
    for k in range(0, tl.minimum(tl.max(tl.where(m_ok, count, 0)), CAP)):
        first = tl.min(key - below[:, None], axis=1) + below
        firsts = tl.where(slot == k, first[:, None], firsts)
        below = first + 1
    if TMA_SLOTS:  # every slot written: the used ones by count (a row's slots past its count may repeat keys)
        _store_slots_tma(firsts, slot < count[:, None], pid_m, twell_tile, map_ptr, val_desc, idx_desc, BM, TILE, CAP,
                         MAP_IDS)
    else:
        _store_slots(firsts, (firsts != 0xFFFFFFFF) & m_ok[:, None], pid_m, twell_tile, map_ptr, val_ptr, idx_ptr,
                     n_cold_tiles, BM, TILE, CAP, MAP_IDS)


@triton.jit
def _cold_epilogue(act, pid_m, twell_tile, M, N_COLD, map_ptr, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles, cnt_stride,
                   BM: tl.constexpr, TILE: tl.constexpr, CAP: tl.constexpr, MAP_IDS: tl.constexpr,
                   PREFIX_DOT: tl.constexpr, RANK_SLOTS: tl.constexpr, LEAN_KEYS: tl.constexpr, ASM: tl.constexpr,
                   val_desc, idx_desc, TMA_SLOTS: tl.constexpr):
    """One [BM, TILE] TwELL tile of the cold container (skipped past the last tile)."""
    if twell_tile >= n_cold_tiles:
        pass
    elif LEAN_KEYS:
        _twell_epilogue_by_keys(act, pid_m, twell_tile, M, N_COLD, map_ptr, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles,
                                cnt_stride, BM, TILE, CAP, MAP_IDS, ASM, val_desc, idx_desc, TMA_SLOTS)
    else:
        cols = twell_tile * TILE + tl.arange(0, TILE)
        n_ok = cols < N_COLD
        m_ok = pid_m * BM + tl.arange(0, BM) < M
        if RANK_SLOTS:
            _twell_epilogue_by_rank(act, pid_m, twell_tile, m_ok, n_ok, map_ptr, val_ptr, idx_ptr, ccnt_ptr,
                                    n_cold_tiles, cnt_stride, BM, TILE, CAP, MAP_IDS)
        else:
            if MAP_IDS:
                ids = tl.load(map_ptr + cols, mask=n_ok, other=0)
            else:
                ids = tl.arange(0, TILE)
            _twell_epilogue(act, pid_m, twell_tile, m_ok, n_ok, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles, cnt_stride,
                            ids, BM, TILE, CAP, False, PREFIX_DOT)


@triton.jit
def _cold_epilogue_ptx(act, pid_m, out_tile, M, N_COLD, map_ptr, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles,
                       cnt_stride, BM: tl.constexpr, TILE: tl.constexpr, CAP: tl.constexpr, ASM_TEXT: tl.constexpr,
                       ASM_CONSTRAINTS: tl.constexpr, ASM_PACK: tl.constexpr):
    """Both TwELL tiles of cold output tile ``out_tile`` (``act``: its [BM, 2 TILE] ReLU output) through the
    thread-by-thread PTX of ``cold_slots_ptx``: counts and used slots, as the other cold epilogues write them."""
    BN: tl.constexpr = 2 * TILE
    first = 2 * out_tile
    rows = pid_m * BM + tl.arange(0, BM)
    lim = tl.where(rows < M, N_COLD - first * TILE, 0)  # valid columns from the tile's first; 0 past M
    base = rows.to(tl.int64) * n_cold_tiles + first
    vrow = (val_ptr + base * CAP).to(tl.int64)
    irow = (idx_ptr + base * CAP).to(tl.int64)
    crow = (ccnt_ptr + rows.to(tl.int64) * cnt_stride + first).to(tl.int64)
    mbase = (map_ptr + first * TILE).to(tl.int64) + tl.zeros((BM,), tl.int64)
    shape: tl.constexpr = (BM, BN)
    tl.inline_asm_elementwise(
        ASM_TEXT, ASM_CONSTRAINTS,
        [act, tl.broadcast_to(lim[:, None], shape), tl.broadcast_to(vrow[:, None], shape),
         tl.broadcast_to(irow[:, None], shape), tl.broadcast_to(crow[:, None], shape),
         tl.broadcast_to(mbase[:, None], shape)],
        dtype=tl.int8, is_pure=False, pack=ASM_PACK)


@triton.jit
def _hot_cold_gate_kernel(
    x_desc, w_desc, h_ptr, hcnt_ptr, val_ptr, idx_ptr, ccnt_ptr, map_ptr, M, H, N_COLD, K, n_hot_tiles,
    n_cold_tiles, cnt_stride, n_out_tiles, n_programs,
    BM: tl.constexpr, BK: tl.constexpr, TILE: tl.constexpr, CAP: tl.constexpr, GROUP_M: tl.constexpr,
    MAP_IDS: tl.constexpr, PREFIX_DOT: tl.constexpr, DOT_FP32: tl.constexpr, FLATTEN: tl.constexpr,
    RANK_SLOTS: tl.constexpr = False, LEAN_KEYS: tl.constexpr = False, LEAN_PTX: tl.constexpr = False,
    val_desc=None, idx_desc=None, TMA_SLOTS: tl.constexpr = False,
    ASM_TEXT: tl.constexpr = None, ASM_CONSTRAINTS: tl.constexpr = None, ASM_PACK: tl.constexpr = 0,
    h_desc=None, TMA_HOT: tl.constexpr = False, PTX_HOT: tl.constexpr = False, SKIP_COLD: tl.constexpr = False,
    SKIP_HOT: tl.constexpr = False, zero_ptr=None, ZERO: tl.constexpr = False, done_ptr=None,
    DONE: tl.constexpr = False, PDL_TRIGGER: tl.constexpr = False, trigger_from=0, DONE_PTX: tl.constexpr = False,
    HOT_LAST: tl.constexpr = False,
):
    """Output tiles [BM, 2 * TILE] of x @ w^T, in a persistent loop of ``n_programs`` programs: the first
    ``n_hot_tiles`` column tiles are hot (hidden state + counts), the rest cold (two TwELL tiles each).
    With ``ZERO`` program 0 also sets the int32 at ``zero_ptr`` to 0 (a later kernel's counter).  With ``DONE``
    each program counts every cold output tile it has written in ``done_ptr[row block]`` (int32, zero before the
    launch), released at gpu scope after a CTA barrier, so a reader that acquires the count sees the tiles' counts
    and slots; with ``PDL_TRIGGER`` each program lets the next kernel (a programmatic dependent: the list pass)
    launch from its first tile at or past ``trigger_from`` (a program with none lets it launch as it exits).  With
    ``HOT_LAST`` the tiles go cold first (every row block's cold tiles, grouped), then the hot ones."""
    BN: tl.constexpr = 2 * TILE
    dtype: tl.constexpr = val_ptr.dtype.element_ty
    if ZERO:
        if tl.program_id(0) == 0:
            tl.store(zero_ptr, 0)
    num_pid_m = tl.cdiv(M, BM)
    pending = -1  # with DONE: the row block of the program's last cold tile whose count is not yet released
    n_cold_tiles_out = num_pid_m * (n_out_tiles - n_hot_tiles)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * n_out_tiles, n_programs, flatten=FLATTEN):
        if HOT_LAST:
            if tile_id < n_cold_tiles_out:
                pid_m, pid_n = tile_coords(tile_id, num_pid_m, n_out_tiles - n_hot_tiles, GROUP_M)
                pid_n += n_hot_tiles
            else:
                pid_m, pid_n = tile_coords(tile_id - n_cold_tiles_out, num_pid_m, n_hot_tiles, GROUP_M)
        else:
            pid_m, pid_n = tile_coords(tile_id, num_pid_m, n_out_tiles, GROUP_M)
        if PDL_TRIGGER:  # once per program: its first tile at or past trigger_from
            if (tile_id >= trigger_from) & (tile_id - n_programs < trigger_from):
                gdc_launch_dependents()
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = x_desc.load([pid_m * BM, k0])
            b = w_desc.load([pid_n * BN, k0])
            acc = dot_acc(a, b.T, acc, DOT_FP32)
        if DONE:  # the program's previous tile's count (see _RELEASE_AFTER_BARRIER: released a mainloop late)
            if pending >= 0:
                _release_count(done_ptr + pending, DONE_PTX)
        if pid_n < n_hot_tiles:
            if not SKIP_HOT:
                _hot_epilogue(acc, pid_m, pid_n, M, H, h_ptr, hcnt_ptr, cnt_stride, dtype, BM, TILE, h_desc, TMA_HOT,
                              PTX_HOT)
        elif SKIP_COLD:
            pass
        elif ASM_PACK > 0:
            _cold_epilogue_ptx(round_relu(acc, dtype, True), pid_m, pid_n - n_hot_tiles, M, N_COLD, map_ptr, val_ptr,
                               idx_ptr, ccnt_ptr, n_cold_tiles, cnt_stride, BM, TILE, CAP, ASM_TEXT, ASM_CONSTRAINTS,
                               ASM_PACK)
        else:
            act = round_relu(acc, dtype, LEAN_PTX)  # LEAN_PTX only with LEAN_KEYS
            # the two TwELL tiles of this output tile: columns [0, TILE) and [TILE, 2 TILE)
            left, right = tl.split(tl.permute(tl.reshape(act, (BM, 2, TILE)), (0, 2, 1)))
            first = 2 * (pid_n - n_hot_tiles)
            _cold_epilogue(left, pid_m, first, M, N_COLD, map_ptr, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles, cnt_stride,
                           BM, TILE, CAP, MAP_IDS, PREFIX_DOT, RANK_SLOTS, LEAN_KEYS, LEAN_PTX, val_desc, idx_desc,
                           TMA_SLOTS)
            _cold_epilogue(right, pid_m, first + 1, M, N_COLD, map_ptr, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles,
                           cnt_stride, BM, TILE, CAP, MAP_IDS, PREFIX_DOT, RANK_SLOTS, LEAN_KEYS, LEAN_PTX, val_desc,
                           idx_desc, TMA_SLOTS)
        if DONE:  # this tile's row block, its count to be released after the next mainloop (-1: a hot tile)
            pending = tl.where(pid_n >= n_hot_tiles, pid_m, -1)
    if DONE:  # the program's last tile's count
        if pending >= 0:
            _release_count(done_ptr + pending, DONE_PTX)


#: The CTA barrier and thread 0's gpu-scope release of ``_hot_cold_gate_kernel``'s row-block count in one piece of
#: PTX.  ``tl.debug_barrier()`` in the persistent loop stops Triton 3.6's software pipeliner: the kernel built with it
#: issues its TMA loads one k step at a time (2 ``cp.async.bulk.tensor`` in the PTX against 6, 1 ``wgmma.wait_group``
#: against 3; sm_90a offline, session 26), and ran at 0.37x of the kernel without the counts (1.441 against 0.533 ms
#: at M=16384, l0=28; H200, bench_results/h200/tail_probe_beside_session25.log).  Inline PTX leaves the loop
#: pipelined (6 and 3; 196 registers against 202).  Its store ordering: ``bar.sync`` orders every thread's
#: stores of the tile before thread 0's release, which is cumulative at gpu scope.  Released right after each tile's
#: epilogue, the counts cost the gate 0.007-0.012 ms at M=16384 (0.521-0.522 against 0.510-0.514 ms; H200, session
#: 26, bench_results/h200/tail_probe_session26.log): the release's fence waits for the epilogue's stores just issued.
#: So a tile's count is released after the program's next mainloop, when those stores are long done.
_RELEASE_AFTER_BARRIER = tl.constexpr(
    "{ .reg .pred %p_rel; .reg .u32 %t_rel; mov.u32 %t_rel, %tid.x; setp.eq.u32 %p_rel, %t_rel, 0; bar.sync 0; "
    "@%p_rel red.release.gpu.global.add.s32 [$1], 1; mov.u32 $0, 0; }"
)


@triton.jit
def _release_count(ptr, PTX: tl.constexpr):
    """Every thread of the CTA at a barrier, then one adds 1 to the int32 at ``ptr`` with gpu-scope release; with
    ``PTX`` as :data:`_RELEASE_AFTER_BARRIER` (GPU), else through Triton (the interpreter, which runs no PTX)."""
    if PTX:
        tl.inline_asm_elementwise(_RELEASE_AFTER_BARRIER, "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.debug_barrier()
        tl.atomic_add(ptr, 1, sem="release", scope="gpu")


def gate_row_block() -> int:
    """Rows per output tile of the fused gate as it launches here (its ``done`` counters are per row block)."""
    return (_INTERPRET_CONFIG if interpreting() else _GPU_CONFIG)[0]


def launch_hot_cold_gate(
    x: torch.Tensor,
    w_fused: torch.Tensor,
    n_hot: int,
    n_cold: int,
    cold_map: torch.Tensor,
    *,
    tile: int,
    capacity: int,
    unit_ids: bool,
    zero: torch.Tensor | None = None,
    done: torch.Tensor | None = None,
    trigger_rounds: int | None = None,
    hot_last: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(h_hot [M, H], hot_counts [M, cdiv(H, tile)], values, indices, cold_counts)`` of the hot/cold
    split for validated inputs: x [M, d] contiguous, ``w_fused`` from ``hot_cold_plan.fused_gate_weight``
    (same dtype and device, d * itemsize a multiple of 16 bytes: TMA rows), ``cold_map`` int32 [n_cold]
    (the cold columns' weight rows; stored as the TwELL indices with ``unit_ids``, else the column inside
    its tile), ``tile`` in FUSED_TILES.  The cold container is [M, cdiv(n_cold, tile), capacity].

    The two counts are column views of one [M, n_cold_tiles + n_hot_tiles] buffer, cold tiles first: the op's
    counts output as it is returned (:func:`twell.ops.hot_cold.joined_counts`), with no concatenation.
    ``zero`` (int32, on x's device): its first element is set to 0 by the kernel (the gather's heavy-queue
    counter, so that no fill kernel runs for it), or by a fill where the kernel does not run (no tile).
    ``done`` (int32 [>= cdiv(M, gate_row_block())], zeros, on x's device): each row block's cold output tiles are
    counted into it as they are written, and the next kernel on the stream may launch beside this one (the list pass
    with ``launch_list_twell_rows``'s ``after_gate``); CUDA at compute capability >= 9.0, or the interpreter (which
    runs the grids one after the other).  ``trigger_rounds`` (with ``done``): the next kernel may launch only once
    every program has begun one of the last ``trigger_rounds`` rounds of output tiles (a round: one tile per
    program); None: as the programs start.  ``hot_last``: the output tiles in the order cold then hot, so that the
    cold container is complete before the hot units' last rounds (same outputs)."""
    if tile not in FUSED_TILES:
        raise ValueError(f"the fused hot/cold gate takes tiles {FUSED_TILES}, got {tile}")
    m, d = x.shape
    n_hot_tiles = triton.cdiv(n_hot, tile)
    n_cold_tiles = triton.cdiv(n_cold, tile)
    if w_fused.shape != (2 * tile * n_hot_tiles + n_cold, d):
        raise ValueError(f"w_fused has shape {tuple(w_fused.shape)}; for {n_hot} hot and {n_cold} cold units at tile "
                         f"{tile} it needs ({2 * tile * n_hot_tiles + n_cold}, {d})")
    dev = x.device
    h_hot = torch.empty((m, n_hot), dtype=x.dtype, device=dev)
    counts = torch.empty((m, n_cold_tiles + n_hot_tiles), dtype=torch.int32, device=dev)
    cold_counts, hot_counts = counts[:, :n_cold_tiles], counts[:, n_cold_tiles:]
    values = torch.empty((m, n_cold_tiles, capacity), dtype=x.dtype, device=dev)
    indices = torch.empty((m, n_cold_tiles, capacity), dtype=torch.int16, device=dev)
    n_out_tiles = n_hot_tiles + triton.cdiv(n_cold_tiles, 2)
    if m == 0 or n_out_tiles == 0:
        if zero is not None:
            zero[:1].zero_()
        return h_hot, hot_counts, values, indices, cold_counts
    # TMA reads from 16-byte aligned addresses: a view starting mid-way (a flat buffer's slice) is copied
    x, w_fused = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (x, w_fused))
    bm, bk, stages, warps = _INTERPRET_CONFIG if interpreting() else _GPU_CONFIG
    tiles = triton.cdiv(m, bm) * n_out_tiles
    programs = min(tiles, FUSED_PROGRAMS_PER_SM * sm_count(dev.index)) if dev.type == "cuda" else tiles
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w_fused, [2 * tile, bk])
    lean = FUSED_LEAN_KEYS and x.element_size() == 2
    tma_slots = FUSED_TMA_SLOTS and lean and capacity * values.element_size() >= 16 and n_cold_tiles > 0
    if done is not None:
        if tma_slots:  # a TMA store is asynchronous: the release after the CTA barrier would not cover it
            raise ValueError("launch_hot_cold_gate: `done` does not combine with FUSED_TMA_SLOTS")
        if not (pdl_supported(dev) or interpreting()) or done.dtype != torch.int32 or done.numel() < triton.cdiv(m, bm):
            raise ValueError(f"launch_hot_cold_gate: `done` needs int32 [>= {triton.cdiv(m, bm)}] and programmatic "
                             f"dependent launch (CUDA, compute capability >= 9.0); got {done.dtype} "
                             f"[{done.numel()}] on {dev}")
    if trigger_rounds is not None and (done is None or trigger_rounds < 1):
        raise ValueError(f"launch_hot_cold_gate: trigger_rounds must be None or >= 1 and comes with `done`; got "
                         f"{trigger_rounds} with done {'set' if done is not None else 'None'}")
    trigger_from = 0 if trigger_rounds is None else max(0, tiles - trigger_rounds * programs)
    val_desc = idx_desc = None
    if tma_slots:  # the container as [M, tiles x CAP]: one [BM, CAP] box per TwELL tile
        val_desc = TensorDescriptor.from_tensor(values.view(m, n_cold_tiles * capacity), [bm, capacity])
        idx_desc = TensorDescriptor.from_tensor(indices.view(m, n_cold_tiles * capacity), [bm, capacity])
    if FUSED_TMA_HOT and n_hot and (n_hot * x.element_size()) % 16 == 0:  # TMA rows: 16-byte multiples
        hot_tma = {"h_desc": TensorDescriptor.from_tensor(h_hot, [bm, tile]), "TMA_HOT": True}
    else:
        hot_tma = {}
    ptx_ok = lean and not interpreting() and ptx_slots_supported(triton.__version__)
    if FUSED_PTX_HOT and ptx_ok:
        hot_tma["PTX_HOT"] = True
    asm = {}
    if FUSED_PTX_SLOTS and ptx_ok:
        pack = bm * 2 * tile // (32 * warps)
        text, constraints = cold_slots_asm(2 * tile, tile, capacity, pack, unit_ids,
                                           "bf16" if x.dtype == torch.bfloat16 else "f16")
        asm = {"ASM_TEXT": text, "ASM_CONSTRAINTS": constraints, "ASM_PACK": pack}
    kernel = _hot_cold_gate_kernel[(programs,)](
        x_desc, w_desc, h_hot, hot_counts, values, indices, cold_counts, cold_map, m, n_hot, n_cold, d, n_hot_tiles,
        n_cold_tiles, counts.stride(0), n_out_tiles, programs,
        BM=bm, BK=bk, TILE=tile, CAP=capacity, GROUP_M=8, MAP_IDS=unit_ids,
        # the interpreter's dot needs fp32 operands, so its prefix is the scan
        PREFIX_DOT=FUSED_PREFIX_DOT and not interpreting() and x.dtype != torch.float32,
        DOT_FP32=interpreting() or x.dtype == torch.float32, FLATTEN=FUSED_FLATTEN and not interpreting(),
        RANK_SLOTS=FUSED_RANK_SLOTS and x.element_size() == 2, LEAN_KEYS=lean, LEAN_PTX=lean and not interpreting(),
        val_desc=val_desc, idx_desc=idx_desc, TMA_SLOTS=tma_slots, num_stages=stages, num_warps=warps, **asm,
        **hot_tma, **({"SKIP_COLD": bool(PROBE_SKIP_EPILOGUE & 1), "SKIP_HOT": bool(PROBE_SKIP_EPILOGUE & 2)}
           if PROBE_SKIP_EPILOGUE else {}), **({"zero_ptr": zero, "ZERO": True} if zero is not None else {}),
        **({"done_ptr": done, "DONE": True, "PDL_TRIGGER": not interpreting(), "trigger_from": trigger_from,
            "DONE_PTX": not interpreting()} if done is not None else {}), **({"HOT_LAST": True} if hot_last else {}),
    )
    if done is not None and BESIDE_MAX_CARVEOUT and dev.type == "cuda":
        prefer_max_shared_carveout(kernel)
    return h_hot, hot_counts, values, indices, cold_counts
