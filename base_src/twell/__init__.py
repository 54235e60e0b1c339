"""twell: fast sparse-activation feed-forward layers for GPUs (TwELL format + Triton kernels)."""

from .format import TwellTensor, pack_twell, unpack_twell

__version__ = "0.1.0"

__all__ = ["TwellTensor", "apply", "pack_twell", "revert", "unpack_twell", "__version__"]


def __getattr__(name: str):
    """``twell.apply`` / ``twell.revert``: :func:`twell.models.apply` / :func:`twell.models.revert`, imported on
    first use (they need transformers, which ``import twell`` does not)."""
    if name in ("apply", "revert"):
        from .models import convert

        return getattr(convert, name)
    raise AttributeError(f"module 'twell' has no attribute {name!r}")
