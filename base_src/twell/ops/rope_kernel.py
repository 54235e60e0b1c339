"""Triton kernel: rotary position embedding of one query or key tensor in one pass.

Why: transformers' ``apply_rotary_pos_emb`` runs, per tensor, a slice-negate, a concatenation, two
multiplications and an addition, each its own kernel over the whole [B, H, S, D] tensor.  In the 1.5B
benchmark forward (H200, 64 x 2048 tokens, bench_results/h200/model/model_1.5b_forward_profile_session10.log)
those kernels took ~215 of the ~720 ms of the sparse model's forward (the binary-op kernels 84.6 ms, the
concatenations 62.0, the additions 49.3, the negations 18.0), as much in the dense model: a cost both share
that dilutes the sparse FFN's gain.  One pass reads x and cos / sin once and writes the result once.

Forward numerics are PyTorch's, bit for bit: ``round(round(x * cos) + round(rotate_half(x) * sin))`` in the
tensor's dtype (fp32 products and sums, each rounded to nearest even), with the compiler's fused
multiply-add off so that float32 matches too.  The backward computes ``g * cos + R^T(g * sin)`` in float32
and rounds once (autograd of the eager formula rounds after each operation: the two differ by a rounding).

One program per token (b, s): all heads of that token, the two halves of the head dimension loaded apart.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import next_pow2
from .gate_kernel import round_to


@triton.jit
def _rope_kernel(
    x_ptr, out_ptr, cos_ptr, sin_ptr, S, H,
    sxb, sxh, sxs, sob, soh, sos, scb, scs,
    HALF: tl.constexpr, H_PAD: tl.constexpr, HALF_PAD: tl.constexpr, BACKWARD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S
    s = tok % S
    heads = tl.arange(0, H_PAD)
    dims = tl.arange(0, HALF_PAD)
    d_ok = dims < HALF
    ok = (heads < H)[:, None] & d_ok[None, :]
    dtype = out_ptr.dtype.element_ty
    c = b * scb + s * scs + dims
    cos_lo = tl.load(cos_ptr + c, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    cos_hi = tl.load(cos_ptr + c + HALF, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    sin_lo = tl.load(sin_ptr + c, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    sin_hi = tl.load(sin_ptr + c + HALF, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    xo = b * sxb + s * sxs + heads.to(tl.int64)[:, None] * sxh + dims[None, :]
    lo = tl.load(x_ptr + xo, mask=ok, other=0.0).to(tl.float32)
    hi = tl.load(x_ptr + xo + HALF, mask=ok, other=0.0).to(tl.float32)
    if BACKWARD:  # d/dx of x * cos + rotate_half(x) * sin: g * cos + cat(g2 * sin2, -g1 * sin1)
        out_lo = lo * cos_lo + hi * sin_hi
        out_hi = hi * cos_hi - lo * sin_lo
    else:  # rotate_half(x) = cat(-x2, x1); every product and the sum rounded as PyTorch's kernels do
        out_lo = round_to(lo * cos_lo, dtype).to(tl.float32) + round_to(-(hi * sin_lo), dtype).to(tl.float32)
        out_hi = round_to(hi * cos_hi, dtype).to(tl.float32) + round_to(lo * sin_hi, dtype).to(tl.float32)
    oo = b * sob + s * sos + heads.to(tl.int64)[:, None] * soh + dims[None, :]
    tl.store(out_ptr + oo, round_to(out_lo, dtype), mask=ok)
    tl.store(out_ptr + oo + HALF, round_to(out_hi, dtype), mask=ok)


def launch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, unsqueeze_dim: int,
                backward: bool = False) -> torch.Tensor:
    """The rotary embedding of ``x`` (``backward``: the gradient for output gradient ``x``) into a new tensor of
    ``x``'s shape and strides.  Validated inputs: x 4-D with a contiguous last dimension D (even), heads at
    dimension ``unsqueeze_dim`` (1: [B, H, S, D], 2: [B, S, H, D]); cos and sin [B or 1, S, D] of x's dtype with a
    contiguous last dimension."""
    if unsqueeze_dim == 1:
        bsz, heads, seq, dim = x.shape
        sxb, sxh, sxs = x.stride(0), x.stride(1), x.stride(2)
    else:
        bsz, seq, heads, dim = x.shape
        sxb, sxs, sxh = x.stride(0), x.stride(1), x.stride(2)
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    sob, soh, sos = (out.stride(0), out.stride(1), out.stride(2)) if unsqueeze_dim == 1 else \
        (out.stride(0), out.stride(2), out.stride(1))
    if sin.stride() != cos.stride():  # one set of strides serves both
        cos, sin = cos.contiguous(), sin.contiguous()
    scb = cos.stride(0) if cos.shape[0] > 1 else 0
    half = dim // 2
    _rope_kernel[(bsz * seq,)](
        x, out, cos, sin, seq, heads, sxb, sxh, sxs, sob, soh, sos, scb, cos.stride(1),
        HALF=half, H_PAD=next_pow2(heads), HALF_PAD=next_pow2(half), BACKWARD=backward,
        num_warps=4, enable_fp_fusion=False,
    )
    return out
