"""A ping-pong persistent GEMM in Gluon against cuBLAS and the fused gate's own mainloop, at the split's gate GEMM.

Why (docs/performance.md, next step 0): at M=131072, l0=28 the flattened fused gate runs 5.337 ms against 4.902
for its mainloop alone (epilogue_ablation_probe_session17.log); the 0.435 ms between them is its epilogues'
latency, which neither fewer instructions nor the software pipeliner removed.  A ping-pong schedule hides an
epilogue behind a mainloop: two consumer warpgroups take a program's output tiles in turn (even, odd), a
producer warp issues every TMA load into one ring of shared-memory stages, and an order barrier lets a consumer
start its mainloop only when the other has finished issuing its own, so that one warpgroup's epilogue runs
while the other's wgmma keep the tensor cores busy.  Triton 3.6's ``warp_specialize`` does not build this on
sm_90 (the same PTX as without it); Gluon (``triton.experimental.gluon``, Triton 3.6) can.  A consumer owns a
128 x 128 fp32 accumulator (128 registers a thread), so its tiles are 128 x 128 against the fused gate's
128 x 256 on 8 warps: 1.33x the shared-memory fill per FLOP.  Before an epilogue moves over, the plain GEMM has
to keep up with cuBLAS and with the fused gate's mainloop; this probe times that, with and without a bf16
output (TMA store through shared memory), back to back at the power cap (``clock_probe.measure``).

Prediction: within 0-5 % of the fused gate's mainloop (4.90 ms at M=131072 without a store); if it is more than
5 % slower, the smaller tiles cost more than the ~0.4 ms an overlapped epilogue could save.
The figures in bench_results/h200/pingpong_gemm_probe_session17.log came from this kernel's first form
(50c65df), its own copy of the mainloop, where STORE reached the partitions as a runtime value (an argument
tuple assigned to a name turns constexprs into tensors); the mainloop is now ``pingpong_gate_kernel``'s.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/pingpong_gemm_probe.py``; ``--compile-only`` builds the
kernel for sm_90a offline (no GPU: registers, spills and shared memory from ptxas), the CPU smoke test.
"""

from __future__ import annotations

import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from twell.ops.pingpong_gate_kernel import (
    BK,
    BM,
    BN,
    CONSUMER_REGS,
    MAXNREG,
    PRODUCER_REGS,
    STAGES,
    TILE_M,
    TILE_N,
    _tile,
    alloc_ring,
    build_sm90,
    load_ring,
    mainloop,
    program_tiles,
    wait_turn,
)

#: the gate kernel's tiles, ring and register split (``twell.ops.pingpong_gate_kernel``), plus one [BM, BN]
#: bf16 output buffer per consumer (64 KB): 192 KB of shared memory at 4 stages

@gluon.jit
def _producer(x_desc, w_desc, c_desc, x_bufs, w_bufs, c_bufs, ready, empty, order, sums_ptr, M, N, K, n_programs,
              STORE: gl.constexpr):
    load_ring(x_desc, w_desc, x_bufs, w_bufs, ready, empty, M, gl.cdiv(N, TILE_N), K, n_programs)


@gluon.jit
def _consumer(x_desc, w_desc, c_desc, x_bufs, w_bufs, c_bufs, ready, empty, order, sums_ptr, M, N, K, n_programs,
              STORE: gl.constexpr, WHO: gl.constexpr):
    """One warpgroup: the program's tiles WHO, WHO + 2, ..., the gate kernel's mainloop, then a bf16 TMA store
    of the tile (``STORE``) or one sum of it."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE_N, 16])
    num_pid_n = gl.cdiv(N, TILE_N)
    pid, num_pid_m, mine, k_steps = program_tiles(M, num_pid_n, K, n_programs)
    for i in range(WHO, mine, 2):
        wait_turn(order, i, WHO)
        pm, pn = _tile(i, pid, n_programs, num_pid_m, num_pid_n)
        acc = mainloop(x_bufs, w_bufs, ready, empty, order, i, k_steps, layout, WHO)
        if STORE:
            buf = c_bufs.index(WHO)
            tma.store_wait(0)  # this consumer's previous tile has left the buffer
            buf.store(acc.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [pm * TILE_M, pn * TILE_N], buf)
        else:  # no output: one sum a tile keeps the accumulator live
            gl.store(sums_ptr + pid + i * n_programs, gl.sum(gl.sum(acc, axis=1), axis=0))
    if STORE:
        tma.store_wait(0)


@gluon.jit
def _pingpong_gemm_kernel(x_desc, w_desc, c_desc, sums_ptr, M, N, K, n_programs, STORE: gl.constexpr,
                          NUM_STAGES: gl.constexpr, CONSUMER_NREG: gl.constexpr, PRODUCER_NREG: gl.constexpr):
    """x @ w^T (x [M, K], w [N, K], bf16, fp32 accumulation) in [BM, BN] tiles, one program a SM."""
    x_bufs, w_bufs, ready, empty, order = alloc_ring(x_desc, w_desc, NUM_STAGES)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    gl.warp_specialize([
        (_consumer, (x_desc, w_desc, c_desc, x_bufs, w_bufs, c_bufs, ready, empty, order, sums_ptr, M, N, K,
                     n_programs, STORE, 0)),
        (_consumer, (x_desc, w_desc, c_desc, x_bufs, w_bufs, c_bufs, ready, empty, order, sums_ptr, M, N, K,
                     n_programs, STORE, 1)),
        (_producer, (x_desc, w_desc, c_desc, x_bufs, w_bufs, c_bufs, ready, empty, order, sums_ptr, M, N, K,
                     n_programs, STORE)),
    ], [4, 1], [CONSUMER_NREG, PRODUCER_NREG])


def _descriptors(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> tuple:
    op_layout = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    out_layout = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.bfloat16)
    return (TensorDescriptor.from_tensor(x, [BM, BK], op_layout), TensorDescriptor.from_tensor(w, [BN, BK], op_layout),
            TensorDescriptor.from_tensor(out, [BM, BN], out_layout))


def pingpong_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, sums: torch.Tensor, store: bool,
                  n_programs: int) -> None:
    """``out = x @ w^T`` in bf16 (``store``) or, without it, one fp32 sum per output tile into ``sums``."""
    m, k = x.shape
    x_desc, w_desc, c_desc = _descriptors(x, w, out)
    _pingpong_gemm_kernel[(n_programs,)](x_desc, w_desc, c_desc, sums, m, w.shape[0], k, n_programs, store, STAGES,
                                         CONSUMER_REGS, PRODUCER_REGS, num_warps=4, maxnreg=MAXNREG)


def compile_offline(store: bool) -> str:
    """One line: the kernel built for sm_90a without a GPU (``pingpong_gate_kernel.build_sm90``: registers,
    spills, shared memory, setmaxnreg)."""
    from triton.runtime.jit import mangle_type

    x = torch.empty((256, 2048), dtype=torch.bfloat16)
    w = torch.empty((256, 2048), dtype=torch.bfloat16)
    out = torch.empty((256, 256), dtype=torch.bfloat16)
    x_desc, w_desc, c_desc = _descriptors(x, w, out)
    sig = {"x_desc": mangle_type(x_desc), "w_desc": mangle_type(w_desc), "c_desc": mangle_type(c_desc),
           "sums_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "n_programs": "i32"}
    consts = {"STORE": store, "NUM_STAGES": STAGES, "CONSUMER_NREG": CONSUMER_REGS, "PRODUCER_NREG": PRODUCER_REGS}
    return f"store {store}: {build_sm90(_pingpong_gemm_kernel, sig, consts)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true", help="build for sm_90a offline and print its usage")
    ap.add_argument("--check", action="store_true", help="GPU: one small product against cuBLAS, then stop")
    a = ap.parse_args()
    if a.compile_only:
        for store in (False, True):
            print(compile_offline(store), flush=True)
        return
    if a.check:
        dev = torch.device("cuda")
        x = torch.randn((1000, 2048), device=dev).to(torch.bfloat16)
        w = (torch.randn((700, 2048), device=dev) / 2048**0.5).to(torch.bfloat16)
        out = torch.full((1000, 704), float("nan"), dtype=torch.bfloat16, device=dev)[:, :700]
        sums = torch.empty(8 * 6, dtype=torch.float32, device=dev)
        pingpong_gemm(x, w, out, sums, True, 5)
        pingpong_gemm(x, w, out, sums, False, 5)
        torch.cuda.synchronize()
        diff = (out.float() - (x.float() @ w.float().t())).abs().max().item()
        print(f"check M=1000 N=700 K=2048, 5 programs: max |ping-pong - fp32 product| {diff:.3e}", flush=True)
        return
    from clock_probe import Nvml

    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)} torch {torch.__version__}", flush=True)
    nvml = Nvml(dev.index or 0)
    gen = torch.Generator(device=dev).manual_seed(0)
    for m in (131072, 16384):
        _time_point(m, dev, nvml, gen)
        torch.cuda.empty_cache()


def _time_point(m: int, dev: torch.device, nvml: object, gen: torch.Generator) -> None:
    """The ping-pong GEMM's error against cuBLAS, then every path back to back at M=m."""
    import torch.nn.functional as F
    from clock_probe import measure  # scripts/ (the script's own directory is on sys.path)
    from triton_gemm_probe import fused_gate_mainloop

    from twell.ops._runtime import sm_count
    from twell.tolerances import REL_TOL, rel_error

    k, n = 2048, 5632 + 576  # the split's gate GEMM at l0 = 28: [Wg; Wu[hot]]
    x = torch.randn((m, k), generator=gen, device=dev).to(torch.bfloat16)
    w = (torch.randn((n, k), generator=gen, device=dev) / k**0.5).to(torch.bfloat16)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
    n_tiles = -(-m // BM) * -(-n // BN)
    sums = torch.empty(n_tiles, dtype=torch.float32, device=dev)
    programs = min(n_tiles, sm_count(dev.index))
    pingpong_gemm(x, w, out, sums, True, programs)
    err = rel_error(out, F.linear(x, w))
    print(f"M={m:6d} | ping-pong output vs cuBLAS: relative error {err:.1e} (ok {err <= REL_TOL[torch.bfloat16]})",
          flush=True)
    mainloop = fused_gate_mainloop(x, w, 128)
    runs = [("cuBLAS (bf16 output)", lambda: F.linear(x, w)),
            ("fused gate's mainloop, no store", lambda: mainloop(False)),
            ("fused gate's mainloop, bf16 output", lambda: mainloop(True)),
            ("ping-pong, no store", lambda: pingpong_gemm(x, w, out, sums, False, programs)),
            ("ping-pong, bf16 output", lambda: pingpong_gemm(x, w, out, sums, True, programs)),
            ("fused gate's mainloop, no store (again)", lambda: mainloop(False))]
    for label, fn in runs:
        print(f"M={m:6d} | " + measure(label, fn, nvml, dev, 2.0), flush=True)

if __name__ == "__main__":
    main()
