"""The decoder layer's residual add after the MLP, done by the MLP's last kernel: :func:`fuse_residual_adds`.

A Llama/Qwen2 decoder layer ends with ``hidden = residual + mlp(post_attention_layernorm(residual))``: one more
pass over three [tokens, hidden] tensors after the MLP has written its output (0.35 ms a layer at 131,072 tokens,
d=2048 in bf16 on the H200: 1.5 GB at ~4.3 TB/s).  The MLPs of this library take that residual
(``forward(x, residual=...)``) and add it in the kernel that writes their output: the hot/cold split's TwELL gather
as it stores each row (``twell.ops.hot_cold.FUSE_RESIDUAL``), the dense path in cuBLAS's epilogue
(``torch.addmm``; ``twell.nn.mlp.DENSE_RESIDUAL_ADDMM``).  :func:`fuse_residual_adds` makes each decoder layer hand
its residual to such an MLP; a layer whose MLP at call time is anything else (a transformers ``LlamaMLP``, say)
adds it itself, as before, so swapping MLPs in and out (``twell.models.apply`` / ``revert``) stays safe.

With the layer's post-attention norm a :class:`~twell.nn.FusedRMSNorm` (:func:`twell.nn.fuse_rms_norms`), on CUDA
and without autograd, the attention's residual add and that norm run as one kernel as well
(``twell.ops.add_norm_kernel``, :data:`FUSE_ADD_NORM`): the sum bit for bit, the norm within a rounding of
``F.rms_norm``'s.

What runs is the transformers layer's own sequence (input norm, attention, add, post-attention norm, MLP) with the
attention module called with the keyword arguments the layer received, whatever the installed transformers names
them (``cache`` or ``past_key_values``); only the last add moves.  Bits: the sparse path keeps those of
``residual + mlp(x)``; the dense path on CUDA rounds the sum once (one bf16 rounding from the unfused layer at
most); on the CPU the unfused ops run.  Like :func:`twell.nn.fuse_rms_norms` it is opt-in, and a benchmark applies
it to every variant alike (``twell bench model --fused-residual``).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from ..ops.add_norm_kernel import add_rms_norm, add_rms_norm_supported
from .mlp import DenseReluGatedMLP, SparseGatedMLP
from .norm import FusedRMSNorm

__all__ = ["fuse_residual_adds", "residual_adds_fused", "unfuse_residual_adds"]

#: Decoder layer classes whose forward is ``norm -> attention -> add -> norm -> mlp -> add`` (transformers 4.4x-5.x).
_LAYER_TYPES = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "MistralDecoderLayer")
_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_FLAG = "_twell_residual_fused"
#: In a fused layer on CUDA, inference, with a :class:`~twell.nn.FusedRMSNorm` after the attention
#: (``fuse_rms_norms``): the attention's residual add and that norm in one Triton pass
#: (``twell.ops.add_norm_kernel``; 0.668 ms eager for the pair at 131,072 tokens, d=2048 on the H200).
FUSE_ADD_NORM = True


def _fused_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The decoder layer's forward with the MLP's residual add inside the MLP (module docs)."""
    if args:
        raise TypeError(f"{type(self).__name__} with fused residual adds takes its arguments after hidden_states by "
                        f"keyword (as transformers' models pass them); got {len(args)} positional")
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states = self.self_attn(hidden_states=hidden_states, **kwargs)[0]
    norm = self.post_attention_layernorm
    if _add_norm_applies(norm, residual, hidden_states):
        residual, hidden_states = add_rms_norm(residual, hidden_states, norm.weight, norm.eps)
    else:
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = norm(hidden_states)
    mlp = self.mlp
    if isinstance(mlp, (SparseGatedMLP, DenseReluGatedMLP)):
        return mlp(hidden_states, residual=residual)
    return residual + mlp(hidden_states)


def _add_norm_applies(norm: nn.Module, residual: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether the attention's add and the post-attention norm run as one kernel (:data:`FUSE_ADD_NORM`)."""
    if not FUSE_ADD_NORM or not isinstance(norm, FusedRMSNorm) or not x.is_cuda or torch.compiler.is_compiling():
        return False  # (compiled, inductor fuses the pair itself)
    if torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or norm.weight.requires_grad):
        return False  # the kernel has no backward
    return x.device.type in norm.devices and add_rms_norm_supported(residual, x, norm.weight)


def _layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ in _LAYER_TYPES]


def fuse_residual_adds(model: nn.Module) -> int:
    """Make every Llama/Qwen2/Mistral decoder layer of ``model`` pass its post-attention residual to its MLP (module
    docs); returns how many layers changed (already fused ones are left as they are)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    changed = 0
    for layer in _layers(model):
        missing = [p for p in _PARTS if not isinstance(getattr(layer, p, None), nn.Module)]
        if missing:
            raise TypeError(f"{type(layer).__name__} has no {', '.join(missing)} submodule; fuse_residual_adds "
                            f"rewrites layers made of {', '.join(_PARTS)}")
        if getattr(layer, _FLAG, False):
            continue
        layer.forward = types.MethodType(_fused_forward, layer)
        setattr(layer, _FLAG, True)
        changed += 1
    return changed


def unfuse_residual_adds(model: nn.Module) -> int:
    """Undo :func:`fuse_residual_adds`: the layers' own forward again; returns how many layers changed."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    changed = 0
    for layer in _layers(model):
        if getattr(layer, _FLAG, False):
            del layer.forward
            delattr(layer, _FLAG)
            changed += 1
    return changed


def residual_adds_fused(model: nn.Module) -> int:
    """How many decoder layers of ``model`` run with :func:`fuse_residual_adds`."""
    return sum(bool(getattr(layer, _FLAG, False)) for layer in _layers(model))
