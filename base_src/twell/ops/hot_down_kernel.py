"""The hot/cold split's hot down GEMM, ``init = h_hot @ Wd_hot^T`` accumulated and written in fp32, in Triton.

The split's tail reads this fp32 partial sum back in the cold row-gather kernel, which adds the cold pairs
and rounds the output once.  The GEMM is small in FLOPs and large in bytes: at d=2048 and 256 hot units its
K is 256 (four 64-wide steps) and it writes 4 bytes per output element, 134 MB at M=16384 and 1.07 GB at
M=131072, so its floor is the write.  cuBLAS (``torch.mm(..., out_dtype=torch.float32)``) took 0.073 ms at
M=16384 back to back on the H200 (bench_results/h200/clock_probe_session15.log) against ~0.03-0.04 ms for
writing 134 MB.

Here one program per [BM, BN] output tile: its K steps through TMA loads of h_hot and of Wd_hot^T ([H, d],
d contiguous, read as [BK, BN] blocks), one tensor-core dot per step, and the fp32 tile written either
through shared memory by one TMA store or straight from registers (``TMA_STORE``).  TMA pads loads past
the edges with zeros and clips stores there, so any M and H take the same code.

Prediction (session 21, before any GPU run; H200, d=2048, H=256): 0.045-0.05 ms at M=16384 against cuBLAS's
0.06-0.07, ~0.35 ms at M=131072 against ~0.5: the op -2 to -3 %.

Measured (H200, session 21, bench_results/h200/hot_down_probe_session21.log; interleaved call by call, an L2
flush before each call): slower than cuBLAS at every point.  M=16384, H=256: cuBLAS 0.0504 ms (not the 0.073
of session 15's back-to-back figure the prediction started from), the write floor (an fp32 ``zero_`` of the
output) 0.0326, cuBLAS with a bf16 output 0.0377, the fastest configuration here 0.0607 (128 x 128 x 64, 3
stages, 8 warps, stores from registers) and the TMA store 0.0826; H=1152 0.1349 vs 0.1238.  M=131072, H=256:
0.4355 vs 0.3249 (floor 0.2319); H=1152 0.9839 vs 0.9119.  The op at M=16384, l0=28 took 0.8289 ms with it
against 0.8157 / 0.8158 without; at 131072 6.3347 against 6.2193 / 6.2104; same bits.  The miss: cuBLAS's
GEMM already runs at 1.5x its write floor, so at most ~0.017 ms (2 % of the op) was there to take, and these
one-tile-per-program builds (no persistent loop, no store overlapped with the next tile's loads) reach only
~1.9x.  Kept off (``hot_cold.HOT_DOWN_TRITON``), exact and tested, as the measured record.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._runtime import interpreting, tma_capable
from .gate_kernel import dot_acc, tile_coords

#: ``(BM, BN, BK, stages, warps, TMA store)`` on the GPU, and the interpreter's small tiles.  The GPU's was
#: fixed before the probe; the probe's fastest, (128, 128, 64, 3, 8, False), was 2 % faster than it at H=256
#: and 5-8 % at H=1152, and still slower than cuBLAS (module docstring).  The flag is off, so this one stays:
#: it is the one the GPU tests ran.
_GPU_CONFIG = (128, 128, 64, 2, 4, False)
_INTERPRET_CONFIG = (16, 32, 16, 1, 4, False)


@triton.jit
def _hot_down_kernel(h_desc, w_desc, c_desc, c_ptr, M, N, K, stride_cm, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, GROUP_M: tl.constexpr, TMA_STORE: tl.constexpr, DOT_FP32: tl.constexpr):
    """c [M, N] fp32 = h [M, K] @ w [K, N], one program per output tile (grouped order)."""
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    pid_m, pid_n = tile_coords(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    off_m = pid_m * BM
    off_n = pid_n * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for ki in range(tl.cdiv(K, BK)):
        a = h_desc.load([off_m, ki * BK])
        b = w_desc.load([ki * BK, off_n])
        acc = dot_acc(a, b, acc, DOT_FP32)
    if TMA_STORE:
        c_desc.store([off_m, off_n], acc)
    else:
        rows = off_m + tl.arange(0, BM)
        cols = off_n + tl.arange(0, BN)
        ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
        tl.store(ptrs, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


def hot_down_supported(h_hot: torch.Tensor, w_down_hot_t: torch.Tensor) -> bool:
    """Whether :func:`launch_hot_down` takes these operands: fp16 / bf16 on a TMA-capable GPU (or under the
    interpreter), both contiguous, rows a multiple of 16 bytes (TMA's stride rule: H and d multiples of 8)."""
    if h_hot.dtype not in (torch.float16, torch.bfloat16) or w_down_hot_t.dtype != h_hot.dtype:
        return False
    if not (interpreting() or tma_capable(h_hot.device)):
        return False
    n_hot, d = w_down_hot_t.shape
    return (h_hot.is_contiguous() and w_down_hot_t.is_contiguous() and h_hot.shape[1] == n_hot
            and n_hot % 8 == 0 and d % 8 == 0)


def launch_hot_down(h_hot: torch.Tensor, w_down_hot_t: torch.Tensor, config: tuple | None = None) -> torch.Tensor:
    """``h_hot [M, H] @ w_down_hot_t [H, d]`` as a new fp32 [M, d] tensor (fp32 accumulation on tensor cores;
    the operands' dtype, fp32 products under the interpreter).  Operands as :func:`hot_down_supported`
    accepts; ``config`` (``(BM, BN, BK, stages, warps, TMA store)``) overrides the shipped one (probes)."""
    m, n_hot = h_hot.shape
    d = w_down_hot_t.shape[1]
    out = torch.empty((m, d), dtype=torch.float32, device=h_hot.device)
    if m == 0:
        return out
    if n_hot == 0:
        return out.zero_()
    bm, bn, bk, stages, warps, tma_store = config or (_INTERPRET_CONFIG if interpreting() else _GPU_CONFIG)
    # TMA wants 16-byte aligned bases: a view that starts mid-row of a larger block is copied (never the
    # case for the split's own tensors, which are whole allocations).
    h_hot, w_down_hot_t = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (h_hot, w_down_hot_t))
    h_desc = TensorDescriptor.from_tensor(h_hot, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w_down_hot_t, [bk, bn])
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn]) if tma_store else None
    grid = (triton.cdiv(m, bm) * triton.cdiv(d, bn),)
    _hot_down_kernel[grid](h_desc, w_desc, c_desc, out, m, d, n_hot, out.stride(0), BM=bm, BN=bn, BK=bk, GROUP_M=8,
                           TMA_STORE=tma_store, DOT_FP32=interpreting(), num_stages=stages, num_warps=warps)
    return out
