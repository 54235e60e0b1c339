"""Build every Triton kernel for a GPU target without a GPU (``python -m twell.ops.compile_check``).

Prints one JSON object: per kernel variant, whether it compiled, whether the gate GEMM uses Hopper's
wgmma instructions, and whether any variant touches local memory (register spills).  Must run
without ``TRITON_INTERPRET=1`` (the interpreter replaces the kernels by Python functions).
"""

from __future__ import annotations

import json
import sys

import triton
from triton.backends.compiler import GPUTarget

from ._runtime import interpreting


def _jit(fn):
    """The JITFunction under autotune/heuristics wrappers."""
    while not isinstance(fn, triton.runtime.JITFunction):
        fn = fn.fn
    return fn


def _compile(fn, signature: dict, constexprs: dict, target: GPUTarget, **options) -> str:
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    src = triton.compiler.ASTSource(fn=_jit(fn), signature=sig, constexprs=constexprs)
    return triton.compile(src, target=target, options=options).asm["ptx"]


def check(arch: int = 90) -> dict[str, dict[str, bool]]:
    if interpreting():
        raise RuntimeError("unset TRITON_INTERPRET: the compile check needs the real Triton JIT")
    from .gate_kernel import _gate_twell_kernel, _pack_twell_kernel
    from .twell_ffn_kernel import _twell_ffn_row_kernel

    target = GPUTarget("cuda", arch, 32)
    results: dict[str, dict[str, bool]] = {}
    gate_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "val_ptr": "*bf16", "idx_ptr": "*i16", "cnt_ptr": "*i32",
                "M": "i32", "F": "i32", "D": "i32", "M_BUCKET": "i32", "stride_xm": "i32", "stride_wf": "i32",
                "n_tiles": "i32"}
    for epilogue in (0, 2):
        consts = {"TILE": 128, "CAP": 16, "BLOCK_M": 128, "BLOCK_K": 64, "GROUP_M": 8, "DOT_FP32": False,
                  "EVEN_K": True, "EPILOGUE": epilogue}
        ptx = _compile(_gate_twell_kernel, gate_sig, consts, target, num_warps=8, num_stages=3)
        results[f"gate_epilogue{epilogue}"] = {"wgmma": "wgmma.mma_async" in ptx, "local_memory": ".local" in ptx}
    pack_sig = {"g_ptr": "*bf16", "val_ptr": "*bf16", "idx_ptr": "*i16", "cnt_ptr": "*i32", "M": "i32", "F": "i32",
                "stride_gm": "i32", "n_tiles": "i32"}
    ptx = _compile(_pack_twell_kernel, pack_sig, {"TILE": 128, "CAP": 16, "BLOCK_M": 64, "PREFIX_DOT": True},
                   target, num_warps=4)
    results["pack"] = {"local_memory": ".local" in ptx}
    ffn_sig = {n: "*bf16" for n in ("x_ptr", "wg_ptr", "wu_ptr", "wdt_ptr", "out_ptr", "val_ptr", "spill_ptr")}
    ffn_sig.update({"idx_ptr": "*i16", "cnt_ptr": "*i32", "spill_slot_ptr": "*i32", "F": "i32", "D": "i32",
                    "n_tiles": "i32", "stride_xm": "i32", "stride_om": "i32"})
    for gated, spill in ((True, False), (False, True)):
        consts = {"TILE": 128, "CAP": 16, "NT_PAD": 64, "D_PAD": 2048, "SB": 4, "GATED": gated,
                  "HAS_SPILL": spill, "ROUND_HIDDEN": True}
        ptx = _compile(_twell_ffn_row_kernel, ffn_sig, consts, target, num_warps=4)
        results[f"ffn_gated{int(gated)}_spill{int(spill)}"] = {"local_memory": ".local" in ptx}
    return results


if __name__ == "__main__":
    json.dump(check(int(sys.argv[1]) if len(sys.argv) > 1 else 90), sys.stdout)
    print()
