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
    check_residual,
    check_same_device,
    check_same_dtype,
    check_tensor,
)
from ..format.twell import DEFAULT_TILE, MAX_TILE, TwellTensor, default_capacity
from ..reference import inference as ref
from ..reference.inference import PRECISIONS, check_precision  # noqa: F401 - PRECISIONS re-exported
from ._runtime import resolve_backend
from .hot_cold_plan import HotColdPlan

#: Dtypes the Triton kernels take (Triton has no float64 tensor-core dot).
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Tile widths the Triton gate kernel takes: powers of two (tl.arange) from 16 (the smallest MMA
#: N-tile) to 256 (a 128 x 256 fp32 accumulator already fills 128 registers a thread at 8 warps).
TRITON_TILES = (16, 32, 64, 128, 256)
#: How the Triton backend builds the TwELL gate.  "fused": one Triton GEMM whose epilogue writes TwELL
#: (the dense activation never reaches memory).  "gemm+pack": cuBLAS GEMM into a transient dense
#: [M, F] tensor, then a streaming pack kernel.  "auto" picks "gemm+pack": on an H200 the fused
#: kernel's non-persistent Triton mainloop alone runs at 62 % of cuBLAS (6.83 vs 4.27 ms at M=131072,
#: d=2048, F=5632), more than the ~0.4 ms the extra pass over the dense activation costs.
GATE_IMPLS = ("auto", "fused", "gemm+pack")
#: How the Triton backend computes the whole FFN.  "row-gather": gate -> TwELL, then one program per
#: token gathers one Wu and one Wd row per active unit (ops.twell_gated_ffn).  "block-union": cuBLAS
#: gate, then per block of 64 tokens the union of their active units goes through tensor-core GEMMs
#: (ops/block_union_kernel.py), reading each weight row once per block.  "auto" takes block-union from
#: BLOCK_UNION_MIN_TOKENS tokens on: on an H200 at d=2048, F=5632, 0.5 % density it took 7.34 ms for the
#: FFN part vs 7.85 ms row-gather at M=131072 and 1.15 vs 1.15 ms at 16384, but lost at M=4096 (0.61 vs
#: 0.45 ms) and below (bench_results/h200/block_union_variants.log).
FFN_METHODS = ("auto", "row-gather", "block-union")
BLOCK_UNION_MIN_TOKENS = 8192


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
    check_precision(precision)
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
    check_precision(precision)
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
    method: str = "auto",
    return_counts: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The whole ReLU-gated FFN ``(relu(x Wg^T) * (x Wu^T)) Wd^T``, computing only active units.

    ``method`` picks the Triton algorithm (see ``FFN_METHODS``); ``impl`` the gate of the row-gather
    method.  With ``return_counts`` also returns the non-zeros per (row, column tile), [M, n_tiles]
    int32, on the device (for l0 statistics without a host synchronisation).
    """
    return _sparse_ffn(x, w_gate, w_up, w_down, tile=tile, capacity=capacity, precision=precision,
                       backend=backend, nan_policy=nan_policy, impl=impl, method=method,
                       return_counts=return_counts)


def _sparse_ffn(
    x: torch.Tensor,
    w_act: torch.Tensor,
    w_up: torch.Tensor | None,
    w_down: torch.Tensor,
    *,
    tile: int,
    capacity: int | None,
    precision: str,
    backend: str,
    nan_policy: str,
    impl: str,
    method: str,
    return_counts: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if method not in FFN_METHODS:
        raise ValueError(f"method must be one of {', '.join(FFN_METHODS)}; got {method!r}")
    check_precision(precision)
    _check_x_w(x, w_act, "w_gate" if w_up is not None else "w_up")
    device = check_same_device({"x": x, "w_act": w_act, "w_down": w_down})
    use_triton = resolve_backend(backend, device) == "triton"
    if use_triton and (method == "block-union" or (method == "auto" and x.shape[0] >= BLOCK_UNION_MIN_TOKENS)):
        return _block_union_ffn(x, w_act, w_up, w_down, tile, precision, nan_policy, return_counts)
    act = gate_twell(x, w_act, tile=tile, capacity=capacity, backend=backend, nan_policy=nan_policy, impl=impl)
    if w_up is None:
        out = twell_relu_ffn(x, act, w_down, precision=precision, backend=backend)
    else:
        out = twell_gated_ffn(x, act, w_up, w_down, precision=precision, backend=backend)
    return (out, act.counts) if return_counts else out


def _block_union_ffn(
    x: torch.Tensor,
    w_act: torch.Tensor,
    w_up: torch.Tensor | None,
    w_down: torch.Tensor,
    tile: int,
    precision: str,
    nan_policy: str,
    return_counts: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    from .block_union_kernel import launch_block_union_ffn

    _check_dense_gate_inputs(x, w_act, w_up, w_down, tile, nan_policy)
    x = x.contiguous()
    g = torch.nn.functional.linear(x, w_act.contiguous())
    out, counts = launch_block_union_ffn(
        x, g, None if w_up is None else w_up.contiguous(), _unit_major(w_down),
        round_hidden=precision == "match", tile=tile,
    )
    return (out, counts) if return_counts else out


def _check_dense_gate_inputs(
    x: torch.Tensor,
    w_act: torch.Tensor,
    w_up: torch.Tensor | None,
    w_down: torch.Tensor,
    tile: int,
    nan_policy: str,
) -> None:
    """Checks of the methods whose gate is a cuBLAS GEMM (block-union, hot-cold) on the Triton backend."""
    check_tensor(w_down, "w_down", ndim=2, dtypes=FLOAT_DTYPES)
    named = {"x": x, "w_down": w_down, ("w_gate" if w_up is not None else "w_up"): w_act}
    if w_up is not None:
        _check_x_w(x, w_up, "w_up")
        named["w_up"] = w_up
        if w_up.shape[0] != w_act.shape[0]:
            raise ValueError(f"w_up has shape {tuple(w_up.shape)} but w_gate has {tuple(w_act.shape)}")
    if w_down.shape != (x.shape[1], w_act.shape[0]):
        raise ValueError(f"w_down has shape {tuple(w_down.shape)}; expected [d, F] = {(x.shape[1], w_act.shape[0])}")
    check_same_dtype(named)
    _check_triton_dtype(x)
    if tile not in TRITON_TILES:
        raise ValueError(f"the Triton kernels take tile in {TRITON_TILES}, got {tile}")
    check_finite(named, nan_policy)


def hot_cold_gated_ffn(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    plan: HotColdPlan,
    *,
    tile: int = DEFAULT_TILE,
    capacity: int | None = None,
    backend: str = "auto",
    nan_policy: str = "propagate",
    return_counts: bool = False,
    cold_format: str = "auto",
    dense_rows: int = 0,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The ReLU-gated FFN with the hot/cold split of ``plan`` (``twell.ops.hot_cold``): hot units densely,
    cold units through TwELL ("twell", what "auto" picks: faster on the H200) or a per-row-tile bitmap
    ("bitmap", tiles that are multiples of 32).  Same values as the dense FFN in the input dtype ("match"
    precision).

    With ``return_counts`` also returns the non-zeros per (row, tile of cold columns, then of hot units),
    int32 [M, ceil((F - H) / tile) + ceil(H / tile)]: each row sums to its l0.

    ``dense_rows`` (int >= 0; Triton path, TwELL cold format): up to this many tokens with an overflowing cold
    tile are computed by three dense GEMMs on their rows instead of one at a time in the row kernel
    (``twell.ops.hot_cold_dense_rows``); a speed setting only, the values stay the dense FFN's.

    ``residual`` (x's shape, dtype and device): returns ``residual + FFN(x)`` with the bits of that sum in the input
    dtype, the FFN's output rounded first; the Triton path adds it as the TwELL gather writes each row, saving a
    decoder layer its separate pass over the residual (``twell.nn.fuse_residual_adds``).
    """
    if not isinstance(plan, HotColdPlan):
        raise TypeError(f"plan must be a HotColdPlan (twell.ops.build_hot_cold_plan), got {type(plan).__name__}")
    if cold_format not in ("auto", "bitmap", "twell"):
        raise ValueError(f"cold_format must be one of auto, bitmap, twell; got {cold_format!r}")
    if cold_format == "bitmap" and tile % 32:
        raise ValueError(f"cold_format='bitmap' needs a tile that is a multiple of 32, got {tile}")
    _check_x_w(x, w_gate, "w_gate")
    check_positive_int(tile, "tile", maximum=MAX_TILE)
    if capacity is None:
        capacity = default_capacity(tile)
    check_positive_int(capacity, "capacity", maximum=tile)
    if isinstance(dense_rows, bool) or not isinstance(dense_rows, int) or dense_rows < 0:
        raise ValueError(f"dense_rows must be an int >= 0 (rows with an overflowing cold tile done by dense GEMMs; "
                         f"0: none), got {dense_rows!r}")
    if plan.n_units != w_gate.shape[0] or plan.w_gemm.shape[1] != x.shape[1]:
        raise ValueError(
            f"the plan is for F={plan.n_units}, d={plan.w_gemm.shape[1]} but the weights have F={w_gate.shape[0]}, "
            f"d={x.shape[1]}"
        )
    device = check_same_device({"x": x, "w_gate": w_gate, "plan.w_gemm": plan.w_gemm})
    if residual is not None:
        check_residual(residual, x)
    if resolve_backend(backend, device) == "torch":
        check_finite({"x": x, "w_gate": w_gate, "w_up": w_up, "w_down": w_down}, nan_policy)
        out, counts = ref.hot_cold_gated_ffn(x, w_gate, w_up, w_down, plan.hot, plan.cold, tile=tile)
        if residual is not None:
            out = residual + out
        return (out, counts) if return_counts else out
    _check_dense_gate_inputs(x, w_gate, w_up, w_down, tile, nan_policy)
    check_same_dtype({"x": x, "plan.w_gemm": plan.w_gemm, "plan.w_down_hot_t": plan.w_down_hot_t})
    from .hot_cold import launch_hot_cold_ffn

    out, counts = launch_hot_cold_ffn(
        x.contiguous(), plan, w_gate.contiguous(), w_up.contiguous(), _unit_major(w_down), tile=tile,
        capacity=capacity, cold_format=cold_format, dense_rows=dense_rows,
        residual=None if residual is None else residual.contiguous(),
    )
    return (out, counts) if return_counts else out


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
    method: str = "auto",
    return_counts: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The non-gated FFN ``relu(x Wu^T) Wd^T``, computing only active units (same options as above)."""
    return _sparse_ffn(x, w_up, None, w_down, tile=tile, capacity=capacity, precision=precision,
                       backend=backend, nan_policy=nan_policy, impl=impl, method=method,
                       return_counts=return_counts)
