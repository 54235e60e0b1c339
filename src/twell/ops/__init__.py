"""Fused sparse ops: Triton kernels on CUDA, the pure-PyTorch reference elsewhere."""

from . import custom_ops  # noqa: F401 - registers torch.ops.twell.sparse_gated_ffn
from .inference import (
    PRECISIONS,
    gate_twell,
    sparse_gated_ffn,
    sparse_relu_ffn,
    twell_gated_ffn,
    twell_relu_ffn,
)
from .training import twell_gated_ffn_l1

__all__ = [
    "PRECISIONS",
    "gate_twell",
    "sparse_gated_ffn",
    "sparse_relu_ffn",
    "twell_gated_ffn",
    "twell_gated_ffn_l1",
    "twell_relu_ffn",
]
