"""Public inference ops: gate -> TwELL, and the FFN from a TwELL activation.

Each op validates its inputs, then runs the Triton kernels (CUDA tensors, or the CPU under
``TRITON_INTERPRET=1``) or the pure-PyTorch reference (``twell.reference``), which has the same
signature and semantics.  Weight layouts follow ``nn.Linear``: ``w_gate`` and ``w_up`` are [F, d],
``w_down`` is [d, F].  The kernels read Wd unit-major (Wd^T, [F, d]): pass ``w_down`` as the transpose
view of a contiguous [F, d] tensor to avoid a copy per call (``SparseGatedMLP`` does).
"""

from __future__ import annotations

import torch

from .._validation import (
    FLOAT_DTYPES,
    check_finite,
    check_positive_int,
    check_same_device,
    check_same_dtype,
    check_tensor,
)
from ..format.twell import DEFAULT_TILE, MAX_TILE, TwellTensor, default_capacity
from ..reference import inference as ref
from ._runtime import resolve_backend

#: Dtypes the Triton kernels take (Triton has no float64 tensor-core dot).
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Tile widths the Triton gate kernel takes: powers of two (tl.arange) from 16 (the smallest MMA
#: N-tile) to 256 (a 128 x 256 fp32 accumulator already fills 128 registers a thread at 8 warps).
TRITON_TILES = (16, 32, 64, 128, 256)
PRECISIONS = ("match", "fp32")
#: How the Triton backend builds the TwELL gate.  "fused": one Triton GEMM whose epilogue writes TwELL
#: (the dense activation never reaches memory).  "gemm+pack": cuBLAS GEMM into a transient dense
#: [M, F] tensor, then a streaming pack kernel.  "auto" picks "gemm+pack": on an H200 the fused
#: kernel's non-persistent Triton mainloop alone runs at 62 % of cuBLAS (6.83 vs 4.27 ms at M=131072,
#: d=2048, F=5632), more than the ~0.4 ms the extra pass over the dense activation costs.
GATE_IMPLS = ("auto", "fused", "gemm+pack")


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")


def _check_x_w(x: torch.Tensor, w: torch.Tensor, w_name: str) -> None:
    check_tensor(x, "x", ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor(w, w_name, ndim=2, dtypes=FLOAT_DTYPES)
    if w.shape[1] != x.shape[1]:
        raise ValueError(
            f"{w_name} has shape {tuple(w.shape)} but x has shape {tuple(x.shape)}: "
            f"{w_name} must be [F, d] with d = x.shape[1] = {x.shape[1]}"
        )


def _check_triton_dtype(x: torch.Tensor) -> None:
    if x.dtype not in TRITON_DTYPES:
        raise TypeError(
            f"the Triton kernels take float16, bfloat16 or float32, got {str(x.dtype).replace('torch.', '')}; "
            "use backend='torch' for float64"
        )


def gate_twell(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    *,
    tile: int = DEFAULT_TILE,
    capacity: int | None = None,
    backend: str = "auto",
    nan_policy: str = "propagate",
    impl: str = "auto",
) -> TwellTensor:
    """``relu(x @ w_gate.T)`` as a TwELL container; x [M, d], w_gate [F, d].

    On the Triton backend overflowing row-tiles are kept exact by recomputation (the container's
    ``source``); the reference path keeps them in a spill area.  ``impl`` selects how the Triton
    backend computes the gate (see ``GATE_IMPLS``).
    """
    if impl not in GATE_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(GATE_IMPLS)}; got {impl!r}")
    _check_x_w(x, w_gate, "w_gate")
    check_same_dtype({"x": x, "w_gate": w_gate})
    device = check_same_device({"x": x, "w_gate": w_gate})
    check_positive_int(tile, "tile", maximum=MAX_TILE)
    if capacity is None:
        capacity = default_capacity(tile)
    check_positive_int(capacity, "capacity", maximum=tile)
    check_finite({"x": x, "w_gate": w_gate}, nan_policy)
    if resolve_backend(backend, device) == "torch":
        return ref.gate_twell(x, w_gate, tile=tile, capacity=capacity)
    _check_triton_dtype(x)
    if tile not in TRITON_TILES:
        raise ValueError(f"the Triton gate kernel takes tile in {TRITON_TILES}, got {tile}")
    from .gate_kernel import launch_gate_twell, launch_pack_twell

    x = x.contiguous()
    w_gate = w_gate.contiguous()
    if impl == "fused" or (impl == "auto" and x.device.type != "cuda"):
        values, indices, counts = launch_gate_twell(x, w_gate, tile, capacity)
    else:
        values, indices, counts = launch_pack_twell(torch.nn.functional.linear(x, w_gate), tile, capacity)
    return TwellTensor(
        values=values,
        indices=indices,
        counts=counts,
        spill_slot=None,
        spill_values=None,
        n_cols=w_gate.shape[0],
        tile=tile,
        source=(x, w_gate),
    )


def _check_container(act: TwellTensor, x: torch.Tensor, f: int, name: str) -> None:
    if not isinstance(act, TwellTensor):
        raise TypeError(f"{name} must be a TwellTensor (from twell.gate_twell or twell.pack_twell), got {type(act)}")
    if act.shape != (x.shape[0], f):
        raise ValueError(f"{name} has shape {act.shape} but x and the weights need ({x.shape[0]}, {f})")
    if act.dtype != x.dtype:
        raise TypeError(f"{name} holds {act.dtype} values but x is {x.dtype}; they must match")
    if act.device != x.device:
        raise ValueError(f"{name} is on {act.device} but x is on {x.device}")


def _unit_major(w_down: torch.Tensor) -> torch.Tensor:
    """Wd^T [F, d] contiguous; free when w_down is already the transpose of a contiguous tensor."""
    wt = w_down.t()
    return wt if wt.is_contiguous() else wt.contiguous()


def _run_twell_ffn(
    x: torch.Tensor,
    act: TwellTensor,
    w_up: torch.Tensor | None,
    w_down: torch.Tensor,
    precision: str,
) -> torch.Tensor:
    from .twell_ffn_kernel import launch_twell_ffn

    _check_triton_dtype(x)
    if act.tile not in TRITON_TILES:
        raise ValueError(f"the Triton FFN kernel takes tile in {TRITON_TILES}, got {act.tile}")
    x = x.contiguous()
    w_source = None
    if act.spill_values is None and act.source is not None:
        w_source = act.source[1].contiguous()
        if act.source[0].shape != x.shape:
            raise ValueError("the TwELL container's source x does not match x")
    out = torch.empty((x.shape[0], w_down.shape[0]), dtype=x.dtype, device=x.device)
    return launch_twell_ffn(
        x,
        act.values.contiguous(),
        act.indices.contiguous(),
        act.counts.contiguous(),
        None if act.spill_slot is None else act.spill_slot.contiguous(),
        None if act.spill_values is None else act.spill_values.contiguous(),
        w_source,
        None if w_up is None else w_up.contiguous(),
        _unit_major(w_down),
        n_cols=act.n_cols,
        tile=act.tile,
        round_hidden=precision == "match",
        out=out,
    )


def twell_gated_ffn(
    x: torch.Tensor,
    gate: TwellTensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    precision: str = "match",
    backend: str = "auto",
) -> torch.Tensor:
    """``(gate * (x @ w_up.T)) @ w_down.T`` computed only at the gate's non-zeros."""
    _check_precision(precision)
    _check_x_w(x, w_up, "w_up")
    check_tensor(w_down, "w_down", ndim=2, dtypes=FLOAT_DTYPES)
    f = w_up.shape[0]
    if w_down.shape[1] != f:
        raise ValueError(
            f"w_down has shape {tuple(w_down.shape)} but w_up has {tuple(w_up.shape)}: w_down must be [d, F]"
        )
    check_same_dtype({"x": x, "w_up": w_up, "w_down": w_down})
    device = check_same_device({"x": x, "w_up": w_up, "w_down": w_down})
    _check_container(gate, x, f, "gate")
    if resolve_backend(backend, device) == "torch":
        return ref.twell_gated_ffn(x, gate, w_up, w_down, precision=precision)
    return _run_twell_ffn(x, gate, w_up, w_down, precision)


def twell_relu_ffn(
    x: torch.Tensor,
    act: TwellTensor,
    w_down: torch.Tensor,
    *,
    precision: str = "match",
    backend: str = "auto",
) -> torch.Tensor:
    """``act @ w_down.T`` over the non-zeros of a TwELL activation (non-gated FFN second half)."""
    _check_precision(precision)
    check_tensor(x, "x", ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor(w_down, "w_down", ndim=2, dtypes=FLOAT_DTYPES)
    check_same_dtype({"x": x, "w_down": w_down})
    device = check_same_device({"x": x, "w_down": w_down})
    _check_container(act, x, w_down.shape[1], "act")
    if resolve_backend(backend, device) == "torch":
        return ref.twell_relu_ffn(x, act, w_down, precision=precision)
    return _run_twell_ffn(x, act, None, w_down, precision)


def sparse_gated_ffn(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    tile: int = DEFAULT_TILE,
    capacity: int | None = None,
    precision: str = "match",
    backend: str = "auto",
    nan_policy: str = "propagate",
    impl: str = "auto",
) -> torch.Tensor:
    """The whole ReLU-gated FFN ``(relu(x Wg^T) * (x Wu^T)) Wd^T`` through TwELL."""
    gate = gate_twell(x, w_gate, tile=tile, capacity=capacity, backend=backend, nan_policy=nan_policy, impl=impl)
    return twell_gated_ffn(x, gate, w_up, w_down, precision=precision, backend=backend)


def sparse_relu_ffn(
    x: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    tile: int = DEFAULT_TILE,
    capacity: int | None = None,
    precision: str = "match",
    backend: str = "auto",
    nan_policy: str = "propagate",
    impl: str = "auto",
) -> torch.Tensor:
    """The non-gated FFN ``relu(x Wu^T) Wd^T`` through TwELL (the gate kernel runs on Wu)."""
    act = gate_twell(x, w_up, tile=tile, capacity=capacity, backend=backend, nan_policy=nan_policy, impl=impl)
    return twell_relu_ffn(x, act, w_down, precision=precision, backend=backend)
