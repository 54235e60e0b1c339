"""Pure-PyTorch reference ops: the test oracle of the Triton kernels and the CPU execution path."""

from .inference import (
    PRECISIONS,
    check_precision,
    dense_gated_ffn,
    dense_relu_ffn,
    gate_twell,
    twell_gated_ffn,
    twell_relu_ffn,
)
from .stats import dead_units, l0, l1, row_l0, unit_frequency
from .training import GatedFFNL1, dense_gated_ffn_l1, gated_ffn_l1

__all__ = [
    "PRECISIONS",
    "GatedFFNL1",
    "check_precision",
    "dead_units",
    "dense_gated_ffn",
    "dense_gated_ffn_l1",
    "dense_relu_ffn",
    "gate_twell",
    "gated_ffn_l1",
    "l0",
    "l1",
    "row_l0",
    "twell_gated_ffn",
    "twell_relu_ffn",
    "unit_frequency",
]
