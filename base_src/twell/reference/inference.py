"""Pure-PyTorch reference ops for ReLU-gated sparse feed-forward inference.

These functions are the test oracle of the Triton kernels and the execution path on the CPU, so they
favour clarity and exactly specified rounding over speed.

Shapes follow ``nn.Linear``: ``x [M, d]``, ``w_gate, w_up [F, d]`` (unit-major), ``w_down [d, F]``.
The gated FFN is ``out = (relu(x Wg^T) * (x Wu^T)) Wd^T``; the plain ReLU FFN is
``out = relu(x Wu^T) Wd^T``.

Precision modes (:data:`PRECISIONS`), with "round" meaning a cast to the input dtype and every
product accumulated in float32 (float64 for float64 inputs):

* ``"match"`` (default) reproduces what a dense PyTorch FFN computes in the input dtype on a GPU:
  ``g = round(x Wg^T)``, ``a = relu(g)``, ``u = round(x Wu^T)``, ``h = round(a * u)``,
  ``out = round(h Wd^T)``.  The roundings are written out explicitly (inputs are up-cast, products
  accumulated in the wide dtype, then cast back) so that the CPU result does not depend on how the
  CPU back-end happens to implement half-precision matmuls.
* ``"fp32"``: ``g`` is still rounded (the sparse kernels store it in the TwELL container in the
  input dtype), but ``u`` and ``h`` stay in the wide dtype and only the output is rounded, once.
  This is more accurate than "match" and is what the fused kernels compute.

For the plain ReLU FFN the two modes coincide: the activation is stored (rounded) in the input dtype
either way, and the output is rounded once either way.

The sparse ops touch only the active ``(row, col)`` pairs of the activation, as listed by
:meth:`TwellTensor.entries`, and never build a dense ``[M, F]`` tensor.  Pairs are processed in
chunks so that no temporary exceeds about ``2**22`` elements whatever M, F and the density are.
The down projection is accumulated with ``index_add_`` over rows: deterministic on the CPU; on CUDA
``index_add_`` uses atomics (non-deterministic summation order) unless
``torch.use_deterministic_algorithms(True)`` is set.

NaN/Inf follow dense PyTorch semantics for the *active* pairs (a NaN gate is a non-zero and reaches
the output).  One unavoidable difference: where the gate is exactly 0 the sparse ops skip the pair,
so an infinite ``u`` there does not produce the ``0 * inf = NaN`` the dense FFN would.
"""

from __future__ import annotations

import torch

from .._validation import (
    FLOAT_DTYPES,
    check_finite,
    check_same_device,
    check_same_dtype,
    check_tensor,
)
from ..format.twell import DEFAULT_TILE, TwellTensor, pack_twell

__all__ = [
    "PRECISIONS",
    "check_precision",
    "dense_gated_ffn",
    "dense_gated_ffn_from_gate",
    "dense_relu_ffn",
    "gate_preactivation",
    "gate_twell",
    "hot_cold_gated_ffn",
    "split_counts",
    "twell_gated_ffn",
    "twell_relu_ffn",
]

#: Accepted values of the ``precision`` argument; see the module docstring.
PRECISIONS: tuple[str, ...] = ("match", "fp32")

#: Upper bound on the number of elements of one per-chunk temporary (``[pairs, d]`` gathers).
_MAX_CHUNK_ELEMENTS = 2**22


# ---------------------------------------------------------------------------------------- helpers
def check_precision(precision: object) -> str:
    """Return ``precision`` if it is one of :data:`PRECISIONS`, else raise ValueError (TypeError if not a str)."""
    if not isinstance(precision, str):
        raise TypeError(f"precision must be a str, one of {', '.join(PRECISIONS)}; got {type(precision).__name__}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    return precision


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_2d_float(tensors: dict[str, torch.Tensor]) -> None:
    """Each tensor is 2-D with an accepted float dtype; all share one dtype and one device."""
    for name, t in tensors.items():
        check_tensor(t, name, ndim=2, dtypes=FLOAT_DTYPES)
    check_same_dtype(tensors)
    check_same_device(tensors)


def _check_in_weight(x: torch.Tensor, w: torch.Tensor, name: str) -> None:
    """``w`` is an ``[F, d]`` input-side weight matching ``x [M, d]``."""
    if w.shape[1] != x.shape[1]:
        raise ValueError(
            f"{name} has shape {_shape(w)} but x has shape {_shape(x)}: {name} must be [F, d] with "
            f"d = x.shape[1] = {x.shape[1]}"
        )


def _check_down_weight(x: torch.Tensor, w_down: torch.Tensor, n_units: int, units_from: str) -> None:
    """``w_down`` is ``[d, F]`` with d from x and F from ``units_from``."""
    if w_down.shape != (x.shape[1], n_units):
        raise ValueError(
            f"w_down has shape {_shape(w_down)} but x has shape {_shape(x)} and {units_from}: w_down must be "
            f"[d, F] = {(x.shape[1], n_units)}"
        )


def _check_gated_weights(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> None:
    """Full validation of the dense gated-FFN inputs (types, dtypes, devices, shapes)."""
    _check_2d_float({"x": x, "w_gate": w_gate, "w_up": w_up, "w_down": w_down})
    _check_in_weight(x, w_gate, "w_gate")
    _check_in_weight(x, w_up, "w_up")
    if w_up.shape != w_gate.shape:
        raise ValueError(f"w_up has shape {_shape(w_up)} but w_gate has shape {_shape(w_gate)}: both must be [F, d]")
    _check_down_weight(x, w_down, w_gate.shape[0], f"w_gate has shape {_shape(w_gate)}")


def _check_container(x: torch.Tensor, t: object, name: str, n_units: int, units_from: str) -> TwellTensor:
    """``t`` is a structurally valid TwellTensor of shape ``(M, F)`` in x's dtype and on x's device."""
    if not isinstance(t, TwellTensor):
        raise TypeError(f"{name} must be a TwellTensor (e.g. from gate_twell), got {type(t).__name__}")
    t.validate()
    expected = (x.shape[0], n_units)
    if t.shape != expected:
        raise ValueError(
            f"{name} has shape {t.shape} but x has shape {_shape(x)} and {units_from}: {name} must be "
            f"[M, F] = {expected}"
        )
    check_same_dtype({"x": x, f"{name}.values": t.values})
    check_same_device({"x": x, f"{name}.values": t.values})
    return t


def _chunk_size(width: int) -> int:
    """Number of pairs per chunk so that a ``[pairs, width]`` temporary stays within the element budget."""
    return max(1, _MAX_CHUNK_ELEMENTS // max(1, width))


def _pair_dots(a: torch.Tensor, ia: torch.Tensor, b: torch.Tensor, ib: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """``sum_k a[ia[p], k] * b[ib[p], k]`` for every pair p, accumulated in ``acc``, chunked.

    Gathered rows are up-cast per chunk (never the whole operand), so a bf16 product is exact in fp32
    and only the summation rounds.
    """
    n = ia.numel()
    out = torch.empty(n, dtype=acc, device=a.device)
    step = _chunk_size(a.shape[1])
    for s in range(0, n, step):
        e = min(n, s + step)
        out[s:e] = (a[ia[s:e]].to(acc) * b[ib[s:e]].to(acc)).sum(dim=-1)
    return out


def _scatter_scaled_rows(
    out: torch.Tensor, idx: torch.Tensor, coef: torch.Tensor, b: torch.Tensor, ib: torch.Tensor
) -> None:
    """``out[idx[p]] += coef[p] * b[ib[p]]`` for every pair p, in ``out``'s dtype, chunked, in place.

    ``index_add_`` sums the pairs of one chunk into their rows in pair order on the CPU (deterministic);
    chunks are applied one after the other, so the order is fixed for a given pair list.
    """
    n = idx.numel()
    step = _chunk_size(b.shape[1])
    for s in range(0, n, step):
        e = min(n, s + step)
        out.index_add_(0, idx[s:e], coef[s:e].to(out.dtype).unsqueeze(1) * b[ib[s:e]].to(out.dtype))


def _matmul_nt(x: torch.Tensor, w: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """``x @ w^T`` with both operands up-cast to ``acc`` (one rounding-free accumulation, then caller rounds)."""
    return x.to(acc) @ w.to(acc).T


# ---------------------------------------------------------------------------------------- dense baselines
def dense_gated_ffn(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    precision: str = "match",
) -> torch.Tensor:
    """Dense ``(relu(x Wg^T) * (x Wu^T)) Wd^T`` with the rounding rules of ``precision``; returns [M, d].

    This is the baseline the sparse ops are compared with; it builds every dense ``[M, F]`` tensor.
    """
    check_precision(precision)
    _check_gated_weights(x, w_gate, w_up, w_down)
    return dense_gated_ffn_from_gate(x, gate_preactivation(x, w_gate), w_up, w_down, precision=precision)


def gate_preactivation(x: torch.Tensor, w_gate: torch.Tensor) -> torch.Tensor:
    """``g = x Wg^T`` accumulated in fp32 (fp64 for fp64) and rounded to x's dtype, as a dense linear does."""
    return _matmul_nt(x, w_gate, _acc_dtype(x.dtype)).to(x.dtype)


def dense_gated_ffn_from_gate(
    x: torch.Tensor, g: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *, precision: str = "match"
) -> torch.Tensor:
    """:func:`dense_gated_ffn` from its gate pre-activation ``g`` (:func:`gate_preactivation`), for callers
    that need ``g`` as well (the decode op's counts); inputs unchecked."""
    dt = x.dtype
    acc = _acc_dtype(dt)
    a = torch.relu(g)
    u = _matmul_nt(x, w_up, acc)
    if precision == "match":
        u = u.to(dt)
        h = (a.to(acc) * u.to(acc)).to(dt)
    else:
        h = a.to(acc) * u
    return _matmul_nt(h, w_down, acc).to(dt)


def dense_relu_ffn(
    x: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    precision: str = "match",
) -> torch.Tensor:
    """Dense ``relu(x Wu^T) Wd^T``; returns [M, d].

    Both precision modes give the same result: the activation is rounded to the input dtype (it is
    what the sparse path stores) and the output is rounded once.  ``precision`` is still validated so
    that callers can pass it uniformly.
    """
    check_precision(precision)
    _check_2d_float({"x": x, "w_up": w_up, "w_down": w_down})
    _check_in_weight(x, w_up, "w_up")
    _check_down_weight(x, w_down, w_up.shape[0], f"w_up has shape {_shape(w_up)}")
    dt = x.dtype
    acc = _acc_dtype(dt)
    a = torch.relu(_matmul_nt(x, w_up, acc).to(dt))
    return _matmul_nt(a, w_down, acc).to(dt)


# ---------------------------------------------------------------------------------------- sparse ops
def gate_twell(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    *,
    tile: int = DEFAULT_TILE,
    capacity: int | None = None,
    nan_policy: str = "propagate",
) -> TwellTensor:
    """The gate activation ``relu(round(x Wg^T))`` packed into TwELL (exact spill for overflowing tiles).

    ``x Wg^T`` is accumulated in float32 (float64 for float64) and rounded once to ``x.dtype``, as the
    gate GEMM's epilogue does, so the stored values are bit-identical to the "match" dense gate.  The
    dense ``[M, F]`` pre-activation exists only transiently here: the reference mirrors the kernel's
    output, not its tiling.
    """
    _check_2d_float({"x": x, "w_gate": w_gate})
    _check_in_weight(x, w_gate, "w_gate")
    check_finite({"x": x, "w_gate": w_gate}, nan_policy)
    g = gate_preactivation(x, w_gate)
    return pack_twell(g, tile=tile, capacity=capacity, apply_relu=True, nan_policy=nan_policy)


def twell_gated_ffn(
    x: torch.Tensor,
    gate: TwellTensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    precision: str = "match",
) -> torch.Tensor:
    """Sparse gated FFN: ``out = (a * (x Wu^T)) Wd^T`` evaluated only at the gate's non-zeros; [M, d].

    ``gate`` holds ``a = relu(g)`` (see :func:`gate_twell`).  For every active pair ``(t, j)``:
    ``u = x[t] . Wu[j]`` accumulated in float32 (float64), ``h = a * u`` rounded per ``precision`` and
    ``out[t] += h * Wd[:, j]`` accumulated in float32 (float64) via ``index_add_``; the output is
    rounded to ``x.dtype`` once at the end.  Work and memory scale with the number of non-zeros, and
    pairs are processed in bounded chunks.
    """
    check_precision(precision)
    _check_2d_float({"x": x, "w_up": w_up, "w_down": w_down})
    _check_in_weight(x, w_up, "w_up")
    n_units = w_up.shape[0]
    _check_down_weight(x, w_down, n_units, f"w_up has shape {_shape(w_up)}")
    _check_container(x, gate, "gate", n_units, f"w_up has shape {_shape(w_up)}")

    dt = x.dtype
    acc = _acc_dtype(dt)
    rows, cols, a = gate.entries()
    u = _pair_dots(x, rows, w_up, cols, acc)
    if precision == "match":
        h = (a.to(acc) * u.to(dt).to(acc)).to(dt).to(acc)
    else:
        h = a.to(acc) * u
    out = torch.zeros((x.shape[0], x.shape[1]), dtype=acc, device=x.device)
    # Wd^T is [F, d]: row j is the down-projection column of unit j (a strided view, no copy).
    _scatter_scaled_rows(out, rows, h, w_down.T, cols)
    return out.to(dt)


def twell_relu_ffn(
    x: torch.Tensor,
    act: TwellTensor,
    w_down: torch.Tensor,
    *,
    precision: str = "match",
) -> torch.Tensor:
    """Sparse plain ReLU FFN: ``out = act Wd^T`` over the active entries only; [M, d].

    ``act`` is ``gate_twell(x, w_up)``.  ``x`` is not read by the computation; it fixes M, the
    dtype and the device the inputs are checked against.  The output is accumulated in float32
    (float64) and rounded once, which is the same in both precision modes (see :func:`dense_relu_ffn`).
    """
    check_precision(precision)
    _check_2d_float({"x": x, "w_down": w_down})
    if w_down.shape[0] != x.shape[1]:
        raise ValueError(
            f"w_down has shape {_shape(w_down)} but x has shape {_shape(x)}: w_down must be [d, F] with "
            f"d = x.shape[1] = {x.shape[1]}"
        )
    _check_container(x, act, "act", w_down.shape[1], f"w_down has shape {_shape(w_down)}")
    acc = _acc_dtype(x.dtype)
    rows, cols, a = act.entries()
    out = torch.zeros((x.shape[0], x.shape[1]), dtype=acc, device=x.device)
    _scatter_scaled_rows(out, rows, a, w_down.T, cols)
    return out.to(x.dtype)


def tile_counts(g: torch.Tensor, tile: int) -> torch.Tensor:
    """Non-zeros of ``relu(g)`` (NaN counts) per (row, tile of ``tile`` columns), int32 [M, ceil(F / tile)]."""
    nz = ((g > 0) | g.isnan()).to(torch.int32)
    n_tiles = -(-nz.shape[1] // tile)
    nz = torch.nn.functional.pad(nz, (0, n_tiles * tile - nz.shape[1]))
    return nz.view(nz.shape[0], n_tiles, tile).sum(2, dtype=torch.int32)


def split_counts(g: torch.Tensor, hot: torch.Tensor, cold: torch.Tensor, tile: int) -> torch.Tensor:
    """Non-zeros of ``relu(g)`` per (row, tile of the cold columns) then per (row, tile of the hot units).

    The count layout of the hot/cold split (``twell.ops.hot_cold_gated_ffn``); each row sums to its l0.
    """
    return torch.cat([tile_counts(g[:, ids.long()], tile) for ids in (cold, hot)], 1)


def hot_cold_gated_ffn(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    hot: torch.Tensor,
    cold: torch.Tensor,
    *,
    tile: int = DEFAULT_TILE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of the hot/cold split: the dense "match" FFN (the split changes no value) and its counts."""
    _check_gated_weights(x, w_gate, w_up, w_down)
    g = gate_preactivation(x, w_gate)
    return dense_gated_ffn_from_gate(x, g, w_up, w_down, precision="match"), split_counts(g, hot, cold, tile)
