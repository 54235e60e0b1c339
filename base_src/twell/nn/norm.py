"""RMSNorm through PyTorch's fused ``F.rms_norm``, as a drop-in for the Llama/Qwen2 RMSNorm modules.

Why: the transformers Llama/Qwen2 RMSNorm computes in float32 with separate kernels (cast up, square,
mean, rsqrt, multiply, cast down, multiply by the weight), and autograd keeps the float32
intermediates.  In the 1.5B benchmark (H200, 64 x 2048 tokens) the forward's elementwise kernels outside
the FFN, these and the rotary embedding's, took ~440 of 1048 ms
(bench_results/h200/model/model_1.5b_session4_lr1e-6.log), the same for the dense and the sparse FFN:
they cap the whole-model speed-up the sparse FFN can give (docs/performance.md) and hold activation
memory in training.  ``F.rms_norm`` computes ``x * rsqrt(mean(x^2) + eps) * weight`` with float32
statistics.

Only on CUDA: there ``F.rms_norm`` calls PyTorch's fused kernel, whose autograd saves the input and
the per-row rstd.  On the CPU it is PyTorch's composite implementation, which saved 512 bytes more
per token and norm than the transformers module (d=256, bf16, counted with saved-tensor hooks in
torch 2.13: scripts/norm_saved_bytes.py, bench_results/cpu/norm_saved_bytes.log), so elsewhere
:class:`FusedRMSNorm` runs the replaced module unchanged (``devices``).

Numerics: the transformers module rounds ``x * rstd`` to the input dtype before multiplying by the
weight; ``F.rms_norm`` multiplies by the weight before its one rounding.  Outputs differ by at most a
rounding of the input dtype (in float32, only by the order of the operations), so
:func:`fuse_rms_norms` is opt-in: a model converted with it is compared with itself (dense and sparse
FFN alike), not with the unconverted model bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FusedRMSNorm", "fuse_rms_norms", "unfuse_rms_norms"]

#: Class names of the RMSNorm modules :func:`fuse_rms_norms` replaces: the transformers Llama-family
#: norms whose forward is ``weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)``.
_REPLACEABLE = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm")


class FusedRMSNorm(nn.Module):
    """``F.rms_norm(x, (hidden,), weight, eps)``, holding the replaced module's own weight Parameter (so
    ``state_dict`` keys, optimizers and tied references see the same tensor) and the module it replaced
    (for :func:`unfuse_rms_norms`)."""

    def __init__(self, norm: nn.Module, *, devices: tuple[str, ...] = ("cuda",)) -> None:
        super().__init__()
        if isinstance(devices, str) or not all(isinstance(d, str) for d in devices):
            raise TypeError(f"devices must be a tuple of device type strings, got {devices!r}")
        weight = getattr(norm, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
            raise TypeError(f"{type(norm).__name__} has no 1-D weight; FusedRMSNorm replaces RMSNorm modules "
                            f"with a weight of shape [hidden_size]")
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
            raise TypeError(f"{type(norm).__name__} has no epsilon (variance_epsilon or eps >= 0); got {eps!r}")
        self.weight = weight
        self.eps = float(eps)
        self._replaced_type = type(norm)
        self._original = [norm]  # a list, so not a registered submodule: for unfuse_rms_norms
        self.devices = tuple(devices)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype or x.device.type not in self.devices:
            # The replaced module promotes (e.g. an fp32 weight and bf16 x give fp32); F.rms_norm takes
            # one dtype, so mixed dtypes run the replaced module itself, unchanged; so do devices where
            # F.rms_norm is not a fused kernel.
            return self._original[0](x)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, eps={self.eps}, replaces={self._replaced_type.__name__}, "
                f"devices={self.devices}")


def _children_to_replace(model: nn.Module, match: type | tuple[str, ...]) -> list[tuple[nn.Module, str, nn.Module]]:
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            hit = isinstance(child, match) if isinstance(match, type) else type(child).__name__ in match
            if hit:
                found.append((parent, name, child))
    return found


def fuse_rms_norms(model: nn.Module, *, devices: tuple[str, ...] = ("cuda",)) -> int:
    """Replace, in place, every transformers Llama/Qwen2/Mistral RMSNorm of ``model`` by a
    :class:`FusedRMSNorm` sharing its weight (``F.rms_norm`` on ``devices``); returns how many."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    found = _children_to_replace(model, _REPLACEABLE)
    for parent, name, child in found:
        setattr(parent, name, FusedRMSNorm(child, devices=devices))
    return len(found)


def unfuse_rms_norms(model: nn.Module) -> int:
    """Undo :func:`fuse_rms_norms`: put the original modules (with the same weights) back; returns how many."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    found = _children_to_replace(model, FusedRMSNorm)
    for parent, name, child in found:
        setattr(parent, name, child._original[0])
    return len(found)
