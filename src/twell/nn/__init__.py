"""``torch.nn`` layers built on the TwELL ops: the sparse ReLU-gated MLP and its dispatch policy."""

from .dispatch import (
    DEFAULT_POLICY,
    EAGER_MIN_FLOPS,
    H200_BF16_896X4864_TABLE,
    H200_BF16_1024X3072_TABLE,
    H200_BF16_1536X8960_TABLE,
    H200_BF16_2048X5632_TABLE,
    H200_BF16_2048X8192_TABLE,
    H200_BF16_2304X9216_TABLE,
    H200_BF16_2560X9728_TABLE,
    H200_BF16_3072X8192_TABLE,
    H200_BF16_3584X18944_TABLE,
    H200_BF16_4096X11008_TABLE,
    H200_BF16_4096X14336_TABLE,
    H200_BF16_5120X13824_TABLE,
    H200_BF16_DECODE_TABLES,
    H200_BF16_SHAPE_TABLES,
    H200_BF16_SHAPES,
    H200_BF16_TABLE,
    OTHER_SHAPES_RULES,
    DispatchPolicy,
    bracketing_shapes,
    envelope_table,
)
from .dispatch_file import load_policy, save_policy
from .eager_graphs import graph_eager_calls
from .mlp import DenseReluGatedMLP, SparseGatedMLP, static_dispatch
from .norm import FusedRMSNorm, fuse_rms_norms, unfuse_rms_norms
from .qkv import fuse_qkv, qkv_fused, unfuse_qkv
from .residual import fuse_residual_adds, residual_adds_fused, unfuse_residual_adds
from .rope import fuse_rotary, unfuse_rotary
from .static_weights import prepare_static_weights
from .train_dispatch_file import load_train_policy, save_train_policy

__all__ = [
    "DEFAULT_POLICY",
    "EAGER_MIN_FLOPS",
    "H200_BF16_896X4864_TABLE",
    "H200_BF16_1024X3072_TABLE",
    "H200_BF16_1536X8960_TABLE",
    "H200_BF16_2048X5632_TABLE",
    "H200_BF16_2048X8192_TABLE",
    "H200_BF16_2304X9216_TABLE",
    "H200_BF16_2560X9728_TABLE",
    "H200_BF16_3072X8192_TABLE",
    "H200_BF16_3584X18944_TABLE",
    "H200_BF16_4096X11008_TABLE",
    "H200_BF16_4096X14336_TABLE",
    "H200_BF16_5120X13824_TABLE",
    "H200_BF16_DECODE_TABLES",
    "H200_BF16_SHAPE_TABLES",
    "H200_BF16_SHAPES",
    "H200_BF16_TABLE",
    "OTHER_SHAPES_RULES",
    "DenseReluGatedMLP",
    "DispatchPolicy",
    "FusedRMSNorm",
    "SparseGatedMLP",
    "bracketing_shapes",
    "envelope_table",
    "fuse_qkv",
    "fuse_residual_adds",
    "fuse_rms_norms",
    "fuse_rotary",
    "graph_eager_calls",
    "load_policy",
    "load_train_policy",
    "prepare_static_weights",
    "qkv_fused",
    "residual_adds_fused",
    "save_policy",
    "save_train_policy",
    "static_dispatch",
    "unfuse_qkv",
    "unfuse_residual_adds",
    "unfuse_rms_norms",
    "unfuse_rotary",
]
