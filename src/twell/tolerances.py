"""Every numerical tolerance of the project, in one place.

Relative errors are ``||out - ref|| / ||ref||`` (Frobenius norms) against a float64 (or float32 on
the GPU) reference of the same mathematical function.  The bf16 figure follows from its 8-bit
mantissa: a unit roundoff of 2**-8 = 3.9e-3 per rounding, several roundings per output, but errors
of independent roundings average out in the norm; bf16 matmuls on random data land between 1e-3 and
4e-3 in practice, so 5e-3 is the acceptance bar that issue 3 sets for the whole FFN.
"""

from __future__ import annotations

import torch

#: Relative Frobenius error allowed for a whole FFN output / gradient, by compute dtype.
REL_TOL: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    # Triton's fp32 dot uses tf32 on tensor cores unless told otherwise (~3e-4 on random data).
    torch.float16: 2e-3,
    torch.bfloat16: 5e-3,
}

#: fp32 kernels that use tf32 tensor-core dots (GPU only) are checked against this.
REL_TOL_TF32 = 2e-3

#: Gradients accumulate more roundings than the forward (sums over tokens); bf16 bar for them.
REL_TOL_GRAD: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 1e-2,
}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere in ``out`` that is not in ``ref`` gives inf."""
    o = out.detach().to(torch.float64).cpu()
    r = ref.detach().to(torch.float64).cpu()
    if o.shape != r.shape:
        raise ValueError(f"shape mismatch: {tuple(o.shape)} vs {tuple(r.shape)}")
    if bool((torch.isnan(o) != torch.isnan(r)).any()):
        return float("inf")
    finite = ~torch.isnan(r)
    o, r = o[finite], r[finite]
    denom = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / denom
