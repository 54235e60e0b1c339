"""Rotary position embedding in one Triton pass per tensor, as a drop-in for transformers'
``apply_rotary_pos_emb`` in the Llama and Qwen2 modelling modules.

:func:`apply_rotary_pos_emb` has transformers' signature and, forward, its results bit for bit
(:mod:`twell.ops.rope_kernel`); inputs the kernel does not take (cos / sin of another dtype than q, a
head dimension that is odd or not contiguous, CPU tensors outside Triton's interpreter, tracing by
``torch.compile``, cos / sin that need a gradient) go through transformers' formula unchanged.
:func:`fuse_rotary` puts it in place of the modules' own function: transformers' attention layers look the
function up in their module's globals at every call, so the switch is process-wide (every Llama / Qwen2
model of the process) until :func:`unfuse_rotary`.  Why and what it saves: see the kernel's module.
"""

from __future__ import annotations

import importlib

import torch

from ..ops._runtime import interpreting, triton_available
from ..reference import rope as ref

__all__ = ["apply_rotary_pos_emb", "fuse_rotary", "rotary_embedding", "rotary_fused", "unfuse_rotary"]

#: transformers' modelling modules whose ``apply_rotary_pos_emb`` :func:`fuse_rotary` replaces.
MODULES = ("transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_originals: dict[str, object] = {}


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int) -> torch.Tensor:
        from ..ops.rope_kernel import launch_rope

        ctx.save_for_backward(cos, sin)
        ctx.unsqueeze_dim = unsqueeze_dim
        return launch_rope(x, cos, sin, unsqueeze_dim=unsqueeze_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        from ..ops.rope_kernel import launch_rope

        cos, sin = ctx.saved_tensors
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        return launch_rope(grad, cos, sin, unsqueeze_dim=ctx.unsqueeze_dim, backward=True), None, None, None


def _kernel_takes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int) -> bool:
    """Whether the fused kernel computes ``x``'s embedding (else transformers' formula does)."""
    if not (triton_available() and (x.is_cuda or interpreting())) or torch.compiler.is_compiling():
        return False
    if unsqueeze_dim not in (1, 2) or x.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
        return False
    bsz, seq = x.shape[0], x.shape[3 - unsqueeze_dim]
    dim = x.shape[-1]
    return (x.dtype in _DTYPES and cos.dtype == x.dtype and sin.dtype == x.dtype and dim % 2 == 0
            and cos.shape[0] in (1, bsz) and tuple(cos.shape[1:]) == (seq, dim) and x.stride(-1) == 1
            and cos.stride(-1) == 1 and sin.stride(-1) == 1 and cos.device == x.device and sin.device == x.device
            and not cos.requires_grad and not sin.requires_grad)


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for x [B, H, S, D] (``unsqueeze_dim`` 1) or [B, S, H, D] (2) and cos, sin
    [B, S, D]: the fused kernel where it takes the inputs (differentiable in x), else the eager formula."""
    if not _kernel_takes(x, cos, sin, unsqueeze_dim):
        return ref.rotary_embedding(x, cos, sin, unsqueeze_dim)
    if x.requires_grad and torch.is_grad_enabled():
        return _Rotary.apply(x, cos, sin, unsqueeze_dim)
    from ..ops.rope_kernel import launch_rope

    return launch_rope(x, cos, sin, unsqueeze_dim=unsqueeze_dim)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``, one fused pass per tensor."""
    return rotary_embedding(q, cos, sin, unsqueeze_dim), rotary_embedding(k, cos, sin, unsqueeze_dim)


def fuse_rotary() -> list[str]:
    """Replace ``apply_rotary_pos_emb`` in transformers' Llama and Qwen2 modules by :func:`apply_rotary_pos_emb`
    (process-wide; idempotent); returns the modules changed."""
    changed = []
    for name in MODULES:
        module = importlib.import_module(name)
        if module.apply_rotary_pos_emb is not apply_rotary_pos_emb:
            _originals[name] = module.apply_rotary_pos_emb
            module.apply_rotary_pos_emb = apply_rotary_pos_emb
            changed.append(name)
    return changed


def rotary_fused() -> bool:
    """Whether :func:`fuse_rotary` is in place (in every module of :data:`MODULES`)."""
    return all(importlib.import_module(name).apply_rotary_pos_emb is apply_rotary_pos_emb for name in MODULES)


def unfuse_rotary() -> list[str]:
    """Undo :func:`fuse_rotary`; returns the modules restored."""
    restored = []
    for name, original in list(_originals.items()):
        module = importlib.import_module(name)
        if module.apply_rotary_pos_emb is apply_rotary_pos_emb:
            module.apply_rotary_pos_emb = original
            restored.append(name)
        del _originals[name]
    return restored
