"""Mean active units per token of a dense activation, in one read of it: the dense paths' l0.

The dense training and inference paths of :class:`twell.nn.SparseGatedMLP` measure l0 from the gate
activation ``a = relu(g) [M, F]`` every call.  ``torch.count_nonzero`` did it in three kernels on an
H200 at M=16384, F=5632 (bench_results/h200/trainprof_session4.log): a compare to bool (0.065 ms), a
bool -> int64 copy of all M F elements (0.282 ms, 0.74 GB written) and an int64 reduction (0.180 ms),
0.53 ms in all, 10 % of the 5.4 ms dense forward+backward, which is why the layer's dense path read
0.90-0.92x of plain dense autograd in ``twell bench train-ffn``.  Here one Triton kernel reads ``a``
once (184 MB, ~0.05 ms at the H200's ~4 TB/s) in a single launch: each program counts its blocks
(grid-stride, at most :data:`_PROGRAMS_PER_SM` programs per SM), adds its count to an int64 total with
one atomic and takes a ticket; the program with the last ticket divides the total by the token count
and writes the float32 result.  Integer atomics: exact and independent of the programs' order, so the
result is deterministic.  The first version wrote one count per block and finished with torch ops
(sum, two casts, a division): five host-side launches around the kernel, and on the H200's host a
dense training step of a 4096-token layer issues its ~30 launches in 0.72-0.80 ms against a 1.5 ms GPU
step, so the l0 count's launches showed as 4-5 % of the step (``dense + l0`` 0.95-0.96x of ``dense``
in bench_results/h200/train_switch_overhead_session5.log).  Now: a zeroed 2-element workspace
(one memset), the output scalar and the kernel.  A NaN counts as active (``NaN != 0``), ``-0.0`` as
inactive, as in ``count_nonzero``.

Elsewhere (the CPU without the interpreter, non-contiguous inputs, a graph traced by torch.compile,
where inductor fuses the expression itself) the PyTorch expression ``(a != 0).sum()`` runs.
"""

from __future__ import annotations

import functools

import torch

from ._runtime import cdiv, kernels_run_on, sm_count, triton_available

__all__ = ["mean_active_per_token"]

#: Elements per block: 8192 bf16 = 16 KB read per loop step.
_BLOCK = 8192
#: Programs per SM of the grid-stride launch (caps the atomics on the shared total at ~4 x 132 x 2).
_PROGRAMS_PER_SM = 4
#: Programs when the device reports no SM count (the interpreter).
_DEFAULT_PROGRAMS = 4

if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _count_active_kernel(a_ptr, work_ptr, out_ptr, n, tokens, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        count = tl.zeros((), dtype=tl.int64)
        for start in tl.range(pid.to(tl.int64) * BLOCK, n, nprog.to(tl.int64) * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            v = tl.load(a_ptr + offs, mask=offs < n, other=0.0)
            count += tl.sum((v != 0).to(tl.int64), axis=0)
        tl.atomic_add(work_ptr, count)  # acq_rel: visible before this program's ticket below
        ticket = tl.atomic_add(work_ptr + 1, 1)
        if ticket == nprog - 1:  # every other program has added its count
            total = tl.atomic_add(work_ptr, 0)
            tl.store(out_ptr, (total.to(tl.float64) / tokens).to(tl.float32))


@functools.cache
def _programs_cap(device_index: int | None) -> int:
    if not torch.cuda.is_available():
        return _DEFAULT_PROGRAMS
    return _PROGRAMS_PER_SM * sm_count(device_index)


def _use_kernel(a: torch.Tensor) -> bool:
    return a.is_contiguous() and a.numel() > 0 and kernels_run_on(a.device)


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
            programs = min(cdiv(n, _BLOCK),
                           _programs_cap(a.device.index) if a.device.type == "cuda" else _DEFAULT_PROGRAMS)
            work = torch.zeros(2, dtype=torch.int64, device=a.device)
            out = torch.empty((), dtype=torch.float32, device=a.device)
            _count_active_kernel[(programs,)](a, work, out, n, tokens, BLOCK=_BLOCK)
            return out
        total = (a != 0).sum(dtype=torch.int64)
        return (total.to(torch.float64) / tokens).to(torch.float32)
