"""Fused sparse ops: Triton kernels on CUDA, the pure-PyTorch reference elsewhere."""

from . import (
    custom_ops,  # noqa: F401 - registers torch.ops.twell.sparse_gated_ffn
    hot_cold_training_op,  # noqa: F401 - registers torch.ops.twell.hot_cold_gated_ffn_l1
)
from .decode import DECODE_MAX_TOKENS, decode_gated_ffn
from .hot_cold_plan import HotColdPlan, build_hot_cold_plan, choose_hot_units, unit_frequency
from .hot_cold_training import HotUnits, choose_training_hot_units, twell_gated_ffn_l1_hot_cold
from .inference import (
    PRECISIONS,
    gate_twell,
    hot_cold_gated_ffn,
    sparse_gated_ffn,
    sparse_relu_ffn,
    twell_gated_ffn,
    twell_relu_ffn,
)
from .training import twell_gated_ffn_l1

__all__ = [
    "DECODE_MAX_TOKENS",
    "PRECISIONS",
    "HotColdPlan",
    "HotUnits",
    "build_hot_cold_plan",
    "choose_hot_units",
    "choose_training_hot_units",
    "decode_gated_ffn",
    "gate_twell",
    "hot_cold_gated_ffn",
    "sparse_gated_ffn",
    "sparse_relu_ffn",
    "twell_gated_ffn",
    "twell_gated_ffn_l1",
    "twell_gated_ffn_l1_hot_cold",
    "twell_relu_ffn",
    "unit_frequency",
]
