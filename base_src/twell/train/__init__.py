"""The training recipe around the sparse FFN: L1 penalty, dead-unit revival, sparsity analytics, data, trainer.

Everything works on any model that contains :class:`twell.nn.SparseGatedMLP` layers (they are found by
type).  ``twell demo`` and ``twell train`` are the command-line entry points (:mod:`twell.train.demo`,
:mod:`twell.train.trainer`).
"""

from .dead_units import DeadUnitTracker, revive_dead_units
from .hooks import GateMonitor
from .l1 import DEFAULT_L1_COEF, L1Schedule, l1_term, layer_l0, mean_l0, sparse_layers
from .stats import collect_sparsity, load_patterns, save_patterns, save_sparsity
from .trainer import TrainConfig, TrainResult, train

__all__ = [
    "DEFAULT_L1_COEF",
    "DeadUnitTracker",
    "GateMonitor",
    "L1Schedule",
    "TrainConfig",
    "TrainResult",
    "collect_sparsity",
    "l1_term",
    "layer_l0",
    "load_patterns",
    "mean_l0",
    "revive_dead_units",
    "save_patterns",
    "save_sparsity",
    "sparse_layers",
    "train",
]
