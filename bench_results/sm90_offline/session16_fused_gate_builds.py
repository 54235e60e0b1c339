"""Offline sm_90a builds of the fused hot/cold gate kernel (session 16), as launched at tile 128, bf16, unit
ids on (MAP_IDS) unless a variant says otherwise: registers and spilled bytes (ptxas from Triton), shared
memory, and global loads (LDG) in the SASS.  Run with PYTHONPATH pointing at the tree to build:

    PYTHONPATH=src TRITON_INTERPRET=0 python bench_results/sm90_offline/session16_fused_gate_builds.py
"""
import inspect
import os
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from twell.ops.cold_slots_ptx import cold_slots_asm
from twell.ops.compile_check import _jit, _ptxas, _usage
from twell.ops.hot_cold_gate_kernel import _GPU_CONFIG, _hot_cold_gate_kernel

BM, BK, _, WARPS = _GPU_CONFIG
TILE, CAP = 128, 16
SIG = {"x_desc": f"tensordesc<bf16[{BM}, {BK}]>", "w_desc": f"tensordesc<bf16[{2 * TILE}, {BK}]>",
       "h_ptr": "*bf16", "hcnt_ptr": "*i32", "val_ptr": "*bf16", "idx_ptr": "*i16", "ccnt_ptr": "*i32",
       "map_ptr": "*i32", **{n: "i32" for n in ("M", "H", "N_COLD", "K", "n_hot_tiles", "n_cold_tiles",
                                                "n_out_tiles", "n_programs")}}


def build(stages: int, map_ids: bool = True, flatten: bool = False) -> None:
    pack = BM * 2 * TILE // (32 * WARPS)
    text, constraints = cold_slots_asm(2 * TILE, TILE, CAP, pack, map_ids, "bf16")
    consts = dict(BM=BM, BK=BK, TILE=TILE, CAP=CAP, GROUP_M=8, MAP_IDS=map_ids, PREFIX_DOT=False, DOT_FP32=False,
                  FLATTEN=flatten, RANK_SLOTS=True, LEAN_KEYS=True, LEAN_PTX=True, ASM_TEXT=text,
                  ASM_CONSTRAINTS=constraints, ASM_PACK=pack)
    fn = _jit(_hot_cold_gate_kernel)
    names = list(inspect.signature(fn.fn).parameters)
    sig = {**{k: SIG[k] for k in names if k in SIG}, **{k: "constexpr" for k in consts}}
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in SIG if SIG[k].startswith("*")}
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS, "num_stages": stages})
    ptx = kernel.asm["ptx"]
    d = tempfile.mkdtemp()
    with open(f"{d}/k.ptx", "w") as fh:
        fh.write(ptx)
    subprocess.run([_ptxas(), "-arch=sm_90a", f"{d}/k.ptx", "-o", f"{d}/k.cubin"], check=True)
    sass = subprocess.run([os.path.join(os.path.dirname(_ptxas()), "nvdisasm"), "-c", f"{d}/k.cubin"],
                          capture_output=True, text=True, check=True).stdout
    ldg = sum(1 for line in sass.splitlines() if " LDG" in line)
    print(f"stages {stages}, unit ids {map_ids}, flatten {flatten}: {_usage(ptx, 90)}, shared memory "
          f"{kernel.metadata.shared} B, LDG in the SASS {ldg}", flush=True)


build(3)  # as shipped
build(3, map_ids=False)  # hot_cold.COLD_UNIT_IDS off: columns stored, no map load in the epilogue
build(3, flatten=True)  # FUSED_FLATTEN
build(4)  # 4 stages
