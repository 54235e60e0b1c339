"""twell: fast sparse-activation feed-forward layers for GPUs (TwELL format + Triton kernels)."""

from .format import TwellTensor, pack_twell, unpack_twell

__version__ = "0.1.0"

__all__ = ["TwellTensor", "pack_twell", "unpack_twell", "__version__"]
