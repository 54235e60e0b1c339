"""The decoder layer's residual adds fused into the kernels around them: :func:`fuse_residual_adds`.

A Llama/Qwen2 decoder layer adds the attention's output to the residual stream, normalises the sum, runs the MLP and
adds its output to the stream again.  Each add is one more pass over three [tokens, hidden] tensors (1.5 GB at
131,072 tokens, d=2048 in bf16; ~0.36 ms each on the H200: 20.4 ms for a 1.5B forward's 56 in session 15's profile,
docs/performance.md).  In a fused layer:

* the MLPs of this library take the residual (``forward(x, residual=...)``): the hot/cold split's TwELL gather adds
  it as it stores each row (``twell.ops.hot_cold.FUSE_RESIDUAL``); their other paths, the dense one included, add
  it after, as the layer did (cuBLAS's epilogue, ``twell.nn.mlp.DENSE_RESIDUAL_ADDMM``, measured slower for the
  whole dense FFN: off).  A layer whose MLP at call time is anything else (a transformers ``LlamaMLP``, say) adds
  it itself, so swapping MLPs in and out (``twell.models.apply`` / ``revert``) stays safe;
* with the post-attention norm a :class:`~twell.nn.FusedRMSNorm` (:func:`twell.nn.fuse_rms_norms`), on CUDA and
  without autograd, the attention's add and that norm run as one Triton pass (``twell.ops.add_norm_kernel``,
  :data:`FUSE_ADD_NORM`).

What runs is the transformers layer's own sequence (input norm, attention, add, post-attention norm, MLP, add), the
attention called with the keyword arguments the layer received, whatever the installed transformers names them
(``cache`` or ``past_key_values``).  Bits: the adds keep those of ``residual + x`` in the dtype; the one-pass norm is
within a rounding of ``F.rms_norm``'s (so, like :func:`twell.nn.fuse_rms_norms`, the fusion is opt-in, and a
benchmark applies it to every variant alike: ``twell bench model --fused-residual``); on the CPU everything is the
unfused layer's, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..ops.add_norm_kernel import add_rms_norm, add_rms_norm_supported
from .mlp import DenseReluGatedMLP, SparseGatedMLP
from .norm import FusedRMSNorm

__all__ = ["fuse_residual_adds", "residual_adds_fused", "unfuse_residual_adds"]

#: Decoder layer classes whose forward is ``norm -> attention -> add -> norm -> mlp -> add`` and returns the hidden
#: states alone (transformers 5.x, what the ``hf`` extra requires; 4.x returned a tuple).
_LAYER_TYPES = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "MistralDecoderLayer")
_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_FLAG = "_twell_residual_fused"
#: In a fused layer on CUDA, inference, with a :class:`~twell.nn.FusedRMSNorm` after the attention
#: (``fuse_rms_norms``): the attention's residual add and that norm in one Triton pass
#: (``twell.ops.add_norm_kernel``; at 131,072 tokens, d=2048 on the H200 0.508 ms against 0.666 eager for the pair,
#: bench_results/h200/residual_probe_session24.log).
FUSE_ADD_NORM = True


def _fused_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The decoder layer's forward with its residual adds fused: the attention's with the post-attention norm where
    :func:`_add_norm_applies`, the MLP's inside the MLP where it takes one (module docs)."""
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


#: Where transformers defines the layer classes :data:`_LAYER_TYPES` names, so that a fused layer's class can be rebuilt
#: by name when a pickle is loaded in another process (module ``__getattr__`` below).
_LAYER_MODULES = {
    "LlamaDecoderLayer": "transformers.models.llama.modeling_llama",
    "Qwen2DecoderLayer": "transformers.models.qwen2.modeling_qwen2",
    "MistralDecoderLayer": "transformers.models.mistral.modeling_mistral",
}
#: The fused subclass of each decoder layer class fused so far.
_FUSED_CLASSES: dict[type, type] = {}


def _fused_class(base: type) -> type:
    """The subclass of ``base`` whose forward is :func:`_fused_forward`; a fused layer's ``__class__`` is swapped to
    it.  A subclass, not a per-layer bound method (which made each layer reference itself: a cycle that kept
    deleted models' weights alive until the garbage collector ran, +5.7 GB of peak memory in the 1.5B forward
    benchmark on the H200, session 24), nor a patched class forward (transformers 5.x wraps each layer class's
    forward for gradient checkpointing when the class is created, and checkpoints only when that wrapper is the
    class's forward: a subclass gets its own).  It keeps ``base``'s ``__name__`` (what accelerate's
    ``_no_split_modules`` and this module match on); its ``__qualname__`` names it here, for pickle."""
    cls = _FUSED_CLASSES.get(base)
    if cls is None:
        qualname = f"Fused{base.__name__}"
        if qualname in globals() or _LAYER_MODULES.get(base.__name__) != base.__module__:
            qualname = f"{qualname}_{len(_FUSED_CLASSES)}"  # another class of that name: no rebuild by name
        cls = type(base.__name__, (base,), {"forward": _fused_forward, _FLAG: True, "__module__": __name__})
        cls.__qualname__ = qualname
        globals()[qualname] = cls
        _FUSED_CLASSES[base] = cls
    return cls


def __getattr__(name: str) -> type:
    """``FusedLlamaDecoderLayer`` and its kin built on first use (a pickle of a fused model loaded here)."""
    base_name = name.removeprefix("Fused")
    if name.startswith("Fused") and base_name in _LAYER_MODULES:
        import importlib

        return _fused_class(getattr(importlib.import_module(_LAYER_MODULES[base_name]), base_name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        layer.__class__ = _fused_class(type(layer))
        changed += 1
    return changed


def unfuse_residual_adds(model: nn.Module) -> int:
    """Undo :func:`fuse_residual_adds`: the layers' own class again; returns how many layers changed."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    changed = 0
    for layer in _layers(model):
        if getattr(layer, _FLAG, False):
            layer.__class__ = type(layer).__mro__[1]
            changed += 1
    return changed


def residual_adds_fused(model: nn.Module) -> int:
    """How many decoder layers of ``model`` run with :func:`fuse_residual_adds`."""
    return sum(bool(getattr(layer, _FLAG, False)) for layer in _layers(model))
