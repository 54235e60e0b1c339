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

#: Where the dense module of the same dtype misses :data:`REL_TOL` itself, a sparse output passes if its error is at
#: most this factor of the dense module's on the same tokens.  A bf16 FFN on one or a few tokens sums few products per
#: output, so its own error spreads: at 896 x 4864 and 0.25 % density (l0 ~12) 4.8 % of single tokens had a dense bf16
#: error over 5e-3 (median 2.9e-3, largest 7.6e-3; 2000 tokens on the CPU, session 31), and the sparse path, which
#: rounds as the dense module does, matched it token by token (error ratio 1.000-1.001 over 200 single tokens).  The
#: H200 tuning run that found this (session 31, tune_896x4864_b_call2_session31.log) read 6.0e-3 at one token.  1.1
#: leaves room for the kernels' other summation order and no more.
DENSE_ERROR_FACTOR = 1.1
#: The same for a whole model (``twell bench model``: the forward's output and the training step's gradients), whose
#: layers compound each other's roundings.
MODEL_DENSE_ERROR_FACTOR = 1.5

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


def within_tolerance(err: float, dtype: torch.dtype, dense_err: float | None = None,
                     factor: float = DENSE_ERROR_FACTOR, table: dict[torch.dtype, float] | None = None) -> bool:
    """True iff a relative error ``err`` passes for ``dtype``: at most ``table[dtype]`` (default :data:`REL_TOL`;
    :data:`REL_TOL_GRAD` for gradients), or at most ``factor`` times ``dense_err``, the dense module's own error on the
    same tokens and reference (None: not measured)."""
    table = REL_TOL if table is None else table
    if dtype not in table:
        raise ValueError(f"no tolerance for dtype {dtype}; accepted: {', '.join(str(t) for t in table)}")
    if err <= table[dtype]:
        return True
    return dense_err is not None and err <= factor * dense_err
