"""Rotary position embedding as the Llama-family models of transformers apply it: the twin of
:mod:`twell.ops.rope_kernel`."""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(-x2, x1)`` over the last dimension's halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with ``cos`` / ``sin`` [B, S, D] unsqueezed at ``unsqueeze_dim`` (1 for
    x [B, H, S, D], 2 for x [B, S, H, D]), each operation rounded to the dtype as PyTorch does."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (x * cos) + (rotate_half(x) * sin)


def rotary_embedding_backward(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                              unsqueeze_dim: int = 1) -> torch.Tensor:
    """The gradient of :func:`rotary_embedding` with respect to ``x`` for output gradient ``grad``:
    ``grad * cos + R^T(grad * sin)`` with ``R^T(y) = cat(y2, -y1)``, in float32, rounded once."""
    cos, sin = cos.unsqueeze(unsqueeze_dim).float(), sin.unsqueeze(unsqueeze_dim).float()
    g = grad.float()
    half = g.shape[-1] // 2
    gs = g * sin
    return (g * cos + torch.cat((gs[..., half:], -gs[..., :half]), dim=-1)).to(grad.dtype)
