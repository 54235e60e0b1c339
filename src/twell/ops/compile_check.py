"""Build every Triton kernel for a GPU target without a GPU (``python -m twell.ops.compile_check``).

Prints one JSON object: per kernel variant, whether it compiled, whether the gate GEMM uses Hopper's
wgmma instructions, whether the PTX touches local memory, and, from the ptxas that ships with Triton,
the registers per thread and the bytes spilled to local memory by register allocation (which the PTX
cannot show: the decode one-pass kernel with a [16, 2048] tile on 8 warps had no ``.local`` in its PTX
yet spilled 92 bytes, and ran 9 % slower than with [16, 1024] tiles on an H200).  Registers also set
how many programs an SM holds (65,536 per SM), and each entry's ``shared_bytes`` whether a program fits the
card (:data:`SHARED_MEMORY_LIMIT_BYTES`).  Must run without ``TRITON_INTERPRET=1`` (the interpreter replaces
the kernels by Python functions).

``python -m twell.ops.compile_check 80`` builds for sm_80 (A100; the 8.6 / 8.9 cards share its lowering) the
kernels launched there, as launched there: no programmatic dependent launch (``griddepcontrol`` is sm_90 on)
and no kernel that loads through TMA descriptors (the fused hot/cold gate, the cold-down GEMM), which
``_runtime.pdl_supported`` / ``tma_capable`` keep off below sm_90.  Every other kernel compiles there with the
same configuration (session 37: the largest program 75,776 B of shared memory, ``ffn_tc_block``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget

from ._runtime import interpreting, next_pow2


def _jit(fn):
    """The JITFunction under autotune/heuristics wrappers."""
    while not isinstance(fn, triton.runtime.JITFunction):
        fn = fn.fn
    return fn


def _compiled(fn, signature: dict, constexprs: dict, target: GPUTarget, *, divisible: tuple[str, ...] = (),
              **options):
    """The compiled kernel of ``fn`` (PTX, metadata such as its shared memory), specialised as a launch specialises
    it: pointers 16-byte aligned (PyTorch allocations are), which changes layouts and once let a scan-lowering
    assertion through that the unaligned build did not hit (the bitmap FFN kernel, first H200 run); the integer
    arguments named in ``divisible`` multiples of 16, as Triton specialises them at a launch where they are (d = 2048
    and its row strides: without it the block tensor-core kernel's gathered weight tiles are not vectorised and
    ptxas spills 2,020 B at 255 registers, with it 234 registers and none)."""
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    jit = _jit(fn)
    attrs = {(jit.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items()
             if t.startswith("*") or n in divisible}
    src = triton.compiler.ASTSource(fn=jit, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=target, options=options)


#: The most shared memory one program (CTA) may take, by compute capability x 10 (the CUDA programming guide's
#: table of compute capabilities, "maximum amount of shared memory per thread block", opt-in: what Triton checks
#: at launch): A100 163 KB, the 8.6 / 8.9 cards (A10, A40, RTX 30xx / 40xx, L4, L40) 99 KB, Hopper 227 KB.
SHARED_MEMORY_LIMIT_BYTES = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}

#: The batch decode up kernel's (``decode_batch_kernels._batch_up_kernel``) runtime arguments, bf16.
BATCH_UP_SIGNATURE = {"x_ptr": "*bf16", "g_ptr": "*bf16", "wu_ptr": "*bf16", "ht_ptr": "*bf16", "fires_ptr": "*i8",
                      "cnt_ptr": "*i32", "M": "i32", "D": "i32", "F": "i32", "stride_xm": "i32", "stride_gm": "i32",
                      "stride_wu": "i32", "stride_ht": "i32", "n_blocks": "i32"}


def _ptxas() -> str | None:
    """The ptxas bundled with Triton's NVIDIA backend, if this install has it."""
    import triton.backends.nvidia as nvidia

    path = os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas")
    return path if os.access(path, os.X_OK) else None


def _usage(ptx: str, arch: int) -> dict[str, int]:
    """``{"registers", "spill_bytes"}`` of ``ptx`` from ``ptxas -v`` (empty without a bundled ptxas)."""
    ptxas = _ptxas()
    if ptxas is None:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        suffix = "a" if arch >= 90 else ""
        proc = subprocess.run([ptxas, f"-arch=sm_{arch}{suffix}", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed: {proc.stderr[-2000:]}")
    regs = re.findall(r"Used (\d+) registers", proc.stderr)
    spills = re.findall(r"(\d+) bytes spill stores", proc.stderr)
    return {"registers": max(int(r) for r in regs), "spill_bytes": max(int(b) for b in spills)}


def onepass_kernel(m: int, d: int, f: int, target: GPUTarget) -> tuple[Any, int, int]:
    """``(compiled kernel, warps, programs)`` of the decode one-pass kernel as its launcher configures it for M tokens
    at d x F (``decode_onepass_kernel._ONEPASS_CONFIG`` as it stands) with a unit-major Wd^T, as
    SparseGatedMLP passes it (one token: the firing units row by row, ``FIRE_UNITS_MAX_D``)."""
    from .decode_onepass_kernel import _BU, _decode_onepass_kernel, _meta, fire_units_width

    sig = {"x_ptr": "*bf16", "wg_ptr": "*bf16", "wu_ptr": "*bf16", "wdt_ptr": "*bf16", "part_ptr": "*fp32",
           "flag_ptr": "*i8", "cnt_ptr": "*i32", "M": "i32", "D": "i32", "F": "i32", "n_blocks": "i32",
           "stride_xm": "i32", "stride_wg": "i32", "stride_wu": "i32", "stride_wf": "i32", "stride_wd": "i32"}
    bm, bk, nk, nud, n_blocks, warps = _meta(m, d, f)[:6]
    dp = fire_units_width(m, d, unit_major=True)
    kernel = _compiled(_decode_onepass_kernel, sig,
                       {"BM": bm, "BU": _BU, "BK": bk, "NK": nk, "NUD": nud, "DP": dp, "MATCH": True}, target,
                       num_warps=warps)
    return kernel, warps, n_blocks


def _contains(kernel, *needles: str) -> bool:
    """Whether the compiled kernel's PTX holds every one of ``needles`` (plain text)."""
    ptx = kernel.asm["ptx"]
    return all(n in ptx for n in needles)


def _stats(kernel, arch: int, *, wgmma: bool = False) -> dict[str, bool | int]:
    """One compiled kernel's entry: ptxas's registers and spill bytes, the shared memory a program takes (Triton's
    allocation, ``shared_bytes``), local memory in the PTX, and with ``wgmma`` whether the PTX uses Hopper's wgmma
    instructions."""
    ptx = kernel.asm["ptx"]
    out: dict[str, bool | int] = {**_usage(ptx, arch), "shared_bytes": int(kernel.metadata.shared),
                                  "local_memory": ".local" in ptx}
    if wgmma:
        out["wgmma"] = "wgmma.mma_async" in ptx
        # TMA loads in the PTX: the software pipeliner's prologue adds its own (the fused gate: 6 pipelined, 2 not)
        out["tma_loads"] = ptx.count("cp.async.bulk.tensor")
    return out


def _tma_kernels(target: GPUTarget, arch: int) -> dict[str, dict[str, bool | int]]:
    """The kernels that load through TMA descriptors (sm_90 on): the fused hot/cold gate and the cold-down GEMM."""
    from .cold_slots_ptx import cold_slots_asm
    from .hot_cold_gate_kernel import (
        _GPU_CONFIG,
        FUSED_FLATTEN,
        FUSED_LEAN_KEYS,
        FUSED_PREFIX_DOT,
        FUSED_PTX_SLOTS,
        FUSED_RANK_SLOTS,
        FUSED_TMA_SLOTS,
        _hot_cold_gate_kernel,
        ptx_slots_supported,
    )

    out: dict[str, dict[str, bool | int]] = {}
    bm, bk, stages, warps = _GPU_CONFIG
    for tile in (128, 64):  # BN = 256 (the default tile) and 128
        sig = {"x_desc": f"tensordesc<bf16[{bm}, {bk}]>", "w_desc": f"tensordesc<bf16[{2 * tile}, {bk}]>",
               "h_ptr": "*bf16", "hcnt_ptr": "*i32", "val_ptr": "*bf16", "idx_ptr": "*i16", "ccnt_ptr": "*i32",
               "map_ptr": "*i32", **{n: "i32" for n in ("M", "H", "N_COLD", "K", "n_hot_tiles", "n_cold_tiles",
                                                        "cnt_stride", "n_out_tiles", "n_programs")},
               "zero_ptr": "*i32"}  # as hot_cold launches it: the heavy queue's counter zeroed by program 0
        consts = {"BM": bm, "BK": bk, "TILE": tile, "CAP": tile // 8, "GROUP_M": 8, "MAP_IDS": True, "ZERO": True,
                  "PREFIX_DOT": FUSED_PREFIX_DOT, "DOT_FP32": False, "FLATTEN": FUSED_FLATTEN,
                  "RANK_SLOTS": FUSED_RANK_SLOTS, "LEAN_KEYS": FUSED_LEAN_KEYS, "LEAN_PTX": FUSED_LEAN_KEYS}
        cap = consts["CAP"]
        if FUSED_TMA_SLOTS and FUSED_LEAN_KEYS and cap * 2 >= 16:  # as launch_hot_cold_gate builds it
            sig.update({"val_desc": f"tensordesc<bf16[{bm}, {cap}]>", "idx_desc": f"tensordesc<i16[{bm}, {cap}]>"})
            consts["TMA_SLOTS"] = True
        if FUSED_PTX_SLOTS and FUSED_LEAN_KEYS and ptx_slots_supported(triton.__version__):  # as launched
            pack = bm * 2 * tile // (32 * warps)
            text, constraints = cold_slots_asm(2 * tile, tile, cap, pack, True, "bf16")
            consts.update({"ASM_TEXT": text, "ASM_CONSTRAINTS": constraints, "ASM_PACK": pack})
        kernel = _compiled(_hot_cold_gate_kernel, sig, consts, target, num_warps=warps, num_stages=stages)
        out[f"hot_cold_gate_t{tile}"] = _stats(kernel, arch, wgmma=True)
        if tile == 128:  # with the list pass beside it (hot_cold.LIST_BESIDE_GATE): row-block counts released
            kernel = _compiled(_hot_cold_gate_kernel, {**sig, "done_ptr": "*i32", "trigger_from": "i32"},
                               {**consts, "ZERO": False, "DONE": True, "PDL_TRIGGER": True, "DONE_PTX": True,
                                "HOT_LAST": True}, target, num_warps=warps, num_stages=stages)
            out["hot_cold_gate_t128_counted"] = {**_stats(kernel, arch, wgmma=True), "griddepcontrol": _contains(
                kernel, "griddepcontrol.launch_dependents", "red.release.gpu.global")}
    from .cold_down_kernel import _GPU_CONFIG as _DOWN_CONFIG
    from .cold_down_kernel import LIST, _down_cold_kernel

    bm, bn, bk, stages, warps, steps = _DOWN_CONFIG
    sig = {"h_desc": f"tensordesc<bf16[{bm}, {bk}]>", "wd_desc": f"tensordesc<bf16[{bk}, {bn}]>",
           "list_h_ptr": "*bf16", "list_id_ptr": "*i32", "list_len_ptr": "*i32", "wdt_ptr": "*bf16",
           "out_ptr": "*bf16", "init_ptr": "*fp32", "M": "i32", "D": "i32", "H": "i32"}
    consts = {"BM": bm, "BN": bn, "BK": bk, "LIST": LIST, "STEPS": steps, "GROUP_M": 8, "DOT_FP32": False}
    kernel = _compiled(_down_cold_kernel, sig, consts, target, divisible=("M", "D", "H"), num_warps=warps,
                       num_stages=stages)
    out["down_cold"] = _stats(kernel, arch, wgmma=True)
    return out


def check(arch: int = 90) -> dict[str, dict[str, bool | int]]:
    if interpreting():
        raise RuntimeError("unset TRITON_INTERPRET: the compile check needs the real Triton JIT")
    from .gate_kernel import _gate_twell_kernel, _pack_twell_kernel
    from .twell_ffn_kernel import _twell_ffn_row_kernel

    target = GPUTarget("cuda", arch, 32)
    results: dict[str, dict[str, bool | int]] = {}
    gate_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "val_ptr": "*bf16", "idx_ptr": "*i16", "cnt_ptr": "*i32",
                "M": "i32", "F": "i32", "D": "i32", "M_BUCKET": "i32", "stride_xm": "i32", "stride_wf": "i32",
                "n_tiles": "i32"}
    for epilogue in (0, 2):
        consts = {"TILE": 128, "CAP": 16, "BLOCK_M": 128, "BLOCK_K": 64, "GROUP_M": 8, "DOT_FP32": False,
                  "EVEN_K": True, "EPILOGUE": epilogue}
        kernel = _compiled(_gate_twell_kernel, gate_sig, consts, target, num_warps=8, num_stages=3)
        results[f"gate_epilogue{epilogue}"] = _stats(kernel, arch, wgmma=True)
    pack_sig = {"g_ptr": "*bf16", "val_ptr": "*bf16", "idx_ptr": "*i16", "cnt_ptr": "*i32", "map_ptr": "*i32",
                "M": "i32", "F": "i32", "stride_gm": "i32", "n_tiles": "i32"}
    # the column inside the tile as each index, and the unit ids that the hot/cold split's cold pack stores
    for name, map_ids in (("pack", False), ("pack_ids", True)):
        kernel = _compiled(_pack_twell_kernel, pack_sig, {"TILE": 128, "CAP": 16, "BLOCK_M": 16, "PREFIX_DOT": False,
                                                          "MAP_IDS": map_ids}, target, num_warps=2)
        results[name] = _stats(kernel, arch)
    ffn_sig = {n: "*bf16" for n in ("x_ptr", "wg_ptr", "wu_ptr", "wdt_ptr", "out_ptr", "val_ptr", "spill_ptr")}
    ffn_sig.update({"idx_ptr": "*i16", "cnt_ptr": "*i32", "spill_slot_ptr": "*i32", "unit_map_ptr": "*i32",
                    "init_ptr": "*fp32", "taken_ptr": "*i8", "F": "i32", "D": "i32", "n_tiles": "i32",
                    "stride_xm": "i32", "stride_om": "i32", "stride_im": "i32", "stride_cm": "i32"})
    # built as launched: d = 2048 and the row strides are multiples of 16 (without that the weight rows load
    # 2 bytes at a time and ptxas reported 227 registers for the shipped split gather, against 106)
    row_divisible = ("D", "stride_xm", "stride_om", "stride_im")
    # (gated, spill, split, unit ids, preload, prefetch, SB): SB 2 with the prefetch holds two steps' rows
    for gated, spill, split, ids, preload, prefetch, sb in (
            (True, False, False, False, False, False, 4), (False, True, False, False, False, False, 4),
            (True, False, True, False, False, False, 4), (True, False, True, True, False, False, 4),
            (True, False, True, True, True, False, 4), (True, False, True, True, True, True, 2)):
        consts = {"TILE": 128, "CAP": 16, "NT_PAD": 64, "D_PAD": 2048, "SB": sb, "GATED": gated,
                  "HAS_SPILL": spill, "ROUND_HIDDEN": True, "HAS_MAP": split, "HAS_INIT": split, "IDX_IS_UNIT": ids,
                  "PRELOAD": preload, "PREFETCH": prefetch}
        kernel = _compiled(_twell_ffn_row_kernel, ffn_sig, consts, target, num_warps=4, divisible=row_divisible)
        results[f"ffn_gated{int(gated)}_spill{int(spill)}_split{int(split)}" + ("_ids" if ids else "")
                + ("_preload" if preload else "") + (f"_prefetch_sb{sb}" if prefetch else "")] = _stats(kernel, arch)
    # the row kernel leaving the block tensor-core kernel's rows alone, and that kernel (hot/cold split's cold
    # gather: unit ids, fp32 init rows; 4 warps, 3 stages as launched by default)
    consts = {"TILE": 128, "CAP": 16, "NT_PAD": 64, "D_PAD": 2048, "SB": 4, "GATED": True, "HAS_SPILL": False,
              "ROUND_HIDDEN": True, "HAS_MAP": True, "HAS_INIT": True, "IDX_IS_UNIT": True, "PRELOAD": False,
              "PREFETCH": False, "SKIP_TC_ROWS": True}
    results["ffn_gated1_spill0_split1_ids_skip_tc"] = _stats(
        _compiled(_twell_ffn_row_kernel, ffn_sig, consts, target, num_warps=4, divisible=row_divisible), arch)
    # the split's gather with each step's Wu and Wd rows requested together (GATHER_ROWS_TOGETHER)
    consts.update({"SKIP_TC_ROWS": False, "ROWS_TOGETHER": True})
    results["ffn_gated1_spill0_split1_ids_together"] = _stats(
        _compiled(_twell_ffn_row_kernel, ffn_sig, consts, target, num_warps=4, divisible=row_divisible), arch)
    # the same walking the rows' flat lists (GATHER_LISTED), and the pass that writes them (the split's cold
    # container: 40 tiles of 128 columns at 16 slots, unit ids)
    from .twell_list_kernel import (
        HEAVY_MARK,
        HEAVY_MIN_ENTRIES,
        LIST_MAX,
        _list_twell_rows_kernel,
        rows_per_program,
    )

    consts.update({"LISTED": True, "LIST_MAX": LIST_MAX})
    results["ffn_gated1_spill0_split1_ids_listed"] = _stats(
        _compiled(_twell_ffn_row_kernel, {**ffn_sig, "lst_ptr": "*i32", "lst_n_ptr": "*i32"}, consts, target,
                  num_warps=4, divisible=row_divisible), arch)
    list_sig = {"val_ptr": "*bf16", "idx_ptr": "*i16", "cnt_ptr": "*i32", "unit_map_ptr": "*i32", "lst_ptr": "*i32",
                "lst_n_ptr": "*i32", "M": "i32", "n_tiles": "i32", "stride_cm": "i32"}
    list_consts = {"TILE": 128, "CAP": 16, "NT_PAD": 64, "LIST_MAX": LIST_MAX, "ROWS": rows_per_program(64),
                   "HAS_MAP": True, "IDX_IS_UNIT": True}
    results["list_rows"] = _stats(_compiled(_list_twell_rows_kernel, list_sig, list_consts, target, num_warps=4), arch)
    # the heavy-first order (GATHER_HEAVY_FIRST): the pass filling the heavy queue, the gather taking it first
    heavy_sig = {"heavy_ptr": "*i32", "heavy_n_ptr": "*i32", "H_SLOTS": "i32"}
    heavy_consts = {"HEAVY_FIRST": True, "HEAVY_MIN": HEAVY_MIN_ENTRIES, "MARK": HEAVY_MARK}
    results["list_rows_heavy_first"] = _stats(_compiled(_list_twell_rows_kernel, {**list_sig, **heavy_sig},
                                                         {**list_consts, **heavy_consts}, target, num_warps=4), arch)
    results["ffn_gated1_spill0_split1_ids_listed_heavy_first"] = _stats(
        _compiled(_twell_ffn_row_kernel, {**ffn_sig, "lst_ptr": "*i32", "lst_n_ptr": "*i32", **heavy_sig},
                  {**consts, "HEAVY_FIRST": True, "MARK": HEAVY_MARK}, target, num_warps=4, divisible=row_divisible),
        arch)
    # as the hot/cold op launches it with a dense-row pass that takes long rows (HEAVY_ROW_PAIRS): every flagged row
    # skipped, the residual added
    results["ffn_gated1_spill0_split1_ids_listed_heavy_first_skip_flagged"] = _stats(
        _compiled(_twell_ffn_row_kernel, {**ffn_sig, "lst_ptr": "*i32", "lst_n_ptr": "*i32", **heavy_sig,
                                          "skip_ptr": "*i8", "res_ptr": "*bf16", "stride_rm": "i32"},
                  {**consts, "HEAVY_FIRST": True, "MARK": HEAVY_MARK, "SKIP_OVERFLOW_ROWS": True,
                   "SKIP_FLAGGED_ROWS": True, "HAS_RESIDUAL": True}, target, num_warps=4, divisible=row_divisible),
        arch)
    if arch >= 90:  # both as programmatic dependents (griddepcontrol: sm_90 on; hot_cold.LIST_PDL)
        kernel = _compiled(_list_twell_rows_kernel, {**list_sig, **heavy_sig},
                           {**list_consts, **heavy_consts, "PDL": True}, target, num_warps=4)
        results["list_rows_heavy_first_pdl"] = {**_stats(kernel, arch), "griddepcontrol": _contains(
            kernel, "griddepcontrol.launch_dependents", "griddepcontrol.wait")}
        kernel = _compiled(_twell_ffn_row_kernel, {**ffn_sig, "lst_ptr": "*i32", "lst_n_ptr": "*i32", **heavy_sig},
                           {**consts, "HEAVY_FIRST": True, "MARK": HEAVY_MARK, "PDL_WAIT": True}, target, num_warps=4,
                           divisible=row_divisible)
        results["ffn_gated1_spill0_split1_ids_listed_heavy_first_pdl"] = {
            **_stats(kernel, arch), "griddepcontrol": _contains(kernel, "griddepcontrol.wait")}
        # the list pass beside the fused gate (hot_cold.LIST_BESIDE_GATE): its wait on the row block's count
        kernel = _compiled(_list_twell_rows_kernel,
                           {**list_sig, **heavy_sig, "done_ptr": "*i32", "done_target": "i32"},
                           {**list_consts, **heavy_consts, "PDL": True, "GATE_BM": 128, "WAIT_DONE": True,
                            "PTX_WAIT": True, "CACHE": ".cg", "ONE_WAITS": True}, target, num_warps=4)
        results["list_rows_heavy_first_beside_gate"] = {**_stats(kernel, arch), "griddepcontrol": _contains(
            kernel, "griddepcontrol.wait", "nanosleep", "ld.global.cg", "ld.acquire.gpu.global")}
    from .twell_ffn_tc_kernel import _twell_ffn_tc_kernel

    tc_sig = {n: "*bf16" for n in ("x_ptr", "wu_ptr", "wdt_ptr", "out_ptr", "val_ptr")}
    tc_sig.update({"idx_ptr": "*i16", "cnt_ptr": "*i32", "unit_map_ptr": "*i32", "init_ptr": "*fp32",
                   "taken_ptr": "*i8", "M": "i32", "D": "i32", "n_tiles": "i32", "stride_xm": "i32", "stride_om": "i32",
                   "stride_im": "i32"})
    consts = {"TILE": 128, "CAP": 16, "NT_PAD": 64, "BT_": 16, "S": 256, "ROW_MAX_": 64, "TJ": 32, "BK_": 64,
              "BD_": 64, "GATED": True, "HAS_MAP": True, "HAS_INIT": True, "IDX_IS_UNIT": True, "EVEN_D": True,
              "DOT_FP32": False}
    results["ffn_tc_block"] = _stats(_compiled(_twell_ffn_tc_kernel, tc_sig, consts, target, num_warps=4, num_stages=3,
                                                divisible=("D", "stride_xm", "stride_om", "stride_im")), arch)
    from .hot_cold import _hot_hidden_kernel

    hot_sig = {"gu_ptr": "*bf16", "h_ptr": "*bf16", "cnt_ptr": "*i32", "M": "i32", "H": "i32", "F": "i32",
               "stride_gm": "i32", "n_hot_tiles": "i32"}
    kernel = _compiled(_hot_hidden_kernel, hot_sig, {"BLOCK_M": 32, "TILE": 128}, target, num_warps=4)
    results["hot_hidden"] = _stats(kernel, arch)
    from .bitmap_kernels import _bitmap_ffn_row_kernel, _pack_bitmap_kernel

    kernel = _compiled(_pack_bitmap_kernel, {"g_ptr": "*bf16", "bits_ptr": "*i32", "cnt_ptr": "*i32", "M": "i32",
                                             "F": "i32", "stride_gm": "i32", "n_tiles": "i32"},
                       {"TILE": 128, "BLOCK_M": 16}, target, num_warps=2)
    results["pack_bitmap"] = _stats(kernel, arch)
    bm_sig = {n: "*bf16" for n in ("x_ptr", "g_ptr", "wu_ptr", "wdt_ptr", "out_ptr")}
    bm_sig.update({"bits_ptr": "*i32", "cnt_ptr": "*i32", "unit_map_ptr": "*i32", "init_ptr": "*fp32", "D": "i32",
                   "n_tiles": "i32", "stride_xm": "i32", "stride_gm": "i32", "stride_om": "i32", "stride_im": "i32"})
    kernel = _compiled(_bitmap_ffn_row_kernel, bm_sig, {"TILE": 128, "NT_PAD": 64, "D_PAD": 2048, "SB": 4,
                                                        "HAS_INIT": True}, target, num_warps=4)
    results["bitmap_ffn"] = _stats(kernel, arch)
    from .block_union_kernel import _block_union_kernel, _union_down_kernel, _union_up_kernel

    union_sig = {"g_ptr": "*bf16", "cnt_ptr": "*i32", "ucnt_ptr": "*i32", "ucols_ptr": "*i16", "M": "i32", "F": "i32",
                 "stride_gm": "i32", "n_tiles": "i32"}
    kernel = _compiled(_block_union_kernel, union_sig, {"BLOCK_M": 64, "TILE": 128}, target, num_warps=4)
    results["block_union"] = _stats(kernel, arch)
    up_sig = {"x_ptr": "*bf16", "wu_ptr": "*bf16", "g_ptr": "*bf16", "h_ptr": "*bf16", "ucnt_ptr": "*i32",
              "ucols_ptr": "*i16", "M": "i32", "D": "i32", "stride_xm": "i32", "stride_gm": "i32", "stride_hm": "i32",
              "n_tiles": "i32"}
    up_consts = {"BLOCK_M": 64, "BLOCK_U": 64, "BLOCK_K": 64, "TILE": 128, "NT_PAD": 64, "ROUND_HIDDEN": True,
                 "DOT_FP32": False}
    kernel = _compiled(_union_up_kernel, up_sig, up_consts, target, num_warps=4, num_stages=3)
    results["union_up"] = _stats(kernel, arch, wgmma=True)
    down_sig = {"h_ptr": "*bf16", "wdt_ptr": "*bf16", "out_ptr": "*bf16", "ucnt_ptr": "*i32", "ucols_ptr": "*i16",
                "M": "i32", "D": "i32", "stride_hm": "i32", "stride_om": "i32", "n_tiles": "i32"}
    kernel = _compiled(_union_down_kernel, down_sig, {"BLOCK_M": 64, "BLOCK_D": 128, "BLOCK_U": 64, "TILE": 128,
                                                      "NT_PAD": 64, "H_IS_GATE": False, "DOT_FP32": False},
                       target, num_warps=4, num_stages=3)
    results["union_down"] = _stats(kernel, arch, wgmma=True)

    from .train_kernels import _backward_rows_kernel, _forward_rows_kernel, _pack_rows_kernel, _unit_grads_kernel

    pack_rows_sig = {"g_ptr": "*bf16", "ids_ptr": "*i32", "val_ptr": "*bf16", "cnt_ptr": "*i32", "F": "i32", "W": "i32",
                     "stride_gm": "i32"}
    kernel = _compiled(_pack_rows_kernel, pack_rows_sig, {"BF": 8192}, target, num_warps=4)
    results["train_pack_rows"] = _stats(kernel, arch)
    rows = {"D_PAD": 2048, "SB": 4}
    fwd_sig = {"x_ptr": "*bf16", "wg_ptr": "*bf16", "wu_ptr": "*bf16", "wdt_ptr": "*bf16", "ids_ptr": "*i32",
               "val_ptr": "*bf16", "cnt_ptr": "*i32", "u_ptr": "*fp32", "out_ptr": "*bf16", "l1_ptr": "*fp32",
               "F": "i32", "D": "i32", "W": "i32", "stride_xm": "i32", "stride_om": "i32"}
    kernel = _compiled(_forward_rows_kernel, fwd_sig, rows, target, num_warps=4)
    results["train_forward_rows"] = _stats(kernel, arch)
    bwd_sig = {"x_ptr": "*bf16", "go_ptr": "*bf16", "wg_ptr": "*bf16", "wu_ptr": "*bf16", "wdt_ptr": "*bf16",
               "ids_ptr": "*i32", "val_ptr": "*bf16", "cnt_ptr": "*i32", "u_ptr": "*fp32", "gl1_ptr": "*fp32",
               "dg_ptr": "*fp32", "du_ptr": "*fp32", "dx_ptr": "*bf16", "M": "i32", "F": "i32", "D": "i32",
               "W": "i32", "stride_xm": "i32", "stride_gm": "i32", "stride_dxm": "i32"}
    kernel = _compiled(_backward_rows_kernel, bwd_sig, rows, target, num_warps=4)
    results["train_backward_rows"] = _stats(kernel, arch)
    unit_sig = {"x_ptr": "*bf16", "go_ptr": "*bf16", "wg_ptr": "*bf16", "wu_ptr": "*bf16", "wdt_ptr": "*bf16",
                "perm_ptr": "*i64", "start_ptr": "*i64", "val_ptr": "*bf16", "u_ptr": "*fp32", "dg_ptr": "*fp32",
                "du_ptr": "*fp32", "ovl_ptr": "*i64", "nover_ptr": "*i64", "gl1_ptr": "*fp32", "pwd_ptr": "*fp32",
                "pwg_ptr": "*fp32", "pwu_ptr": "*fp32", "M": "i32", "F": "i32", "D": "i32", "W": "i32", "K": "i32",
                "stride_xm": "i32", "stride_gm": "i32"}
    kernel = _compiled(_unit_grads_kernel, unit_sig, rows, target, num_warps=4)
    results["train_unit_grads"] = _stats(kernel, arch)
    from .decode_kernels import _HIDDEN_BU, _decode_down_kernel, _decode_hidden_kernel, _meta

    for bm in (16, 64):  # one token and the largest decode batch
        # the launchers' configuration for this BM
        _, bk, _, bd, bu, bc, _, warps, stages, hidden_stages, hidden_warps, fused_up = _meta(bm, 2048, 5632)
        hidden_sig = {"x_ptr": "*bf16", "wg_ptr": "*bf16", "wu_ptr": "*bf16", "g_ptr": "*bf16", "h_ptr": "*bf16",
                      "act_ptr": "*i8", "cnt_ptr": "*i32", "M": "i32", "D": "i32", "F": "i32", "stride_xm": "i32",
                      "stride_wg": "i32", "stride_wu": "i32", "stride_gm": "i32", "stride_hm": "i32",
                      "n_blocks": "i32"}
        for gate_in in (False, True):  # the gate in the kernel's K loop, or read from cuBLAS's output
            kernel = _compiled(_decode_hidden_kernel, hidden_sig,
                               {"BM": bm, "BU": _HIDDEN_BU, "BK": bk, "DOT_FP32": False, "MATCH": True,
                                "K_STAGES": hidden_stages, "FUSED_UP": fused_up and not gate_in, "GATE_IN": gate_in},
                               target, num_warps=hidden_warps)
            results[f"decode_hidden_bm{bm}" + ("_gate_in" if gate_in else "")] = _stats(kernel, arch)
        down_sig = {"h_ptr": "*bf16", "act_ptr": "*i8", "wdt_ptr": "*bf16", "out_ptr": "*bf16", "idx_ptr": "*i32",
                    "M": "i32", "D": "i32", "F": "i32", "stride_hm": "i32", "stride_wf": "i32", "stride_wd": "i32",
                    "stride_om": "i32"}
        kernel = _compiled(_decode_down_kernel, down_sig, {"BM": bm, "BD": bd, "BU": bu, "BC": bc, "DOT_FP32": False,
                                                           "K_STAGES": stages}, target, num_warps=warps)
        results[f"decode_down_bm{bm}"] = _stats(kernel, arch)
    from . import decode_batch_kernels as dbk

    _, dbu, dwarps, dstages, _ = dbk._DOWN_CONFIG
    # as launched: on sm_90 and up programmatic dependents that trigger after their last store (griddepcontrol, which
    # ptxas rejects below sm_90), below it plain launches (decode_batch_kernels._pdl)
    pdl = {"PDL": arch >= 90, "EARLY": dbk.PDL_EARLY}
    for bm in (16, 32, 64):  # every token tile with its own up configuration (dbk.up_config)
        ubk, ustages, uwarps = dbk.up_config(bm)
        kernel = _compiled(dbk._batch_up_kernel, BATCH_UP_SIGNATURE,
                           {"BM": bm, "BU": _HIDDEN_BU, "BK": ubk, "DOT_FP32": False, "MATCH": True,
                            "K_STAGES": ustages, **pdl}, target, num_warps=uwarps)
        results[f"batch_up_bm{bm}"] = {**_stats(kernel, arch),
                                       "griddepcontrol": _contains(kernel, "griddepcontrol.wait")}
        bd, _, r = dbk.down_split(bm, 2048, 5632, 132)
        down_sig = {"ht_ptr": "*bf16", "fires_ptr": "*i8", "wdt_ptr": "*bf16", "dst_ptr": "*fp32", "idx_ptr": "*i32",
                    "M": "i32", "D": "i32", "F": "i32", "R": "i32", "stride_ht": "i32", "stride_wf": "i32",
                    "stride_wd": "i32"}
        kernel = _compiled(dbk._batch_down_kernel, down_sig,
                           {"BM": bm, "BD": bd, "BU": dbu, "BC": min(1024, next_pow2(r)), "DOT_FP32": False,
                            "K_STAGES": dstages, "DIRECT": False, **pdl}, target, num_warps=dwarps)
        results[f"batch_down_bm{bm}"] = {**_stats(kernel, arch),
                                         "griddepcontrol": _contains(kernel, "griddepcontrol.wait")}
    kernel = _compiled(dbk._partial_sum_kernel, {"part_ptr": "*fp32", "out_ptr": "*bf16", "N": "i32"},
                       {"S": 15, "BLOCK": dbk._SUM_BLOCK, "PDL": pdl["PDL"]}, target, num_warps=4)
    results["batch_partial_sum"] = {**_stats(kernel, arch), "griddepcontrol": _contains(kernel, "griddepcontrol.wait")}
    from .decode_onepass_kernel import _decode_column_sum_kernel
    from .decode_onepass_kernel import _meta as _onepass_meta

    for m in (1, 8):  # one token and the largest token count of the kernel
        kernel, _, _ = onepass_kernel(m, 2048, 5632, target)
        results[f"decode_onepass_bm{_onepass_meta(m, 2048, 5632)[0]}"] = _stats(kernel, arch)
    obd, obp, osum_warps = _onepass_meta(8, 2048, 5632)[6:]
    sum_sig = {"part_ptr": "*fp32", "flag_ptr": "*i8", "out_ptr": "*bf16", "D": "i32", "n_blocks": "i32",
               "stride_om": "i32"}
    kernel = _compiled(_decode_column_sum_kernel, sum_sig, {"BD": obd, "BP": obp}, target, num_warps=osum_warps)
    results["decode_column_sum"] = _stats(kernel, arch)
    if arch >= 90:  # TMA descriptors and wgmma: built and launched from sm_90 on (hot_cold_plan.fused_gate_tile)
        results.update(_tma_kernels(target, arch))
    from .cold_down_kernel import LIST, _cold_list_kernel

    sig = {"x_ptr": "*bf16", "wu_ptr": "*bf16", "val_ptr": "*bf16", "idx_ptr": "*i16", "cnt_ptr": "*i32",
           "unit_map_ptr": "*i32", "list_h_ptr": "*bf16", "list_id_ptr": "*i32", "list_len_ptr": "*i32",
           "taken_ptr": "*i8", "D": "i32", "n_tiles": "i32", "stride_xm": "i32"}
    consts = {"TILE": 128, "CAP": 16, "NT_PAD": 64, "D_PAD": 2048, "SB": 4, "LIST": LIST, "HAS_MAP": True,
              "IDX_IS_UNIT": True}
    kernel = _compiled(_cold_list_kernel, sig, consts, target, divisible=("D", "stride_xm"), num_warps=4)
    results["cold_list"] = _stats(kernel, arch)
    from .rope_kernel import _rope_kernel

    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
           **{n: "i32" for n in ("S", "H", "sxb", "sxh", "sxs", "sob", "soh", "sos", "scb", "scs")}}
    for backward in (False, True):  # the 1.5B preset's heads: 32 of 64
        kernel = _compiled(_rope_kernel, sig, {"HALF": 32, "H_PAD": 32, "HALF_PAD": 32, "BACKWARD": backward}, target,
                           num_warps=4, enable_fp_fusion=False)
        results[f"rope{'_backward' if backward else ''}"] = _stats(kernel, arch)
    from . import dense_rows_kernels as drk

    kernel = _compiled(drk._overflow_flags_kernel,
                       {"counts_ptr": "*i32", "stride_m": "i32", "stride_t": "i32", "m": "i32", "n_tiles": "i32",
                        "capacity": "i32", "heavy_pairs": "i32", "n_blocks": "i32", "flags_ptr": "*i8",
                        "block_counts_ptr": "*i32"},
                       {"BLOCK_M": drk._SELECT_BLOCK_M, "BLOCK_T": drk._SELECT_BLOCK_T}, target, num_warps=4)
    results["dense_rows_flags"] = _stats(kernel, arch)
    kernel = _compiled(drk._overflow_ranks_kernel,
                       {"flags_ptr": "*i8", "block_counts_ptr": "*i32", "n_blocks": "i32", "m": "i32", "budget": "i32",
                        "rows_ptr": "*i64"},
                       {"BLOCK_M": drk._SELECT_BLOCK_M, "CHUNK": drk._SELECT_CHUNK}, target, num_warps=4)
    results["dense_rows_ranks"] = _stats(kernel, arch)
    kernel = _compiled(drk._gated_product_kernel, {"g_ptr": "*bf16", "u_ptr": "*bf16", "h_ptr": "*bf16", "n": "i32"},
                       {"KEEP_NEG_ZERO": False, "BLOCK": drk._PRODUCT_BLOCK}, target, num_warps=4)
    results["dense_rows_product"] = _stats(kernel, arch)
    kernel = _compiled(drk._scatter_rows_kernel,
                       {"y_ptr": "*bf16", "rows_ptr": "*i64", "res_ptr": "*bf16", "out_ptr": "*bf16", "d": "i32",
                        "stride_y": "i32", "stride_res": "i32", "stride_out": "i32"},
                       {"HAS_RES": True, "BLOCK_D": drk._SCATTER_BLOCK_D}, target, num_warps=4)
    results["dense_rows_scatter"] = _stats(kernel, arch)
    return results


if __name__ == "__main__":
    json.dump(check(int(sys.argv[1]) if len(sys.argv) > 1 else 90), sys.stdout)
    print()
