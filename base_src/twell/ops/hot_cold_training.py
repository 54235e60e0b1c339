"""Hot/cold split of the sparse training op (issue 4): frequent units through GEMMs, the rest per pair.

Same function and rounding rules as :class:`twell.reference.training.GatedFFNL1` and the v1 op
(:mod:`twell.ops.training`) -- g rounded, u and h fp32, ``out`` and dX accumulated in fp32 and rounded
once, ``l1 = sum |h| / M``, ``l0`` the mean active units per token, gradients in the parameter dtype
with the L1 term included -- with one exception: the hot units' GEMM operands are rounded to the input
dtype (h_hot in the forward, dg_hot, du_hot and h_hot in the backward), as dense bf16 autograd rounds
them; their products still accumulate in fp32.

Why: at 0.5 % density v1 is 0.33x of dense at M=16384 (bench_results/h200/train_ffn.json), and the
units that fire often carry most pairs: on the synthetic profile at M=16384 the 576 units firing on
>= 0.6 % of the tokens carry 75 % of the 28 pairs per token (CPU count, ``synthetic_ffn_problem``),
so the per-pair kernels keep only ~7 pairs per token and the hot units become dense GEMMs.

Forward (H hot units, ``hot.slot`` maps a unit to its hot column or -1)::

    g      = round(x Wg[hot | cold]^T)     cuBLAS [M, F], hot-first columns, the only product over all F
                                           units; not saved
    u_hot  = x Wu[hot]^T                   cuBLAS, fp32 output [M, H] (saved)
    pack   : cold row-ELL (unit ids) + a_hot, h_hot = round(a_hot u_hot), hot |h| sums and counts
    init   = h_hot Wd[:, hot]^T            cuBLAS, fp32 output [M, d]
    out    = round(init + sum over cold pairs a u Wd[:, j])     row kernel (v1's, with an fp32 start)

Backward::

    dh_hot = dOut Wd[:, hot] + gl1 sign(h) / M;  dg_hot, du_hot     cuBLAS fp32 + elementwise kernel
    dX     = round([dg_hot | du_hot] [Wg[hot]; Wu[hot]] + cold pairs)           cuBLAS fp32 + row kernel
    [dWg; dWu][hot] = [dg_hot | du_hot]^T x,  dWd[:, hot]^T = h_hot^T dOut      cuBLAS (parameter dtype)
    cold rows of dWg, dWu, dWd^T: v1's unit-major gather (stable sort of the ELL ids, one program per unit)

Choices, with the numbers behind them:

* The gate GEMM runs on a hot-first copy of Wg (``hot.columns``; 23 MB read + written per call at
  d=2048, F=5632, since the weights change every step), so that the hot columns of g are contiguous and
  the cold pack scans only the cold ones with a column -> unit map.  Extracting the hot columns from g
  in unit order inside one pack (slot lookup and scattered stores per element) took 0.61-0.89 ms at
  M=16384, 0.5 % on an H200 over the tile shapes tried (3.1-6.7 ms at M=65536, 2 %;
  train_hot_cold_profile_pack2d.log), 15-22x the ~0.04 ms that reading g takes at 4.8 TB/s.  u_hot stays a
  second, narrow GEMM with an fp32 output (the oracle keeps u in fp32) rather than extra columns of
  the gate GEMM as in inference.
* Cold overflow without a dense fallback tail: a token with more than W cold pairs continues in
  continuation rows (up to C of them, default M), and the row kernels start with those tokens.  v1
  computes such rows densely in one program (F rows of Wg, Wu and Wd^T each, serially): at M=4096 it took
  14.2 ms (dense 1.4 ms) with 2 such rows (train_ffn.json), which that serial tail would explain (not
  profiled).  Only tokens past the capacity ("spilled") use v1's dense recomputation, so the result
  stays exact at any density.
* Default W from the hot set's expected cold l0: next power of two >= 2 cold_l0, in [8, 256] (32 when
  unknown).  On the synthetic profile at M=16384 (CPU count): 0.5 % -> cold l0 7.1, max 162, W=16 needs
  2380 continuation rows; 1 % -> H=1344, cold l0 8.9, W=32 needs 839; both far below C = 8192.  W and C
  set the sort size, (M + C) W keys (393 K at 0.5 %, v1 sorted M 256 = 4.2 M).
* No token splits in the weight-gradient kernel: a cold unit fires on < min_frequency of the tokens.
* Saved for backward (no [M, F] tensor): x and the weights, the H gathered rows, a_hot [M, H] (input
  dtype), u_hot [M, H] fp32, the ELL (ids, a, u) and its small index arrays.
* Deterministic: fixed-order sums everywhere, cuBLAS GEMMs, a stable sort; no atomics, no host sync
  (except choosing the hot set, which a caller does once and passes as :class:`HotUnits`).

Prediction (H200, bf16, d=2048, F=5632, M=16384, 0.5 %, H=576, ~7 cold pairs per token; to be checked
with ``twell bench train-ffn --sparse-impl hot-cold``): forward ~1.4 ms (gate GEMM 0.54 ms measured,
hot GEMMs ~0.15, pack ~0.3, cold rows ~0.35), backward ~1.5 ms (four hot GEMMs ~0.4, cold rows ~0.5,
sort ~0.05, unit kernel ~0.35); ~3 ms in all vs dense 5.6 ms (~1.8x), within 2.5-4 ms.  The per-pair
figures are the inference row-gather's 1.5-2.0 ns per pair scaled by the rows each pair reads.  Peak
extra memory ~0.4-0.5 GB (the transient g [M, F] and the fp32 [M, d] hot partials) vs dense 1.12 GB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .._validation import check_positive_int, check_tensor
from ..reference.inference import _check_gated_weights
from ._runtime import next_pow2, resolve_backend
from .hot_cold_plan import HOT_MULTIPLE, HotColdPlan, choose_hot_units, unit_frequency
from .hot_cold_train_kernels import (
    launch_backward_rows,
    launch_forward_rows,
    launch_hot_backward,
    launch_overflow_layout,
    launch_pack,
    launch_pack_continuation,
    launch_unit_grads,
)
from .inference import _unit_major
from .training import _DTYPES, _dense_gate

__all__ = [
    "HotColdGatedFFNL1",
    "HotUnits",
    "choose_training_hot_units",
    "default_cont_rows",
    "default_width",
    "hot_units",
    "hot_units_from_frequency",
    "twell_gated_ffn_l1_hot_cold",
]

#: Units firing on at least this fraction of tokens are hot in training.  The 0.6 % that inference used
#: until session 20 (training's H200 figures, 1.40-1.45x on the 1.5B step, were all measured with it);
#: inference moved to 1.3 % (``hot_cold_plan.HOT_MIN_FREQUENCY``) but training was not re-measured, and its
#: per-unit weight-gradient kernel runs a cold unit's pairs serially (~2x longer at 1.3 %).  Training also
#: goes without inference's bound on the cold pairs per token (``HOT_MAX_COLD_L0``: not measured here either).
TRAIN_HOT_MIN_FREQUENCY = 0.006
#: ELL width when the hot set carries no cold-l0 estimate.
UNKNOWN_L0_WIDTH = 32
#: Bounds of the default ELL width.
MIN_WIDTH, MAX_WIDTH = 8, 256


@dataclass(frozen=True)
class HotUnits:
    """The hot set of one layer, built by :func:`hot_units` (cache it: building it synchronises).

    Attributes:
        ids: int64 [H], the hot unit ids, increasing.
        slot: int32 [F], the column of unit j in the [M, H] hot tensors, -1 for a cold unit.
        columns: int64 [F], the units in hot-first order (the hot ids, then the cold ones, each
            increasing): the row order of the gate weight for the hot-first gate GEMM.
        cold_l0: expected cold active units per token (from a frequency sample), or None.
    """

    ids: torch.Tensor
    slot: torch.Tensor
    columns: torch.Tensor
    cold_l0: float | None = None

    @property
    def n_hot(self) -> int:
        return int(self.ids.shape[0])

    @property
    def n_units(self) -> int:
        return int(self.slot.shape[0])


def hot_units(ids: torch.Tensor, n_units: int, *, cold_l0: float | None = None) -> HotUnits:
    """Validated :class:`HotUnits` for unit ids ``ids`` (any order) of a layer with ``n_units`` units."""
    check_tensor(ids, "hot", ndim=1, dtypes=(torch.int32, torch.int64))
    if isinstance(n_units, bool) or not isinstance(n_units, int) or n_units < 0:
        raise ValueError(f"n_units must be an int >= 0, got {n_units!r}")
    ids = ids.to(torch.int64).sort().values
    if ids.numel():
        lo, hi = int(ids[0]), int(ids[-1])
        if lo < 0 or hi >= n_units:
            raise ValueError(f"hot unit ids must lie in [0, {n_units}), got range [{lo}, {hi}]")
        if bool((ids[1:] == ids[:-1]).any()):
            raise ValueError("hot unit ids must be unique")
    if cold_l0 is not None and not (math.isfinite(cold_l0) and cold_l0 >= 0):
        raise ValueError(f"cold_l0 must be a finite number >= 0, got {cold_l0}")
    slot = torch.full((n_units,), -1, dtype=torch.int32, device=ids.device)
    slot[ids] = torch.arange(ids.numel(), dtype=torch.int32, device=ids.device)
    columns = torch.cat([ids, torch.nonzero(slot < 0).reshape(-1)])
    return HotUnits(ids=ids, slot=slot, columns=columns, cold_l0=cold_l0)


def hot_units_from_frequency(
    frequency: torch.Tensor, *, min_frequency: float = TRAIN_HOT_MIN_FREQUENCY, multiple: int = HOT_MULTIPLE
) -> HotUnits:
    """Hot set chosen as in inference (:func:`twell.ops.choose_hot_units`), with its cold l0 estimate."""
    ids = choose_hot_units(frequency, min_frequency=min_frequency, multiple=multiple, max_cold_l0=None)
    cold_l0 = float(frequency.double().sum() - frequency[ids].double().sum())
    return hot_units(ids, frequency.shape[0], cold_l0=max(0.0, cold_l0))


def choose_training_hot_units(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    *,
    min_frequency: float = TRAIN_HOT_MIN_FREQUENCY,
    multiple: int = HOT_MULTIPLE,
) -> HotUnits:
    """Hot set from a token sample of ``x`` (:func:`twell.ops.unit_frequency`): one extra GEMM and a sync."""
    with torch.no_grad():
        freq = unit_frequency(x.detach(), w_gate.detach())
    return hot_units_from_frequency(freq, min_frequency=min_frequency, multiple=multiple)


def default_width(hot: HotUnits) -> int:
    """ELL width W: next power of two >= 2 * cold_l0 within [8, 256], 32 without an estimate (docstring)."""
    if hot.cold_l0 is None:
        w = UNKNOWN_L0_WIDTH
    else:
        w = min(MAX_WIDTH, max(MIN_WIDTH, next_pow2(math.ceil(2 * hot.cold_l0))))
    return max(1, min(w, hot.n_units - hot.n_hot))


def default_cont_rows(m: int) -> int:
    """Continuation-row capacity C = M: with W >= 2 cold_l0 the main and continuation rows hold
    2 M W >= 4 M cold_l0 pairs, so a batch whose cold l0 runs up to 4x the hot set's estimate (a hot
    set chosen on other tokens) still spills no token.  Each extra row costs 18 W bytes (ids, vals, u,
    dg, du): 4.7 MB at M=16384, W=16."""
    return m


def _mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b`` accumulated in fp32, returned in ``out_dtype`` (rounded once).

    cuBLAS on CUDA; under the interpreter the CPU computes it in fp32 explicitly, so the result does not
    depend on how its back-end handles half-precision matmuls (as ``training._dense_gate``)."""
    if a.is_cuda:
        return torch.mm(a, b) if out_dtype == a.dtype else torch.mm(a, b, out_dtype=out_dtype)
    return (a.float() @ b.float()).to(out_dtype)


def overflow_layout_reference(
    counts: torch.Tensor, width: int, cont_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(lo, hi, ocum, n_spill)``: continuation rows [lo, hi) per token (-1: spilled), the inclusive
    count of overflowing tokens, and the number of spilled ones (1-element).  Fixed sizes, on the device.
    The pure-PyTorch twin of :func:`twell.ops.hot_cold_train_kernels.launch_overflow_layout`."""
    over = counts > width
    n_cont = torch.where(over, (counts - 1) // width, 0)  # ceil((count - W) / W) rows past the main one
    hi = torch.cumsum(n_cont, 0, dtype=torch.int32)  # < 2**31: at most M F / W rows
    lo = hi - n_cont
    spill = over & (hi > cont_rows)
    ocum = torch.cumsum(over, 0, dtype=torch.int32)
    n_spill = spill.sum(dtype=torch.int32).reshape(1)
    return lo.masked_fill(spill, -1), hi.masked_fill(spill, -1), ocum, n_spill


def _hc_forward(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, hot_ids: torch.Tensor,
    columns: torch.Tensor, slot: torch.Tensor, width: int, cont_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """The forward of the op for M >= 1 tokens and F >= 1 units (module docstring): ``(out, l1, l0,
    spilled, wdt, saved)`` with ``saved`` = (w_hot, wd_hot, a_hot, u_hot, ids, vals, u, counts, lo, hi,
    order, owner, ocum, n_spill), fresh tensors ([0, d] / [M, 0] ones without hot units), and wdt the
    unit-major Wd^T (a view of w_down when that is the transpose of a contiguous tensor)."""
    m, d = x.shape
    n_hot = hot_ids.shape[0]
    x, wg, wu = x.contiguous(), w_gate.contiguous(), w_up.contiguous()
    wdt = _unit_major(w_down)
    # The hot-first gate (hot units' columns first): the hot columns are then contiguous for the hot
    # pack and the cold pack scans only the cold ones (the price: a 23 MB row copy of Wg at 2048 x 5632).
    g = _dense_gate(x, wg.index_select(0, columns) if n_hot else wg)
    w_hot = torch.empty((2 * n_hot, d), dtype=x.dtype, device=x.device)  # [Wg[hot]; Wu[hot]]
    if n_hot:
        torch.index_select(wg, 0, hot_ids, out=w_hot[:n_hot])
        torch.index_select(wu, 0, hot_ids, out=w_hot[n_hot:])
        wd_hot = wdt.index_select(0, hot_ids)  # Wd[:, hot]^T [H, d]
        u_hot = _mm(x, w_hot[n_hot:].t(), torch.float32)
    else:
        wd_hot = torch.empty((0, d), dtype=x.dtype, device=x.device)
        u_hot = torch.empty((m, 0), dtype=torch.float32, device=x.device)
    ids, vals, counts, a_hot, h_hot, hot_l1, hot_nz = launch_pack(g, columns, n_hot, u_hot, width, cont_rows)
    lo, hi, ocum, n_spill, l0 = launch_overflow_layout(counts, hot_nz, width, cont_rows)
    order, owner = launch_pack_continuation(g, columns, n_hot, ids, vals, counts, lo, hi, ocum)
    del g
    init = _mm(h_hot, wd_hot, torch.float32) if n_hot else None
    del h_hot
    out, u, row_l1 = launch_forward_rows(x, wg, wu, wdt, slot, ids, vals, counts, lo, hi, order, init, hot_l1)
    del init
    l1 = row_l1.sum() / m
    saved = (w_hot, wd_hot, a_hot, u_hot, ids, vals, u, counts, lo, hi, order, owner, ocum, n_spill)
    return out, l1, l0, n_spill, wdt, saved


def _hc_backward(
    grad_out: torch.Tensor, grad_l1: torch.Tensor, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
    wdt: torch.Tensor, slot: torch.Tensor, saved: tuple[torch.Tensor, ...], need: tuple[bool, bool, bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``(dx, dWg, dWu, dWd^T)`` of :func:`_hc_forward` (None where ``need`` says no; dWd^T unit-major)."""
    need_x, need_wg, need_wu, need_wd = need
    (w_hot, wd_hot, a_hot, u_hot, ids, vals, u, counts, lo, hi, order, owner, ocum, n_spill) = saved
    x, wg, wu = x.contiguous(), w_gate.contiguous(), w_up.contiguous()
    f = wg.shape[0]
    go = grad_out.to(x.dtype).contiguous()
    gl1 = grad_l1.detach().to(torch.float32).reshape(1).contiguous()
    need_w = need_wg or need_wu or need_wd
    dx_init = hot_gu = hot_wd = None
    if wd_hot.shape[0]:
        dgu, h_hot = launch_hot_backward(_mm(go, wd_hot.t(), torch.float32), a_hot, u_hot, gl1)
        if need_x:
            dx_init = _mm(dgu, w_hot, torch.float32)
        if need_w:
            hot_gu = _mm(dgu.t(), x, wg.dtype)
            hot_wd = _mm(h_hot.t(), go, wg.dtype)
        del dgu, h_hot
    dx, dg, du = launch_backward_rows(x, go, wg, wu, wdt, slot, ids, vals, counts, lo, hi, order, u, gl1, dx_init)
    del dx_init
    dwg = dwu = dwdt = None
    if need_w:
        sorted_ids, perm = torch.sort(ids.reshape(-1), stable=True)
        starts = torch.searchsorted(sorted_ids, torch.arange(f + 1, dtype=sorted_ids.dtype, device=x.device))
        del sorted_ids
        dwg, dwu, dwdt = launch_unit_grads(x, go, wg, wu, wdt, slot, perm, starts, owner, vals, u, dg, du, order,
                                           ocum, n_spill, gl1, hot_gu, hot_wd)
    return ((dx if need_x else None), (dwg if need_wg else None), (dwu if need_wu else None),
            (dwdt if need_wd else None))


class HotColdGatedFFNL1(torch.autograd.Function):
    """``(out, l1) = HotColdGatedFFNL1.apply(x, w_gate, w_up, w_down, hot, width, cont_rows, stats)``.

    ``hot`` a :class:`HotUnits` on x's device, ``width`` the ELL width W (<= the cold unit count),
    ``cont_rows`` the continuation capacity C; ``stats`` (dict or None) receives ``"l0"`` and
    ``"spilled_tokens"``.  Inputs are validated by :func:`twell_gated_ffn_l1_hot_cold`; the module
    docstring has the algorithm.  Under torch.compile the same computation runs as the custom op
    ``twell::hot_cold_gated_ffn_l1`` (:mod:`twell.ops.hot_cold_training_op`).
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
        hot: HotUnits, width: int, cont_rows: int, stats: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m, d = x.shape
        f = w_gate.shape[0]
        ctx.down_view = w_down.t().is_contiguous()  # then dWd is returned as the same kind of view
        ctx.empty = m == 0 or f == 0
        if ctx.empty:
            ctx.shapes = (x.shape, w_gate.shape, w_up.shape, w_down.shape)
            if stats is not None:
                stats["l0"] = torch.zeros((), dtype=torch.float32, device=x.device)
                stats["spilled_tokens"] = torch.zeros((1,), dtype=torch.int32, device=x.device)
            return torch.zeros((m, d), dtype=x.dtype, device=x.device), torch.zeros((), device=x.device)
        out, l1, l0, n_spill, wdt, saved = _hc_forward(x, w_gate, w_up, w_down, hot.ids, hot.columns, hot.slot,
                                                       width, cont_rows)
        ctx.save_for_backward(x, w_gate, w_up, wdt, hot.slot, *saved)
        if stats is not None:
            stats["l0"] = l0
            stats["spilled_tokens"] = n_spill
        return out, l1

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_l1: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        need = tuple(ctx.needs_input_grad[:4])
        nones = (None,) * 4
        if ctx.empty:
            return tuple(
                torch.zeros(s, dtype=grad_out.dtype, device=grad_out.device) if n else None
                for s, n in zip(ctx.shapes, need, strict=True)
            ) + nones
        x, wg, wu, wdt, slot, *saved = ctx.saved_tensors
        dx, dwg, dwu, dwdt = _hc_backward(grad_out, grad_l1, x, wg, wu, wdt, slot, tuple(saved), need)
        dwd = None if dwdt is None else (dwdt.t() if ctx.down_view else dwdt.t().contiguous())
        return dx, dwg, dwu, dwd, *nones


def _resolve_hot(hot: object, x: torch.Tensor, w_gate: torch.Tensor) -> HotUnits:
    f = w_gate.shape[0]
    if hot is None:
        return choose_training_hot_units(x, w_gate)
    if isinstance(hot, HotUnits):
        if hot.n_units != f:
            raise ValueError(f"hot was built for {hot.n_units} units but w_gate has F = {f}")
        if hot.slot.device != x.device:
            raise ValueError(f"hot is on device {hot.slot.device} but x is on {x.device}")
        return hot
    if isinstance(hot, HotColdPlan):
        return hot_units(hot.hot.to(x.device), f)
    if isinstance(hot, torch.Tensor):
        return hot_units(hot.to(x.device), f)
    raise TypeError(f"hot must be HotUnits, a HotColdPlan, a tensor of unit ids or None; got {type(hot).__name__}")


def twell_gated_ffn_l1_hot_cold(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    hot: HotUnits | HotColdPlan | torch.Tensor | None = None,
    *,
    width: int | None = None,
    cont_rows: int | None = None,
    stats: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse gated FFN with L1 penalty, hot units dense: ``(out [M, d], l1, l0)`` (module docstring).

    Same contract as :func:`twell.ops.twell_gated_ffn_l1`: x [M, d]; w_gate, w_up [F, d]; w_down [d, F]
    (the transpose of a contiguous [F, d] tensor spares a copy per call, and its gradient comes back as
    the same kind of view); float16, bfloat16 or float32 on CUDA, or on the CPU under TRITON_INTERPRET=1.

    ``hot``: a :class:`HotUnits` (cache it per layer: no host synchronisation then), a HotColdPlan or a
    tensor of unit ids (validated: one synchronisation), or None to choose from a 4096-token sample of x
    (one extra [4096, F] GEMM and a synchronisation per call).  Which units are hot never changes the
    result beyond fp32 summation order and the rounding of hot GEMM operands, only the time.
    ``width``: cold row-ELL width W (default :func:`default_width`); ``cont_rows``: continuation-row
    capacity C (default :func:`default_cont_rows`; 0 sends every token with more than W cold pairs to the
    dense recompute).  ``stats``, if given, receives ``"spilled_tokens"`` (int32 [1], on the device: the
    tokens whose cold pairs did not fit and were recomputed densely -- slow, so a count to watch) and
    ``"l0"``.
    """
    _check_gated_weights(x, w_gate, w_up, w_down)
    if x.dtype not in _DTYPES:
        name = str(x.dtype).replace("torch.", "")
        raise TypeError(f"twell_gated_ffn_l1_hot_cold takes float16, bfloat16 or float32 inputs, got {name} (the "
                        "float64 oracle is twell.reference.training.gated_ffn_l1)")
    resolve_backend("triton", x.device)
    units = _resolve_hot(hot, x, w_gate)
    n_cold = units.n_units - units.n_hot
    w = default_width(units) if width is None else max(1, min(check_positive_int(width, "width"), n_cold))
    if cont_rows is None:
        c = default_cont_rows(x.shape[0])
    elif isinstance(cont_rows, bool) or not isinstance(cont_rows, int) or cont_rows < 0:
        raise ValueError(f"cont_rows must be an int >= 0, got {cont_rows!r}")
    else:
        c = cont_rows
    stats = {} if stats is None else stats
    if torch.compiler.is_compiling() and x.shape[0] and w_gate.shape[0]:
        # Traced by torch.compile: the custom-op form, which dynamo keeps in the graph (the Function breaks it).
        from .hot_cold_training_op import hot_cold_gated_ffn_l1_op

        res = hot_cold_gated_ffn_l1_op(x, w_gate, w_up, w_down, units.ids, units.columns, units.slot, w, c)
        stats["l0"], stats["spilled_tokens"] = res[2], res[3]
        return res[0], res[1], res[2]
    out, l1 = HotColdGatedFFNL1.apply(x, w_gate, w_up, w_down, units, w, c, stats)
    return out, l1, stats["l0"]
