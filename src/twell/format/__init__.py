"""Sparse activation containers: TwELL (inference) and hybrid ELL + dense tail (training)."""

from .twell import DEFAULT_TILE, TwellTensor, default_capacity, pack_twell, unpack_twell

__all__ = ["DEFAULT_TILE", "TwellTensor", "default_capacity", "pack_twell", "unpack_twell"]
