"""Mean active units per token of a dense activation, in one read of it: the dense paths' l0.

The dense training and inference paths of :class:`twell.nn.SparseGatedMLP` measure l0 from the gate
activation ``a = relu(g) [M, F]`` every call.  ``torch.count_nonzero`` did it in three kernels on an
H200 at M=16384, F=5632 (bench_results/h200/trainprof_session4.log): a compare to bool (0.065 ms), a
bool -> int64 copy of all M F elements (0.282 ms, 0.74 GB written) and an int64 reduction (0.180 ms),
0.53 ms in all, 10 % of the 5.4 ms dense forward+backward, which is why the layer's dense path read
0.90-0.92x of plain dense autograd in ``twell bench train-ffn``.  Here one Triton kernel reads ``a``
once (184 MB, ~0.05 ms at the H200's ~4 TB/s) and writes one int32 count per block of
:data:`_BLOCK` elements; a torch sum of those counts (int64) finishes it.  Integer sums: exact and
deterministic.  A NaN counts as active (``NaN != 0``), ``-0.0`` as inactive, as in ``count_nonzero``.

Elsewhere (the CPU without the interpreter, non-contiguous inputs, a graph traced by torch.compile,
where inductor fuses the expression itself) the PyTorch expression ``(a != 0).sum()`` runs.
"""

from __future__ import annotations

import torch

from ._runtime import interpreting, triton_available

__all__ = ["mean_active_per_token"]

#: Elements per program: 8192 bf16 = 16 KB read per program, 11,264 programs at M=16384, F=5632.
_BLOCK = 8192

if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _count_active_kernel(a_ptr, counts_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(a_ptr + offs, mask=offs < n, other=0.0)
        tl.store(counts_ptr + pid, tl.sum((v != 0).to(tl.int32), axis=0))


def _use_kernel(a: torch.Tensor) -> bool:
    if not triton_available() or not a.is_contiguous() or a.numel() == 0:
        return False
    if torch.compiler.is_compiling():
        return False
    return a.device.type == "cuda" or (interpreting() and a.device.type == "cpu")


def mean_active_per_token(a: torch.Tensor) -> torch.Tensor:
    """``count(a != 0) / tokens`` as a float32 scalar on ``a``'s device, ``tokens = numel / a.shape[-1]``
    (0 for an empty ``a``); no gradient, no host synchronisation."""
    if not isinstance(a, torch.Tensor) or a.dim() == 0:
        raise TypeError(f"a must be a tensor [..., F] with at least one dimension, got {type(a).__name__}"
                        + (" of 0 dimensions" if isinstance(a, torch.Tensor) else ""))
    tokens = max(1, a.numel() // max(1, a.shape[-1]))
    with torch.no_grad():
        if _use_kernel(a):
            n = a.numel()
            grid = triton.cdiv(n, _BLOCK)
            counts = torch.empty(grid, dtype=torch.int32, device=a.device)
            _count_active_kernel[(grid,)](a, counts, n, BLOCK=_BLOCK)
            total = counts.sum(dtype=torch.int64)
        else:
            total = (a != 0).sum(dtype=torch.int64)
        return (total.to(torch.float64) / tokens).to(torch.float32)
