"""Fused sparse ops: Triton kernels on CUDA, the pure-PyTorch reference elsewhere."""

from .inference import (
    PRECISIONS,
    gate_twell,
    sparse_gated_ffn,
    sparse_relu_ffn,
    twell_gated_ffn,
    twell_relu_ffn,
)

__all__ = [
    "PRECISIONS",
    "gate_twell",
    "sparse_gated_ffn",
    "sparse_relu_ffn",
    "twell_gated_ffn",
    "twell_relu_ffn",
]
