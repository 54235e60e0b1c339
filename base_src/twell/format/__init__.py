"""Sparse activation containers: TwELL (inference) and hybrid ELL + dense tail (training)."""

from .hybrid import HybridTensor, UnitMajor, pack_hybrid
from .twell import DEFAULT_TILE, TwellTensor, default_capacity, pack_twell, unpack_twell

__all__ = [
    "DEFAULT_TILE",
    "HybridTensor",
    "TwellTensor",
    "UnitMajor",
    "default_capacity",
    "pack_hybrid",
    "pack_twell",
    "unpack_twell",
]
