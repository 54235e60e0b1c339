"""Input checks shared by every public entry point.

Each check raises an exception whose message names the argument, what was received and what is
accepted, so that a user never has to read kernel code to find out why a call was refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: What happens to NaN/Inf in inputs.  ``"propagate"`` (default) behaves exactly like the dense
#: PyTorch FFN: a NaN gate pre-activation counts as a non-zero, is stored and reaches the output,
#: ``relu(-inf) = 0`` and ``+inf`` is kept.  ``"raise"`` checks inputs first and raises ValueError on
#: any non-finite value; it costs a device-to-host synchronisation per call, so it is meant for
#: debugging, not for the hot path.
NAN_POLICIES = ("propagate", "raise")


def _fmt_dtypes(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    t: object,
    name: str,
    *,
    ndim: int | Sequence[int] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check that ``t`` is a tensor with an accepted rank, dtype and device; return it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            raise ValueError(
                f"{name} must have {' or '.join(str(a) for a in allowed)} dimensions, "
                f"got shape {tuple(t.shape)} ({t.dim()} dimensions)"
            )
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; accepted: {_fmt_dtypes(dtypes)}")
    if device is not None and t.device != device:
        raise ValueError(
            f"{name} is on device {t.device} but must be on {device} (the device of the other inputs)"
        )
    return t


def check_same_dtype(tensors: dict[str, torch.Tensor]) -> torch.dtype:
    """All tensors share one dtype; return it."""
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(
                f"{name} has dtype {str(t.dtype).replace('torch.', '')} but {first_name} has "
                f"{str(first.dtype).replace('torch.', '')}; all inputs must share one dtype"
            )
    return first.dtype


def check_same_device(tensors: dict[str, torch.Tensor]) -> torch.device:
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(
                f"{name} is on {t.device} but {first_name} is on {first.device}; all inputs must be on one device"
            )
    return first.device


def check_positive_int(value: object, name: str, *, multiple_of: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    if multiple_of is not None and value % multiple_of != 0:
        raise ValueError(f"{name} must be a multiple of {multiple_of}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return value


def check_nan_policy(policy: str) -> str:
    if policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be one of {', '.join(NAN_POLICIES)}; got {policy!r}")
    return policy


def check_finite(tensors: dict[str, torch.Tensor], policy: str) -> None:
    """Apply the NaN policy: under ``"raise"`` any NaN/Inf raises ValueError naming the tensor."""
    check_nan_policy(policy)
    if policy == "propagate":
        return
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            n_nan = int(torch.isnan(t).sum())
            n_inf = int(torch.isinf(t).sum())
            raise ValueError(
                f"{name} contains {n_nan} NaN and {n_inf} Inf values and nan_policy='raise'; "
                "use nan_policy='propagate' to get dense-PyTorch semantics instead"
            )


def check_residual(residual: object, x: torch.Tensor) -> torch.Tensor:
    """A residual to add to an FFN's output: a tensor with ``x``'s shape, dtype and device (no broadcasting and
    no promotion: the sum is formed in the output's dtype, as the decoder layer's ``residual + mlp(x)`` is)."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a torch.Tensor (or None), got {type(residual).__name__}")
    if residual.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)} but x has {tuple(x.shape)}; they must match")
    if residual.dtype != x.dtype:
        raise TypeError(f"residual has dtype {str(residual.dtype).replace('torch.', '')} but x has "
                        f"{str(x.dtype).replace('torch.', '')}; they must match")
    if residual.device != x.device:
        raise ValueError(f"residual is on {residual.device} but x is on {x.device}; they must be on one device")
    return residual
