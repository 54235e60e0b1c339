"""The query, key and value projections of an attention layer as one GEMM, for transformers' Llama / Qwen2 layers.

Why: transformers' attention calls ``q_proj``, ``k_proj`` and ``v_proj`` on the same hidden states one after the
other; one GEMM over the three weights stacked reads the input once and runs one larger kernel.  On the H200 at
131,072 tokens and d=2048 (1.5B shapes) the three took 5.143 ms a layer against 4.903 ms for one of N=6144
(bench_results/h200/attention_probe_session15.log): 0.24 ms a layer, the same in a model with a dense or a sparse
FFN, so it raises the whole-model ratio the sparse FFN gives without touching the FFN.

How: :func:`fuse_qkv` gives the three ``nn.Linear`` modules of each attention layer a forward of their own (an
instance attribute: the modules, their parameters and ``state_dict`` keys stay as they are).  The first of the
three called on a tensor computes all three outputs in one ``F.linear`` over the stacked weights (and biases,
Qwen2's included) and keeps the other two for their own call on that same tensor (same object, same version
counter); any other call, and every call under ``torch.compile`` tracing, runs the module's own linear (a lone
call leaves the other two outputs held until the layer's next projection call).  With
grad enabled the stacked weight is concatenated on each call (so gradients reach the three parameters); without
it, it is cached and rebuilt when a weight changes (storage or version counter), at the cost of one copy of the
three weights per layer (25 MB at the 1.5B shapes in bf16).

Numerics: one GEMM of N = 3 d instead of three of N = d can take other cuBLAS kernels, so outputs may differ from
the unfused ones by a rounding of the dtype; like :func:`twell.nn.fuse_rms_norms` it is opt-in, and a converted
model is compared with itself (dense and sparse FFN alike).

Measured (H200, session 22, the 1.5B forward at 64 x 2048 tokens, ``twell bench model --fused-qkv``; bench_results/
h200/model_forward_inproc_dense_rows{,_qkv}_session22.json): the dense-FFN forward 693.3 -> 687.1 ms (predicted -6.7
ms), the sparse one 514.2 -> 510.2 ms, so the sparse/dense ratio stayed at 1.347-1.348x; peak memory +1.5 GB (the
one [M, 3d] output lives while any of its q/k/v views does, and 0.7 GB of stacked weights).  Opt-in.
"""

from __future__ import annotations

import copy
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["fuse_qkv", "qkv_fused", "unfuse_qkv"]

_NAMES = ("q_proj", "k_proj", "v_proj")


def _version(t: torch.Tensor) -> int:
    """``t``'s version counter; -1 for an inference tensor, which has none (it is not changed in place outside
    inference mode, and transformers' attention does not change its input between the three projections)."""
    return -1 if t.is_inference() else t._version


class _QKVGroup:
    """The shared state of one attention layer's three projections."""

    def __init__(self, linears: tuple[nn.Linear, nn.Linear, nn.Linear]) -> None:
        self.linears = linears
        self._w: torch.Tensor | None = None
        self._b: torch.Tensor | None = None
        self._w_key: Any = None
        self._x: torch.Tensor | None = None  # the input whose outputs are held
        self._x_version = -1
        self._held: dict[int, torch.Tensor] = {}

    def __deepcopy__(self, memo: dict) -> _QKVGroup:
        """A copy over the copied linears, without the cached stacked weight or held outputs (a non-leaf tensor
        held there would make ``copy.deepcopy`` of the model fail)."""
        new = _QKVGroup.__new__(_QKVGroup)
        memo[id(self)] = new  # before the linears, whose own copies refer back to this group
        _QKVGroup.__init__(new, tuple(copy.deepcopy(lin, memo) for lin in self.linears))  # type: ignore[arg-type]
        return new

    def __getstate__(self) -> dict:
        return {"linears": self.linears}

    def __setstate__(self, state: dict) -> None:
        _QKVGroup.__init__(self, state["linears"])

    def _key(self) -> tuple:
        return tuple((lin.weight.data_ptr(), _version(lin.weight), lin.weight.dtype, lin.weight.device) +
                     ((lin.bias.data_ptr(), _version(lin.bias)) if lin.bias is not None else ())
                     for lin in self.linears)

    def _stacked(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stacked weight [sum of N, d] and bias (zeros for a projection without one; None if none has)."""
        lins = self.linears
        has_bias = any(lin.bias is not None for lin in lins)

        def stack() -> tuple[torch.Tensor, torch.Tensor | None]:
            w = torch.cat([lin.weight for lin in lins], 0)
            b = None
            if has_bias:
                b = torch.cat([lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features)
                               for lin in lins], 0)
            return w, b

        if torch.is_grad_enabled():
            return stack()
        key = self._key()
        if key != self._w_key:
            with torch.no_grad(), torch.inference_mode(False):
                self._w, self._b = stack()
            self._w_key = key
        return self._w, self._b  # type: ignore[return-value]

    def project(self, which: int, x: torch.Tensor) -> torch.Tensor:
        lin = self.linears[which]
        if torch.compiler.is_compiling():
            return F.linear(x, lin.weight, lin.bias)
        if self._x is x and self._x_version == _version(x) and which in self._held:
            out = self._held.pop(which)
            if not self._held:
                self._x = None
            return out
        w, b = self._stacked()
        y = F.linear(x, w, b)
        outs = y.split([lin_.out_features for lin_ in self.linears], dim=-1)
        self._held = {i: o for i, o in enumerate(outs) if i != which}
        self._x, self._x_version = x, _version(x)
        return outs[which]


def _attention_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules()
            if all(isinstance(getattr(m, n, None), nn.Linear) for n in _NAMES)]


def fuse_qkv(model: nn.Module) -> int:
    """Give every attention layer of ``model`` (a module with ``q_proj``, ``k_proj`` and ``v_proj`` linears over
    the same input width) the one-GEMM projections; returns how many layers changed (0 if already fused)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fuse_qkv takes an nn.Module, got {type(model).__name__}")
    n = 0
    for attn in _attention_layers(model):
        lins = tuple(getattr(attn, name) for name in _NAMES)
        if any("forward" in vars(lin) for lin in lins):
            continue
        widths = {lin.in_features for lin in lins}
        dtypes = {lin.weight.dtype for lin in lins}
        devices = {lin.weight.device for lin in lins}
        if len(widths) != 1 or len(dtypes) != 1 or len(devices) != 1:
            raise ValueError(f"fuse_qkv: {type(attn).__name__}'s q/k/v projections must share their input width, "
                             f"dtype and device; got widths {sorted(widths)}, dtypes {sorted(map(str, dtypes))}, "
                             f"devices {sorted(map(str, devices))}")
        group = _QKVGroup(lins)  # type: ignore[arg-type]
        for i, lin in enumerate(lins):
            # the group looked up at each call, not captured: a deepcopy of the model (a float32 check copy, say)
            # then calls its own copied group over its own copied linears
            lin.forward = types.MethodType(lambda self, x, i=i: self._twell_qkv_group.project(i, x), lin)
            lin._twell_qkv_group = group
        n += 1
    return n


def unfuse_qkv(model: nn.Module) -> int:
    """Undo :func:`fuse_qkv`; returns how many layers changed."""
    n = 0
    for attn in _attention_layers(model):
        lins = [getattr(attn, name) for name in _NAMES]
        if any("forward" in vars(lin) for lin in lins):
            for lin in lins:
                vars(lin).pop("forward", None)
                vars(lin).pop("_twell_qkv_group", None)
            n += 1
    return n


def qkv_fused(model: nn.Module) -> bool:
    """Whether any attention layer of ``model`` has the one-GEMM projections."""
    return any("forward" in vars(attn.q_proj) for attn in _attention_layers(model))
