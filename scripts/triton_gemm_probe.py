"""GPU time of Triton GEMMs built on Hopper's TMA (tensor descriptors, optionally persistent and
warp-specialised) against cuBLAS, at the hot/cold split's gate GEMM shape.

Why: the split's pack of the cold gate columns (1.6 ms at M=131072, 0.5 %; bench_results/h200/
cold_pack_gather_probe_session7.log) exists because the gate GEMM runs in cuBLAS, which cannot write
TwELL.  Our pointer-based Triton GEMM with a dense-store epilogue ran at 62 % of cuBLAS (6.83 vs 4.27
ms, bench_results/h200/kernel_variants_v1.log), too slow to carry the pack in its epilogue.  Whether a
TMA mainloop closes that gap decides if fusing the pack into the GEMM can pay: the fused kernel saves
the pack and the dense gate's round trip through memory (~1.3 GB written and read at M=131072) only if
its mainloop costs at most ~1.5 ms more than cuBLAS's.

Per configuration ``(BM, BN, BK, stages, warps, programs per SM, warp-specialised)`` (0 programs per SM:
one program per output tile, else a persistent grid of that many programs per SM): the median time
(``twell.bench.timing.time_ms``) and the ratio to cuBLAS (``F.linear``), and whether the result equals
cuBLAS's within bf16 rounding; a configuration that does not build is reported and the sweep goes on.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/triton_gemm_probe.py``; ``--device cpu --tiny``
under TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from twell.bench.probe import probe_args
from twell.bench.timing import time_ms
from twell.ops._runtime import interpreting, sm_count
from twell.ops.gate_kernel import dot_acc, round_to, tile_coords
from twell.ops.hot_cold_gate_kernel import _GPU_CONFIG, _INTERPRET_CONFIG
from twell.tolerances import REL_TOL, rel_error

#: (BM, BN, BK, stages, warps, programs per SM, warp-specialised).  Session 7 (H200,
#: bench_results/h200/triton_gemm_probe_session7.log, M=131072): 128 x 256 x 64 on 3 stages, 8 warps, one
#: per SM 4.975 ms (0.98x of cuBLAS), 128 x 128 on 4 stages 5.396, warp-specialised 5.013 / 5.350, one
#: program per tile 5.210 / 5.776.  Session 12 (_session12.log): 128 x 128 tiles two per SM, the mainloop
#: of a ping-pong schedule for the fused gate, 6.249-7.210 ms against 5.033 for 128 x 256 one per SM.
CONFIGS = [
    (128, 256, 64, 3, 8, 1, False),
    (128, 128, 64, 3, 4, 2, False),
    (128, 128, 64, 2, 4, 2, False),
    (128, 128, 64, 3, 8, 2, False),
    (128, 128, 64, 4, 8, 1, False),
]


@triton.jit
def _tma_gemm_kernel(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     GROUP_M: tl.constexpr, N_PROGRAMS: tl.constexpr, WS: tl.constexpr, DOT_FP32: tl.constexpr,
                     store=1):
    """c = a @ b^T, a [M, K], b [N, K], c [M, N] (fp32 accumulation, rounded to c's dtype); N_PROGRAMS
    programs loop over the output tiles (a persistent grid when it is the SM count, one tile each when it
    is the tile count).  ``store`` 0 (a runtime value, so the mainloop is still built) skips the stores:
    the mainloop's own time and energy (scripts/clock_probe.py)."""
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, N_PROGRAMS, warp_specialize=WS):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BK])
            b = b_desc.load([off_n, ki * BK])
            acc = dot_acc(a, b.T, acc, DOT_FP32)
        if store != 0:
            c_desc.store([off_m, off_n], round_to(acc, c_desc.dtype))


def tma_gemm(x: torch.Tensor, w: torch.Tensor, cfg: tuple, out: torch.Tensor, store: bool = True) -> torch.Tensor:
    """``x @ w^T`` into ``out`` through :func:`_tma_gemm_kernel` with configuration ``cfg`` (``store`` False:
    the GEMM without writing ``out``)."""
    bm, bn, bk, stages, warps, per_sm, ws = cfg
    m, k = x.shape
    n = w.shape[0]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    programs = min(tiles, per_sm * sm_count(x.device.index)) if per_sm and x.is_cuda else tiles
    a_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    _tma_gemm_kernel[(programs,)](a_desc, b_desc, c_desc, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=8,
                                  N_PROGRAMS=programs, WS=ws, DOT_FP32=interpreting(), store=int(store),
                                  num_stages=stages, num_warps=warps)
    return out


def fused_gate_mainloop(x: torch.Tensor, w: torch.Tensor, tile: int) -> Callable[[bool], torch.Tensor]:
    """The fused hot/cold gate's mainloop as a plain persistent TMA GEMM of ``x @ w^T``: its BM x (2 * tile) x
    BK tiles, stages and warps (``hot_cold_gate_kernel``'s configuration), one program per SM; the returned
    ``run(store)`` writes an output allocated once (rows padded to 16 bytes for TMA) or, ``store`` False, skips
    the stores (the mainloop's own time and joules)."""
    bm, bk, stages, warps = _INTERPRET_CONFIG if interpreting() else _GPU_CONFIG
    cfg = (bm, 2 * tile, bk, stages, warps, 1, False)
    n = w.shape[0]
    out = torch.empty((x.shape[0], -(-n // 8) * 8), dtype=x.dtype, device=x.device)[:, :n]
    return lambda store: tma_gemm(x, w, cfg, out, store=store)


def main() -> None:
    dev, tiny = probe_args(__doc__)
    # the split's GEMM at l0 = 28: [Wg (5632 rows, hot first); Wu[hot] (576)]
    k, n, ms, configs, rep_ms = 2048, 5632 + 576, (16384, 131072), CONFIGS, 100.0
    if tiny:
        configs = [(32, 32, 16, 1, 4, 1, False), (32, 64, 16, 1, 4, 0, False)]
        k, n, ms, rep_ms = 64, 200, (96,), 1.0
    gen = torch.Generator(device=dev).manual_seed(0)
    for m in ms:
        x = torch.randn((m, k), generator=gen, device=dev).to(torch.bfloat16)
        w = (torch.randn((n, k), generator=gen, device=dev) / k**0.5).to(torch.bfloat16)
        want = F.linear(x, w)
        t_cublas = time_ms(lambda x=x, w=w: F.linear(x, w), device=dev, rep_ms=rep_ms)
        tflops = 2 * m * n * k / (t_cublas * 1e-3) / 1e12
        parts = [f"cuBLAS {t_cublas:.3f} ms ({tflops:.0f} TFLOP/s)"]
        out = torch.empty((m, n), dtype=torch.bfloat16, device=dev)
        for cfg in configs:
            try:
                got = tma_gemm(x, w, cfg, out).clone()
                t = time_ms(lambda cfg=cfg, x=x, w=w: tma_gemm(x, w, cfg, out), device=dev, rep_ms=rep_ms)
                ok = rel_error(got, want) <= REL_TOL[torch.bfloat16]
                parts.append(f"{cfg}: {t:.3f} ms ({t_cublas / t:.2f}x of cuBLAS, ok {ok})")
            except Exception as exc:  # noqa: BLE001 - a configuration that does not build: report, go on
                parts.append(f"{cfg}: FAILED {type(exc).__name__}: {str(exc)[:100]}")
        print(f"M={m} N={n} K={k} | " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
