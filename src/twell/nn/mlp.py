"""``SparseGatedMLP``: a drop-in ReLU-gated MLP layer that runs the TwELL kernels when they pay off.

The layer computes ``down_proj(relu(gate_proj(x)) * up_proj(x))`` with the parameter names and layouts
of a Hugging Face Llama MLP (``gate_proj``/``up_proj`` are ``nn.Linear(hidden, inter)``, ``down_proj`` is
``nn.Linear(inter, hidden)``, no biases), so state dicts interchange; only the activation differs
(ReLU instead of SiLU, which is what makes the activation sparse).

Three execution paths:

* **training** (``module.training`` and grad mode on): the FFN with its L1 penalty (``last_l1``,
  differentiable) and l0 (``last_l0``), through dense autograd, the sparse autograd reference or the
  Triton training op (``train_impl``; ``"auto"`` switches per layer between the last and dense autograd,
  :mod:`twell.nn.train_dispatch`).  The call lives only in :meth:`SparseGatedMLP._ffn_train`.
* **sparse inference**: ``torch.ops.twell.hot_cold_gated_ffn`` (frequent units dense, the rest through
  TwELL; ``hot_cold``) or ``torch.ops.twell.sparse_gated_ffn`` (= :func:`twell.ops.sparse_gated_ffn`,
  method chosen from M), registered custom ops so ``torch.compile`` captures them.
* **dense inference**: ``F.linear(F.relu(F.linear(x, Wg)) * F.linear(x, Wu), Wd)``, i.e. cuBLAS.

Between the two inference paths a :class:`~twell.nn.dispatch.DispatchPolicy` decides from the token
count and the layer's density l0 / F.  The decision must not cost a device-to-host synchronisation per
call (that would stall the CPU's kernel queue every layer of every decode step), so it reads a host
float ``_l0_estimate`` that is refreshed from the device-side ``last_l0`` only once every
``l0_refresh_every`` inference calls.  The sparse path gets ``last_l0`` for free from the TwELL counts
(a device-side reduction, every call); the dense path measures it (``mean_active_per_token`` of the gate
activation) only on those refresh calls.  Before the first estimate the density is taken as 1, the
worst case, which means dense under any table that is not "always sparse", and the call measures it.
The policy's answer is cached per token count until the policy or the estimate changes.

Per call the inference path does as little host work as it can (decode calls every layer once per
token, and at a few tokens the host is the bottleneck; ``scripts/module_overhead.py`` times it): a
dense call that is not a refresh call runs exactly the plain dense chain's ops on ``x`` as given,
and the sparse path validates the weights once per weight change and then calls unchecked twins of
the custom ops (``torch.ops.twell.*_unchecked``).  The caches it keeps (Wd^T unit-major, the hot/cold
plan) are built with inference mode off, so they never hold inference tensors.

Inference with gradients required (eval mode but grad mode on and a parameter or the input requiring
grad) takes the dense path whatever the policy says: the sparse inference ops have no backward, and
falling back silently to wrong gradients is worse than being slower.  Run inference under
``torch.no_grad()`` or ``torch.inference_mode()`` to get the sparse kernels.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops as _ops  # noqa: F401 - registers torch.ops.twell.*
from .._validation import (
    FLOAT_DTYPES,
    check_positive_int,
    check_residual,
    check_same_device,
    check_same_dtype,
    check_tensor,
)
from ..format.twell import DEFAULT_TILE, MAX_TILE, default_capacity
from ..ops._runtime import BACKENDS, cuda_capability, resolve_backend
from ..ops.active_count import mean_active_per_token
from ..ops.decode import launch_decode_ffn
from ..ops.hot_cold import launch_hot_cold_ffn
from ..ops.hot_cold_plan import HotColdPlan, fused_gate_tile, plan_weight_copies
from ..ops.hot_cold_training import (
    HotUnits,
    choose_training_hot_units,
    default_width,
    twell_gated_ffn_l1_hot_cold,
)
from ..ops.inference import PRECISIONS, TRITON_TILES, _check_triton_dtype
from ..ops.training import twell_gated_ffn_l1
from ..reference.training import dense_gated_ffn_l1, gated_ffn_l1
from . import call_graphs
from .call_graphs import GraphedCall, LayerGraphs
from .dispatch import DEFAULT_POLICY, DispatchPolicy, dense_ffn_flops, density_of
from .hot_cold_cache import HotColdCache
from .train_dispatch import (
    DEFAULT_TRAIN_POLICY,
    TrainDispatchPolicy,
    TrainSwitch,
    _in_backward,
    autocast_dtype,
    dense_train_ffn_l1,
    sparse_train_fn,
)

#: Training FFN implementations (see ``SparseGatedMLP``'s ``train_impl``).
TRAIN_IMPLS = ("auto", "dense", "sparse-reference", "triton", "hot-cold")

# The sparse reference and the v1 Triton op are autograd Functions that dynamo cannot trace whole: inside a compiled
# training step their data-dependent pair counts reached the graph after the break as sizes, and a 4-step
# ``twell train --compile --train-ffn sparse-reference`` run on the CPU hit dynamo's recompile limit (8) on them
# (session 55).  Called through these, each runs eagerly as one opaque call instead; eager calls are unchanged.
_EAGER_SPARSE_REFERENCE = torch.compiler.disable(gated_ffn_l1)
_EAGER_TWELL_V1 = torch.compiler.disable(twell_gated_ffn_l1)

__all__ = ["DenseReluGatedMLP", "SparseGatedMLP", "static_dispatch"]


#: Bound on the per-layer cache of dispatch decisions (one entry per distinct token count; prefill
#: lengths vary, so the cache must not grow without limit).
_MAX_CACHED_DECISIONS = 256
#: Generation numbers of _SparsePrep, unique in the process: the hot/cold plan is keyed on it.
_PREP_GENERATIONS = itertools.count()


class _StaticDispatchDepth:
    """How many :func:`static_dispatch` contexts are open, how many of them read the layers' cached
    unit-major Wd^T in decode calls, and how many read the layers' cached copies in hot/cold and TwELL calls
    (class attributes: one read per call)."""

    depth = 0
    unit_major_down = 0
    cached_weights = 0


_STATIC_DISPATCH = _StaticDispatchDepth


@contextlib.contextmanager
def static_dispatch(*, unit_major_down: bool = False, cached_weights: bool = False) -> Iterator[None]:
    """Inside this context every :class:`SparseGatedMLP` inference call takes the path that
    torch.compile traces: the kernels chosen from the layer's current l0 estimate, with no call
    counting, no l0 refresh and no host synchronisation, so the same kernels run on every call.  That
    is what recording a CUDA graph needs (a refresh call's device-to-host read is illegal during
    capture, and a replay repeats the recorded kernels whatever the Python would decide);
    :func:`twell.generation.greedy_decode` records its decode step inside it.  Run ordinary (eager)
    calls first, e.g. the prompt's forward, so that the estimates exist.  Training calls are unaffected.
    The policy's eager floor does not apply inside it; a call traced by torch.compile outside it counts as eager,
    so trace a graph that will be recorded (``mode="reduce-overhead"``) inside this context.

    ``unit_major_down``: small-batch (decode) calls read the layer's cached unit-major Wd^T
    (:meth:`SparseGatedMLP.w_down_unit_major`) instead of the ``.t()`` view of the weight, so that the
    one-token kernel loads a firing unit's down row whole (bench_results/h200/
    decode_probe_fire_units_session7.log: 14.9 against 17.8 us at d=2048, F=5632, 0.5 %).  Nothing checks
    that copy inside the context (a traced or recorded call cannot): the caller calls
    ``w_down_unit_major()`` on every layer after the last weight change and before entering, and keys
    anything it records on those copies' storage, as :class:`twell.generation.GreedyDecoder` does.  A
    layer without a cached copy reads the view.

    ``cached_weights``: hot/cold and TwELL calls read the layer's cached weight copies (the hot/cold plan's gate
    layout and hot Wd^T, and the unit-major Wd^T) instead of building them from the weights on every call, the way a
    traced call otherwise must (no dynamo guard sees an in-place weight update). Per call those copies write ~54 MB
    and read as much at d=2048, F=5632 with ~1000 hot units (Wd^T 23 MB, the fused gate layout ~27 MB, the hot Wd
    columns ~4 MB). Measured on an H100 (session 47, ``bench_results/h100/session47_runs.md``): the 1.5B model's
    recorded forward 28.88 -> 26.94 ms at 4096 tokens (0.921x -> 0.988x of recorded dense) and 47.46 -> 46.10 ms at
    8192 (1.083x -> 1.114x). As with ``unit_major_down`` nothing checks the copies inside the context: the
    caller calls :meth:`SparseGatedMLP.prepare_static_weights` on every layer (``twell.nn.prepare_static_weights``
    does, given the model) after the last weight change and before tracing or recording, which also marks them as
    static addresses for CUDA graphs (copies left from an eager call before a weight change would be read stale). A
    layer with no cached copies builds them per call as before."""
    _STATIC_DISPATCH.depth += 1
    _STATIC_DISPATCH.unit_major_down += int(unit_major_down)
    _STATIC_DISPATCH.cached_weights += int(cached_weights)
    try:
        yield
    finally:
        _STATIC_DISPATCH.depth -= 1
        _STATIC_DISPATCH.unit_major_down -= int(unit_major_down)
        _STATIC_DISPATCH.cached_weights -= int(cached_weights)


class _InferenceState:
    """Host-side bookkeeping of one layer's inference calls.

    A plain object with slots rather than attributes of the ``nn.Module``: assigning an attribute of
    a Module goes through ``Module.__setattr__`` (1.26 us on the CPU, scripts/module_overhead.py),
    and the call counter changes on every call.
    """

    __slots__ = ("calls", "decided_estimate", "decided_policy", "decisions", "eager_floor", "eager_floor_policy",
                 "estimate", "l0", "l0_counts", "l0_tokens", "refresh_now")

    def __init__(self) -> None:
        self.calls = 0  # inference calls since the last reset: every l0_refresh_every-th one refreshes
        self.estimate: float | None = None  # host copy of l0, refreshed on refresh calls
        self.refresh_now = False  # set by _ffn_infer: this call may re-choose the hot units
        # Cached dispatch answers per (token count, device, eager), valid for this policy and estimate.
        self.decided_policy: DispatchPolicy | None = None
        self.decided_estimate: float | None = None
        self.decisions: dict[tuple[int, torch.device | str, bool], str] = {}
        # The policy's eager floor in tokens for this layer's shape (DispatchPolicy.eager_floor_tokens), valid for
        # eager_floor_policy.
        self.eager_floor_policy: DispatchPolicy | None = None
        self.eager_floor = 0
        # The layer's last_l0: a tensor, or the last sparse call's per-(row, tile) counts and token count
        # from which it is summed when first read (see SparseGatedMLP.last_l0).
        self.l0: torch.Tensor | None = None
        self.l0_counts: torch.Tensor | None = None
        self.l0_tokens = 0

    def set_l0(self, value: torch.Tensor | None) -> None:
        self.l0, self.l0_counts = value, None

    def read_l0(self) -> torch.Tensor | None:
        if self.l0_counts is not None:
            # An fp32 sum (exact while M * l0 < 2^24, off by ~1e-7 relative beyond) and an in-place divide.
            self.l0 = self.l0_counts.sum(dtype=torch.float32).div_(self.l0_tokens)
            self.l0_counts = None
        return self.l0


class _SparsePrep(NamedTuple):
    """What the sparse path derived from one state of the weights (see ``SparseGatedMLP._prepare_sparse``)."""

    key: tuple[int, ...] | None  # (data_ptr, version) of Wg, Wu, Wd; None for inference-tensor weights
    generation: int  # unique per rebuild: the key of the hot/cold plan
    refs: tuple[weakref.ref, ...]  # the weights themselves, for the identity check
    backend: str  # "torch" or "triton", resolved for the weights' device
    capacity: int  # resolved (the format's default when the layer's is None)
    hot_cold: bool  # the hot/cold split applies


#: The dense path's residual (``forward(x, residual=...)``) added in cuBLAS's epilogue on CUDA (``torch.addmm``, the
#: sum rounded once) instead of by a separate add after ``F.linear``.  On the H200 (M=131072, d=2048, F=5632, bf16) the
#: down projection alone took 4.709 ms with it against 4.915 ms (session 23, attention_probe_session23.log), but the
#: whole dense FFN, interleaved, 13.403 against 13.226 ms (session 24, residual_probe_session24.log), and the 1.5B
#: forward's dense variant moved 187.5 -> 187.6 tokens/ms with it: off, so the dense path's residual add is the
#: unfused ``residual + F.linear(...)`` and its bits are the unfused layer's.  (Off the GPU it is never used.)
DENSE_RESIDUAL_ADDMM = False
#: Eager inference calls on the hot/cold split call its launcher directly, as eager decode calls do, instead of going
#: through the ``twell::hot_cold_gated_ffn_unchecked`` custom op (which torch.compile captures; traced calls always
#: take it).  On the CPU with the launches stubbed the module's call went 97.5 -> 55.2 us with this and the launchers'
#: plain-Python ``cdiv`` (bench_results/cpu/module_overhead_session40_{before,after}.log); on the GPU machine's host
#: the change was inside the spread between processes (session 40, bench_results/h200/session40_runs.md), so
#: ``scripts/op_host_time.py --ab`` flips this switch within one process.  On.
EAGER_HOT_COLD_LAUNCH = True


def _dense_ffn(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense ReLU-gated FFN with plain ``F.linear`` (cuBLAS on the GPU); returns ``(out, relu(gate))``.
    With ``residual`` (x's shape) ``out`` is ``residual + FFN(x)`` (see :data:`DENSE_RESIDUAL_ADDMM`)."""
    a = F.relu(F.linear(x, w_gate))
    h = a * F.linear(x, w_up)
    if residual is None:
        return F.linear(h, w_down), a
    if DENSE_RESIDUAL_ADDMM and x.is_cuda:
        out = torch.addmm(residual.reshape(-1, residual.shape[-1]), h.reshape(-1, h.shape[-1]), w_down.t())
        return out.view(residual.shape), a
    return residual + F.linear(h, w_down), a


def _check_eager_graphs(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"eager_graphs must be an int >= 0 (token counts whose eager calls are recorded in CUDA "
                         f"graphs; 0: none), got {value!r}")
    return value


def _check_sizes(hidden_size: object, intermediate_size: object) -> None:
    check_positive_int(hidden_size, "hidden_size")
    check_positive_int(intermediate_size, "intermediate_size")


def _check_input(x: object, hidden_size: int, weight: torch.Tensor, *, autocast_ok: bool = False) -> torch.Tensor:
    """x must be a [..., hidden_size] tensor with the weights' dtype and device.

    ``autocast_ok``: x may instead have the autocast dtype when autocast is on for its device (the
    training path casts both to it).
    """
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    assert isinstance(x, torch.Tensor)
    if x.dim() == 0 or x.shape[-1] != hidden_size:
        raise ValueError(
            f"x has shape {tuple(x.shape)} but the layer needs [..., hidden_size] with hidden_size={hidden_size} "
            f"(gate_proj.weight has shape {tuple(weight.shape)})"
        )
    autocast = autocast_ok and x.dtype == autocast_dtype(x.device.type)
    if x.dtype != weight.dtype and not autocast:
        raise TypeError(
            f"x has dtype {str(x.dtype).replace('torch.', '')} but the layer's weights are "
            f"{str(weight.dtype).replace('torch.', '')}; cast x or the module (module.to(dtype))"
        )
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} but the layer's weights are on {weight.device}; move one of them")
    return x


class DenseReluGatedMLP(nn.Module):
    """The plain dense ReLU-gated MLP ``down_proj(relu(gate_proj(x)) * up_proj(x))``, Llama parameter names.

    It is what :meth:`SparseGatedMLP.to_dense` returns: the same math as the sparse layer's dense
    path (bit-identical on the same device), with no dispatch and no statistics, for export or
    comparison.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_sizes(hidden_size, intermediate_size)
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        kw: dict[str, Any] = {"bias": False, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x [..., hidden_size]`` -> the FFN's output, or ``residual + FFN(x)`` with ``residual`` (x's shape,
        dtype and device; the decoder layer's add done here: :func:`twell.nn.fuse_residual_adds`)."""
        _check_input(x, self.hidden_size, self.gate_proj.weight)
        if residual is not None:
            check_residual(residual, x)
        return _dense_ffn(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, residual)[0]

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, act=relu"


class SparseGatedMLP(nn.Module):
    """ReLU-gated MLP that dispatches between the TwELL kernels and the dense path (see the module docs).

    Args:
        hidden_size, intermediate_size: d and F.
        backend: ``"auto"`` (Triton on CUDA, else PyTorch), ``"torch"`` or ``"triton"``; used by the sparse
            inference path only.
        tile, capacity: TwELL layout of the gate activation (``capacity`` None: the format's default, tile/8).
        precision: ``"match"`` or ``"fp32"`` rounding of the sparse path (see :mod:`twell.ops.inference`);
            the dense path is whatever cuBLAS computes in the input dtype.
        policy: the :class:`DispatchPolicy`; None means :data:`DEFAULT_POLICY`.
        l0_refresh_every: the host-side l0 estimate is refreshed (one device sync) every this many
            inference calls.
        train_impl: how a training forward computes the FFN with its L1 term: ``"sparse-reference"`` (the
            sparse autograd reference, :class:`twell.reference.training.GatedFFNL1`, which saves only
            the active pairs), ``"dense"`` (plain dense autograd of the same function, same l1 and l0) or
            ``"triton"`` (the first sparse Triton training kernels, :func:`twell.ops.twell_gated_ffn_l1`: exact,
            but 0.33x of dense at M=16384 on an H200), ``"hot-cold"``
            (:func:`twell.ops.twell_gated_ffn_l1_hot_cold`: frequent units through dense GEMMs, the rest
            through sparse kernels; at 0.5 % density on an H200 1.72x of dense at M=16384 and 2.48x at
            M=65536, 68-71 % less extra memory; hot set re-chosen every ``l0_refresh_every``
            calls) or ``"auto"``: per layer
            and call, the hot/cold op when ``train_policy`` says the layer's l0 is low enough for its token
            count (on CUDA with Triton), else dense autograd in the compute dtype
            (:func:`twell.nn.train_dispatch.dense_train_ffn_l1`).  The default policy's table holds the H200
            bf16 crossings for 2048 x 5632 (sparse from 16384 tokens up to 10 % density); other shapes train
            dense.
            Under autocast every path but that dense one (which autocasts by itself) runs on inputs and
            weights cast to the autocast dtype, with autocast off inside, as an autocast ``F.linear`` would.
        train_policy: the :class:`~twell.nn.train_dispatch.TrainDispatchPolicy` of ``"auto"``; None means
            :data:`~twell.nn.train_dispatch.DEFAULT_TRAIN_POLICY`.  ``l0_refresh_every`` also sets how
            many training calls pass between two host reads of l0.
        hot_cold: on the Triton sparse inference path with ``precision="match"``, split the units: those
            firing on >= 1.3 % of tokens, and more where that leaves over 3-13 cold pairs per token by call
            size and density (``ops.choose_hot_units``, ``hot_cold_plan.default_max_cold_l0``; re-chosen from a
            4096-token sample on l0-refresh calls), are
            computed densely inside the gate GEMM, the rest through TwELL (:mod:`twell.ops.hot_cold`).
            Costs a reordered copy of Wg plus the hot rows of Wu and Wd ((F + 2H) / F of the gate
            weight: 1.09x with 256 hot units, 1.82x with 2304 at d=2048, F=5632, session 20's sets at
            0.5 % and 2 %).  Not used when the weights are inference tensors (created under
            ``torch.inference_mode``): they have no version counter, so a cached plan could go stale unseen.
        eager_graphs: for eager inference calls that the tables send to the hot/cold split (on CUDA), below the
            policy's eager floor from :data:`twell.nn.call_graphs.RECORD_MIN_FLOPS` of work (4096 tokens at 2048 x
            5632) and at or above it up to :data:`~twell.nn.call_graphs.RECORD_MAX_FLOPS` (12,288 tokens there),
            record the call of each of the first this many token counts that come twice in a CUDA graph and replay
            it on later calls of that count (a count that :data:`~twell.nn.call_graphs.STALE_CALLS` calls have not
            used gives its place to a new one), so the host issues one graph launch and two copies instead of the
            op's ~15 launches (:mod:`twell.nn.call_graphs`).  The 1.5B model's eager forward, recorded against
            dense: 1.00-1.09x at 4096 tokens, 1.16-1.20x at 6144, 1.21-1.26x at 8192 and 1.25-1.37x at 12,288 on an
            H200 (session 58; the unrecorded default 0.99-1.00x below its floor, 0.77-1.32x at 12,288), 1.00-1.22x
            at 4096 and 1.15-1.24x at 6144-8192 on two H100 machines (session 57).  Default
            :data:`~twell.nn.call_graphs.DEFAULT_COUNTS` (4); 0: none (below the floor such calls run dense).  The
            first call of a count runs as without graphs, the second runs the split eagerly and records it, l0
            refresh calls run the split eagerly (they re-choose the hot units); a new hot set, weight change, dtype
            or stream drops the recordings.  Each recorded count keeps a static input and output per layer shape
            and stream (96 MB at 12,288 tokens, d=2048, bf16), shared by the layers of that shape; the recordings
            of a device and stream share one memory pool, and a lock (``call_graphs.LOCK``) keeps threads that
            call on one stream from interleaving a replay's copies.  Set it on a whole model with
            :func:`twell.nn.graph_eager_calls`.
        device, dtype: of the parameters, as for ``nn.Linear``.

    Attributes set by ``forward``: ``last_l0`` (float32 scalar tensor on the layer's device, no grad; the
    mean number of active units per token, when measured) and ``last_l1`` (the differentiable L1 penalty
    of the last training forward; None after an inference forward).  After a sparse inference call
    ``last_l0`` is summed from the call's TwELL counts when it is first read, so a call whose l0 nobody
    reads launches no kernel for it; the counts (int32, one per token and tile of units: 2.9 MB at 16,384
    tokens, F=5632 and tile 128, 1/23 of that call's input x at d=2048) are held until then or until the next call.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        backend: str = "auto",
        tile: int = DEFAULT_TILE,
        capacity: int | None = None,
        precision: str = "match",
        policy: DispatchPolicy | None = None,
        l0_refresh_every: int = 64,
        train_impl: str = "auto",
        train_policy: TrainDispatchPolicy | None = None,
        hot_cold: bool = True,
        eager_graphs: int = call_graphs.DEFAULT_COUNTS,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if train_impl not in TRAIN_IMPLS:
            raise ValueError(f"train_impl must be one of {', '.join(TRAIN_IMPLS)}; got {train_impl!r}")
        _check_sizes(hidden_size, intermediate_size)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
        check_positive_int(tile, "tile", maximum=MAX_TILE)
        # "auto" runs Triton as soon as the layer is on a GPU, so its tile is checked as Triton's: the
        # error then comes at construction, not at the first GPU call deep inside a model.
        if backend != "torch" and tile not in TRITON_TILES:
            raise ValueError(
                f"tile={tile} is not one the Triton kernels take {TRITON_TILES} (backend={backend!r}); "
                "pick one of those or use backend='torch'"
            )
        if capacity is not None:
            check_positive_int(capacity, "capacity", maximum=tile)
        if policy is None:
            policy = DEFAULT_POLICY
        if not isinstance(policy, DispatchPolicy):
            raise TypeError(f"policy must be a twell.nn.DispatchPolicy or None, got {type(policy).__name__}")
        check_positive_int(l0_refresh_every, "l0_refresh_every")
        _check_eager_graphs(eager_graphs)
        if train_policy is None:
            train_policy = DEFAULT_TRAIN_POLICY
        if not isinstance(train_policy, TrainDispatchPolicy):
            raise TypeError(
                f"train_policy must be a twell.nn.train_dispatch.TrainDispatchPolicy or None, "
                f"got {type(train_policy).__name__}"
            )

        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.backend = backend
        self.tile = tile
        self.capacity = capacity
        self.precision = precision
        self.policy = policy
        self.l0_refresh_every = l0_refresh_every
        self.train_impl = train_impl
        self.train_policy = train_policy
        self.hot_cold = bool(hot_cold)

        kw: dict[str, Any] = {"bias": False, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

        # Wd^T [F, d] contiguous, the unit-major layout the kernels read.  A non-persistent buffer so that
        # module.to() moves it and state dicts do not see it; _wd_key says which weight it was built from.
        self.register_buffer("_wd_unit_major", None, persistent=False)
        self._wd_key: tuple[Any, ...] | None = None
        # What the sparse path derived from the weights (validation, resolved backend and capacity),
        # valid while the weights' fingerprint is unchanged.
        self._sparse_prep: _SparsePrep | None = None

        self._state = _InferenceState()  # before the properties below are assigned through
        self.last_l1: torch.Tensor | None = None
        self._train_switch = TrainSwitch()
        # hot set of train_impl="hot-cold", re-chosen every l0_refresh_every training calls, and the
        # token count it was chosen at
        self._train_hot: HotUnits | None = None
        self._train_hot_calls = 0
        self._train_hot_tokens = 0
        #: Tokens of the last hot/cold training call whose cold pairs overflowed the op's buffers and were
        #: recomputed densely (int32 [1] on the device; slow when large: a hot set chosen on other tokens).
        self.last_spilled_tokens: torch.Tensor | None = None
        self._hot_cold = HotColdCache()
        self._graphs = LayerGraphs(eager_graphs)  # the recorded eager calls (eager_graphs)

    # ------------------------------------------------------------------ construction from weights
    @classmethod
    def from_weights(
        cls, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, **kwargs: Any
    ) -> SparseGatedMLP:
        """A layer holding copies of ``w_gate [F, d]``, ``w_up [F, d]``, ``w_down [d, F]`` (their dtype/device).

        ``kwargs`` are the constructor's keyword arguments except ``device``/``dtype``, which come from the
        weights (convert afterwards with ``.to()``).
        """
        for key in ("device", "dtype"):
            if key in kwargs:
                raise TypeError(f"{key} is taken from the weights; convert the layer afterwards with .to()")
        for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
            check_tensor(w, name, ndim=2, dtypes=FLOAT_DTYPES)
        f, d = w_gate.shape
        if tuple(w_up.shape) != (f, d):
            raise ValueError(f"w_up has shape {tuple(w_up.shape)} but w_gate has {(f, d)}; both must be [F, d]")
        if tuple(w_down.shape) != (d, f):
            raise ValueError(
                f"w_down has shape {tuple(w_down.shape)} but w_gate has {(f, d)}; w_down must be [d, F] = {(d, f)}"
            )
        dtype = check_same_dtype({"w_gate": w_gate, "w_up": w_up, "w_down": w_down})
        device = check_same_device({"w_gate": w_gate, "w_up": w_up, "w_down": w_down})
        layer = cls(d, f, device=device, dtype=dtype, **kwargs)
        with torch.no_grad():
            layer.gate_proj.weight.copy_(w_gate)
            layer.up_proj.weight.copy_(w_up)
            layer.down_proj.weight.copy_(w_down)
        return layer

    @classmethod
    def from_dense(cls, mlp: nn.Module, **kwargs: Any) -> SparseGatedMLP:
        """Copy the weights of any module with ``gate_proj``/``up_proj``/``down_proj`` Linear children.

        Meant for Hugging Face ``LlamaMLP``-style modules.  The activation is replaced by ReLU: this is a
        conversion of weights, and it only preserves the function for models trained (or fine-tuned)
        with a ReLU gate.  Biases are refused since the sparse FFN has none.
        """
        weights = []
        for name in ("gate_proj", "up_proj", "down_proj"):
            child = getattr(mlp, name, None)
            if not isinstance(child, nn.Linear):
                raise TypeError(
                    f"from_dense needs a module with nn.Linear children gate_proj, up_proj and down_proj; "
                    f"{type(mlp).__name__}.{name} is {type(child).__name__}"
                )
            if child.bias is not None:
                raise ValueError(f"{type(mlp).__name__}.{name} has a bias: the sparse FFN has no biases")
            weights.append(child.weight.detach())
        w_gate, w_up, w_down = weights
        if w_up.shape != w_gate.shape or w_down.shape != w_gate.t().shape:
            raise ValueError(
                f"{type(mlp).__name__} has inconsistent projections: gate_proj.weight {tuple(w_gate.shape)}, "
                f"up_proj.weight {tuple(w_up.shape)}, down_proj.weight {tuple(w_down.shape)}; expected "
                "[F, d], [F, d] and [d, F]"
            )
        return cls.from_weights(w_gate, w_up, w_down, **kwargs)

    def to_dense(self) -> DenseReluGatedMLP:
        """A :class:`DenseReluGatedMLP` with copies of the weights (same dtype and device)."""
        w = self.gate_proj.weight
        dense = DenseReluGatedMLP(self.hidden_size, self.intermediate_size, device=w.device, dtype=w.dtype)
        dense.load_state_dict(self.state_dict())
        return dense.train(self.training)

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x [..., hidden_size]`` -> ``[..., hidden_size]``; the path is chosen as the module docs say.

        ``residual`` (x's shape, dtype and device): returns ``residual + FFN(x)``, the decoder layer's add done
        here (:func:`twell.nn.fuse_residual_adds`): the hot/cold split's gather adds it as it writes each row,
        the other paths add it after (the dense one in cuBLAS's epilogue when :data:`DENSE_RESIDUAL_ADDMM` is on);
        each keeps the bits of ``residual + mlp(x)`` (addmm instead rounds the sum once).
        """
        if residual is not None:
            check_residual(residual, x)
        if self.training and torch.is_grad_enabled():
            weights = self._weights()
            _check_input(x, self.hidden_size, weights[0], autocast_ok=True)
            if x.dim() == 2:  # no reshape: two view nodes fewer in the autograd graph
                out = self._ffn_train(x, weights)
            else:
                lead = x.shape[:-1]
                out = self._ffn_train(x.reshape(-1, self.hidden_size), weights).reshape(*lead, self.hidden_size)
            return out if residual is None else residual + out
        # Inference: called once per layer per decode step, where the host is the bottleneck, so this
        # path avoids what costs a microsecond or so per call on the CPU (scripts/module_overhead.py,
        # d=64, F=256, M=1: Module.__getattr__ twice for self.gate_proj.weight 1.29 us, Module.__setattr__
        # 1.26 us, a reshape 0.91 us) -- see _weights, _InferenceState, _use_sparse and _ffn_infer.  The
        # dense path's time over the plain F.linear chain went from 18.7 to 5.1 us per call there
        # (30.77 vs 17.54 us, plain chain ~12.3 us), below DenseReluGatedMLP's 8.2 us.
        weights = self._weights()
        _check_input(x, self.hidden_size, weights[0])
        if self.last_l1 is not None:
            self.last_l1 = None  # drop the previous training graph; l1_loss() now refers to nothing
        if torch.compiler.is_compiling() or _STATIC_DISPATCH.depth:
            return self._ffn_infer_traced(x, weights, residual)
        return self._ffn_infer(x, weights, residual)

    def _ffn_infer_traced(self, x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                          residual: torch.Tensor | None = None) -> torch.Tensor:
        """The inference FFN as torch.compile traces it: the path chosen from the current l0 estimate (a
        constant of the graph, guarded) with no call counting, l0 refresh or cached weight layouts --
        state that changes every call made the eager path recompile on every call, up to dynamo's cache
        limit, after which it ran uncompiled (tests/test_nn_compile.py now pins one graph).  ``last_l0`` is not
        updated: run eager calls to refresh the estimate.  Sparse calls go through the custom ops
        (captured whole): the small-batch kernels with Wd read in place (the cached unit-major Wd^T
        inside ``static_dispatch(unit_major_down=True)``); the hot/cold split when an eager
        call has chosen the hot units (the unit ids are read from the cache, a graph constant; the weight
        copies the split needs are built in the graph from the current weights every call, ~26 MB at
        d=2048, F=5632 against the ~9 ms FFN at 131,072 tokens, so they can never be stale the way a
        cached copy could after a weight update that no guard sees); else the TwELL op.  Each takes a
        Wd^T copy per call -- except inside ``static_dispatch(cached_weights=True)``, where the caller vouches for
        the cached copies (:meth:`prepare_static_weights`) and the split and the TwELL op read them.  Traced outside
        :func:`static_dispatch`, the policy's eager floor applies (a compiled
        graph issues its launches from the host unless CUDA graphs record it): trace inside ``static_dispatch`` for
        calls that will be recorded (``torch.compile(mode="reduce-overhead")``)."""
        w_gate, w_up, w_down = weights
        m = x.numel() // self.hidden_size
        device_type = x.device.type
        capability = cuda_capability(x.device)  # a constant of the traced graph
        shape = (self.hidden_size, self.intermediate_size)
        policy, estimate = self.policy, self._state.estimate
        backend = resolve_backend(self.backend, x.device)
        if m == 0 or self._needs_grad(x):
            return _dense_ffn(x, *weights, residual)[0]
        x2 = x.reshape(m, self.hidden_size)
        density = density_of(estimate, self.intermediate_size)
        # Traced by torch.compile outside static_dispatch, the call is eager for the policy's floor: a compiled graph
        # without CUDA graphs still issues every launch from the host (session 45, H100 machine, the 1.5B backbone in
        # inductor's default mode at 4096 tokens, the tables alone: 36.17 ms against compiled dense's 28.71, 0.794x,
        # bench_results/h100/model_forward_b2_session45.json).  Inside static_dispatch (recorded CUDA graphs, and what
        # torch.compile(mode="reduce-overhead") should trace inside) the tables apply.
        eager = not _STATIC_DISPATCH.depth
        if policy.use_decode(m, density=density, device_type=device_type, shape=shape, capability=capability,
                             eager=eager):
            w_down_t = w_down.t()
            if _STATIC_DISPATCH.unit_major_down and self._buffers["_wd_unit_major"] is not None:
                w_down_t = self._buffers["_wd_unit_major"]  # refreshed by the caller (see static_dispatch)
            out, _ = torch.ops.twell.decode_gated_ffn_unchecked(x2, w_gate, w_up, w_down_t, self.precision,
                                                                backend)
            return out.view(x.shape) if residual is None else residual + out.view(x.shape)
        if policy.use_sparse(m, density, device_type=device_type, shape=shape, capability=capability, eager=eager):
            capacity = self.capacity or default_capacity(self.tile)
            split = self.hot_cold and self.precision == "match" and backend == "triton"
            hot_set = self._hot_cold.set_for(m, fallback=False)
            if split and hot_set is None:
                # No call of this size class has chosen its hot units (eager calls below the policy's eager floor run
                # dense and choose none).  A static_dispatch call outside a CUDA graph capture and outside
                # torch.compile may synchronise, so it chooses them as an eager sparse call would (the recorded-call
                # recipe's warm-up call); else another class's set, and without one dense: the tables were measured
                # on the split, and the plain TwELL op it would fall back to ran 0.54x of dense at 2048 tokens / 0.5 %
                # (ffn_sweep_session30.json).
                if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
                    hot_set = self._hot_cold.set_for(m)
                    if hot_set is None:
                        return _dense_ffn(x, *weights, residual)[0]
                else:
                    self._choose_hot_set(x2.contiguous(), weights)
                    hot_set = self._hot_cold.set_for(m)
            plan = None if hot_set is None else hot_set.plan
            cached_wd = self._buffers["_wd_unit_major"] if _STATIC_DISPATCH.cached_weights else None
            w_down_t = cached_wd if cached_wd is not None else w_down.t().contiguous()
            if split and plan is not None:
                fused_tile = fused_gate_tile(self.tile, x.dtype, self.hidden_size, x.device)
                if cached_wd is not None and plan.fused_tile == fused_tile:
                    # the caller's copies (static_dispatch(cached_weights=True), prepare_static_weights)
                    w_gemm, w_down_hot_t = plan.w_gemm, plan.w_down_hot_t
                else:
                    w_gemm, w_down_hot_t = plan_weight_copies(w_gate, w_up, w_down, plan.hot, plan.cold,
                                                              fused_tile=fused_tile)
                res2 = None if residual is None else residual.reshape(m, self.hidden_size).contiguous()
                out, _ = torch.ops.twell.hot_cold_gated_ffn_unchecked(
                    x2.contiguous(), w_gate, w_up, w_down_t, plan.hot, plan.cold, w_gemm,
                    w_down_hot_t, self.tile, capacity, backend, fused_tile, hot_set.dense_rows(m), res2)
                return out.view(x.shape)
            out, _ = torch.ops.twell.sparse_gated_ffn_unchecked(
                x2.contiguous(), w_gate, w_up, w_down_t, self.tile, capacity, self.precision, backend)
            return out.view(x.shape) if residual is None else residual + out.view(x.shape)
        return _dense_ffn(x, *weights, residual)[0]

    def _ffn_train(self, x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The one place the training FFN is called (see ``train_impl``).

        A dense call at M=4096 is close to bound by the host (its ~30 launches took 0.72-0.80 ms of
        Python and dispatch on the H200's host against a 1.5 ms GPU step, bench_results/h200/
        train_switch_overhead_session5.log), so this path reads the autocast state once, the weights
        from the parameter dicts and writes its statistics without ``Module.__setattr__``."""
        if self.train_impl not in TRAIN_IMPLS:
            raise ValueError(f"train_impl must be one of {', '.join(TRAIN_IMPLS)}; got {self.train_impl!r}")
        dtype = autocast_dtype(x.device.type)
        if self.train_impl == "auto":
            shape = (self.hidden_size, self.intermediate_size)
            if torch.compiler.is_compiling():
                # Traced: the decision from the switch's current estimate, no call counting or l0 read
                # (per-call state recompiles the graph every call; eager calls refresh the estimate).
                sparse = self._train_switch.traced_choice(self.train_policy, x.shape[0], device=x.device,
                                                          shape=shape, dtype=dtype or x.dtype)
            else:
                sparse = self._train_switch.choose(
                    self.train_policy, x.shape[0], device=x.device, shape=shape, dtype=dtype or x.dtype,
                    last_l0=self.last_l0, refresh_every=self.l0_refresh_every,
                )
            fn = dense_train_ffn_l1
            if sparse:
                fn = sparse_train_fn(x.device)
                if fn is twell_gated_ffn_l1:
                    # The Triton family runs as the hot/cold split: faster than the v1 op at every point
                    # measured (H200, M=16384, 0.5 %: 3.56 ms, v1 17.1 ms, dense 5.5 ms; train_ffn*.json
                    # under bench_results/h200).
                    fn = self._hot_cold_train
                elif fn is gated_ffn_l1:
                    fn = _EAGER_SPARSE_REFERENCE
        elif self.train_impl == "hot-cold":
            fn = self._hot_cold_train
        else:
            fns = {"sparse-reference": _EAGER_SPARSE_REFERENCE, "triton": _EAGER_TWELL_V1}
            fn = fns.get(self.train_impl, dense_gated_ffn_l1)
        if fn is not dense_train_ffn_l1 and dtype is not None:
            # The sparse autograd Functions and the oracle's dense twin take one dtype and are not
            # autocast-aware: give them what an autocast F.linear computes with (the casts route the
            # gradients back to the weights' dtype).
            with torch.autocast(x.device.type, enabled=False):
                out, l1, l0 = fn(x.to(dtype), *(w.to(dtype) for w in weights))
        else:
            out, l1, l0 = fn(x, *weights)
        # Plain attributes (never parameters, buffers or modules): Module.__setattr__'s lookups skipped.
        self.__dict__["last_l1"] = l1
        self._state.set_l0(l0.detach())
        return out

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(Wg, Wu, Wd)`` read from the children's parameter dicts: two dict lookups each instead of two
        ``Module.__getattr__`` calls (1.29 us a weight on the CPU).  A weight that is not a registered
        parameter (``torch.nn.utils.parametrize`` makes ``weight`` a property) is read as an attribute."""
        mods = self._modules
        try:
            return (mods["gate_proj"]._parameters["weight"], mods["up_proj"]._parameters["weight"],  # type: ignore[union-attr,return-value]
                    mods["down_proj"]._parameters["weight"])
        except KeyError:
            return self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight

    def _hot_cold_train(
        self, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``train_impl="hot-cold"``: the op with the layer's hot set (:meth:`_training_hot_set`) and the ELL
        width of that set; traced by torch.compile, the op's custom-op form."""
        # The width comes back with the set, computed eagerly from its float cold-l0 estimate, so the traced op below
        # reads only the set's tensors and ints (tests/test_nn_compile.py: dynamo recompiles when a size first
        # changes, then marks it dynamic; a second pass over the same sets compiles nothing).
        hot, width = self._training_hot_set(x, w_gate)
        stats: dict[str, torch.Tensor] = {}
        out = twell_gated_ffn_l1_hot_cold(x, w_gate, w_up, w_down, hot, width=width, stats=stats)
        self.last_spilled_tokens = stats.get("spilled_tokens")
        return out

    # Run eagerly even inside a compiled step (a graph break around it): the hot set is chosen from the call's
    # tokens, and a traced graph cannot do that.  Traced with the set an eager call had chosen before (until
    # session 55), a compiled training step never re-chose it: the 1.5B benchmark model's step, its set chosen on
    # the 2048-token check batch of one sequence, then ran on 16,384-token batches with up to 10,167 tokens a layer
    # spilled to the dense recompute, 0.068x of compiled dense (H100 80GB HBM3, session 55,
    # bench_results/h100/model_train_compiled_session55.json); and in a long run the set would go stale.
    @torch.compiler.disable
    def _training_hot_set(self, x: torch.Tensor, w_gate: torch.Tensor) -> tuple[HotUnits, int]:
        """The hot set of this training call and its ELL width (:func:`twell.ops.hot_cold_training.default_width`).

        The set is re-chosen from the call's tokens every ``l0_refresh_every`` calls and when the token count
        leaves [M0 / 2, 2 M0] of the call it was chosen on (one extra sample GEMM and a host sync), never during
        a checkpointed forward's recomputation (which must see the hot set the forward saw).  The op sizes its
        buffers from the set's cold l0 estimate: a set chosen on a 2048-token check batch of one sequence, then
        used on 16384-token steps, is the case the token-count rule covers."""
        m = x.shape[0]
        if not _in_backward() or self._train_hot is None:
            m0 = self._train_hot_tokens
            if (self._train_hot is None or self._train_hot_calls % self.l0_refresh_every == 0
                    or not m0 // 2 <= m <= 2 * m0):
                self._train_hot = choose_training_hot_units(x, w_gate)
                self._train_hot_tokens = m
            self._train_hot_calls += 1
        return self._train_hot, default_width(self._train_hot)

    def _needs_grad(self, x: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in self._weights()))

    # The inference state behind properties, so that the code and the tests that read these names keep
    # working while the per-call updates go to a plain object (see _InferenceState).
    @property
    def last_l0(self) -> torch.Tensor | None:
        """Mean active units per token of the last call that measured it (see the class docs); None before any."""
        return self._state.read_l0()

    @last_l0.setter
    def last_l0(self, value: torch.Tensor | None) -> None:
        self._state.set_l0(value)

    @property
    def eager_graphs(self) -> int:
        """Token counts whose eager calls (below the eager floor, and above it up to ``call_graphs.RECORD_MAX_FLOPS``)
        are recorded in CUDA graphs (see the class docs)."""
        return self._graphs.limit

    @eager_graphs.setter
    def eager_graphs(self, value: int) -> None:
        _check_eager_graphs(value)
        self._graphs.clear()
        self._graphs.limit = value

    @property
    def _l0_estimate(self) -> float | None:
        return self._state.estimate

    @_l0_estimate.setter
    def _l0_estimate(self, value: float | None) -> None:
        self._state.estimate = value

    @property
    def _infer_calls(self) -> int:
        return self._state.calls

    @_infer_calls.setter
    def _infer_calls(self, value: int) -> None:
        self._state.calls = value

    def _ffn_infer(self, x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                   residual: torch.Tensor | None = None) -> torch.Tensor:
        """The inference FFN of ``x [..., d]`` (checked by forward): dense or sparse, l0 bookkeeping; plus
        ``residual`` when given.

        On a call that is not an l0-refresh call the dense path runs exactly the dense FFN's five ops
        (three linears, relu, mul) on ``x`` as given -- ``F.linear`` takes any leading shape, so there is
        no reshape -- and no host synchronisation (``tests/test_nn_overhead.py`` pins both).
        """
        m = x.numel() // self.hidden_size
        if m == 0:
            # Nothing to compute or measure; an empty batch must not drag the l0 estimate to 0.
            return _dense_ffn(x, *weights, residual)[0]
        state = self._state
        refresh = state.calls % self.l0_refresh_every == 0
        state.calls += 1
        # The policy's floor for eager calls (a call being recorded in a CUDA graph outside static_dispatch is not one).
        # ``eager`` is set only where the floor can apply, below it, so the capture check runs only there and the
        # cached decisions of other token counts stay under one key; the policy checks the count again.
        policy = self.policy
        if state.eager_floor_policy is not policy:
            state.eager_floor = policy.eager_floor_tokens((self.hidden_size, self.intermediate_size))
            state.eager_floor_policy = policy
        below = m < state.eager_floor
        graphed = self._graphs.limit and self._in_recording_window(m, below)
        capturing = (below or graphed) and x.is_cuda and torch.cuda.is_current_stream_capturing()
        eager = below and not capturing
        if graphed and not capturing:
            out = self._ffn_graphed(x, m, weights, residual, refresh)
            if out is not None:
                if refresh or state.estimate is None:
                    self._sync_l0_estimate()
                return out
        if self._use_sparse(m, x.device, eager) and not self._needs_grad(x):
            state.refresh_now = refresh
            if x.dim() == 2:
                out = self._ffn_sparse(x, residual)
            else:
                res2 = None if residual is None else residual.reshape(m, self.hidden_size)
                out = self._ffn_sparse(x.reshape(m, self.hidden_size), res2).view(x.shape)
        else:
            out, a = _dense_ffn(x, *weights, residual)
            if refresh or state.estimate is None:
                self.last_l0 = self._measure_dense_l0(a)
        if refresh or state.estimate is None:
            self._sync_l0_estimate()
        return out

    def _in_recording_window(self, m: int, below_floor: bool) -> bool:
        """Whether an eager call of ``m`` tokens may be recorded: from ``call_graphs.RECORD_MIN_FLOPS`` of work, and at
        or above the eager floor (not ``below_floor``) up to ``call_graphs.RECORD_MAX_FLOPS``.  Checked before
        anything else, so that calls outside it (decode steps) pay a few multiplications for the recordings."""
        flops = dense_ffn_flops(m, (self.hidden_size, self.intermediate_size))
        return flops >= call_graphs.RECORD_MIN_FLOPS and (below_floor or flops <= call_graphs.RECORD_MAX_FLOPS)

    def _ffn_graphed(self, x: torch.Tensor, m: int, weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                     residual: torch.Tensor | None, refresh: bool) -> torch.Tensor | None:
        """An eager call through the layer's recorded calls (``eager_graphs``; below the eager floor, or at or above it
        up to ``call_graphs.RECORD_MAX_FLOPS``): a replay, or the split run eagerly (a count's second call, which
        records it after; l0 refresh calls, which re-choose the hot units); None where the call runs as without
        recordings (a count's first call, another path in the tables, no hot units, no room for another count); the
        caller checked the recording window (:meth:`_in_recording_window`)."""
        graphs = self._graphs
        device = x.device
        recorder = call_graphs.RECORDER
        if not recorder.supports(device) or self._path(m, device) != "sparse" or self._needs_grad(x):
            return None
        prep = self._prepare_sparse(*weights)
        if not prep.hot_cold or graphs.first_call(m):
            return None
        x2 = x.reshape(m, self.hidden_size)
        res2 = None if residual is None else residual.reshape(m, self.hidden_size)
        state = self._state
        if refresh:  # the split eagerly: it re-chooses the hot units and its counts give l0
            state.refresh_now = True
            return self._ffn_sparse(x2, res2).view(x.shape)
        stream = recorder.stream_key(device)

        # What every recording is valid for (a change drops them all), and what one count's is valid for: its size
        # class's plan (the hot set: other counts may take other classes' plans) and its dense-row budget.
        valid_for = (prep.generation, x.dtype, stream)

        chosen = self._hot_cold.select(m)
        plan = self._current_plan(x2, weights, prep) if chosen else None
        if plan is not None:
            call = graphs.get(m, valid_for, (id(plan), self._hot_cold.dense_rows(m)))
            if call is not None:
                return call(x2, res2).view(x.shape)
            if not graphs.has_room(m):
                return None
        elif chosen:  # an empty hot set: the plain TwELL op, not recorded
            return None
        # The split eagerly (it compiles the kernels of this size and chooses the hot units if none are; its output is
        # this call's), then the same call recorded.
        state.refresh_now = False
        out = self._ffn_sparse(x2, res2).view(x.shape)
        plan = self._current_plan(x2, weights, prep)
        dense_rows = self._hot_cold.dense_rows(m)
        if plan is None:
            return out
        key = (id(plan), dense_rows)  # the recording keeps the plan alive (GraphedCall.keep): its id is not reused
        graphs.get(m, valid_for, key)  # drops recordings of another state
        if not graphs.has_room(m):
            return out
        w_gate, w_up, w_down = weights
        w_down_t = self._buffers["_wd_unit_major"]  # current: _ffn_sparse's _prepare_sparse rebuilt it if Wd changed
        static_x = call_graphs.static_buffer("x", (m, self.hidden_size), x.dtype, device, stream)
        static_out = call_graphs.static_buffer("out", (m, self.hidden_size), x.dtype, device, stream)
        tile, capacity = self.tile, prep.capacity

        def launch() -> None:
            launch_hot_cold_ffn(static_x, plan, w_gate, w_up, w_down_t, tile=tile, capacity=capacity,
                                dense_rows=dense_rows, out=static_out)

        with call_graphs.LOCK:
            replay = recorder.record(launch, device)
        graphs.put(m, GraphedCall(key, replay, static_x, static_out, (plan, w_gate, w_up, w_down_t)), device)
        return out

    def choose_hot_units(self, x: torch.Tensor) -> None:
        """Choose the hot units from the tokens ``x`` ``[..., hidden_size]`` and build the hot/cold plan now, as an
        eager sparse call does on its refresh calls.

        For a layer whose calls will be compiled and recorded (``torch.compile(mode="reduce-overhead")`` traced inside
        :func:`static_dispatch`) while its eager calls run dense, below the policy's eager floor
        (``DispatchPolicy.eager_floor_tokens``): a traced call finds no hot set there and runs dense.  (A call inside
        :func:`static_dispatch` outside a CUDA graph capture and outside torch.compile chooses them itself.)  Pass
        tokens like those the layer will see, ideally as many as its calls: the hot set depends on the call size.
        Synchronises with the host.  Does nothing where the layer does not run the split (``hot_cold`` off,
        ``precision="fp32"``, the torch backend, or weights that are inference tensors)."""
        weights = self._weights()
        x = _check_input(x, self.hidden_size, weights[0])
        if x.numel() == 0:
            raise ValueError(f"x must hold at least one token to choose the hot units from, got shape {tuple(x.shape)}")
        if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            raise RuntimeError("choose_hot_units synchronises with the host: call it eagerly, not while torch.compile "
                               "traces or a CUDA graph is being recorded")
        with torch.no_grad():
            self._choose_hot_set(x.reshape(-1, self.hidden_size).contiguous(), weights)

    def prepare_static_weights(self) -> bool:
        """Build the weight copies that calls inside ``static_dispatch(cached_weights=True)`` read, for the current
        weights, and mark them as static addresses for CUDA graphs (``torch._dynamo.mark_static_address``, so a
        recorded graph reads them in place instead of copying them in on every replay): the unit-major Wd^T and,
        where the layer runs the hot/cold split and has chosen hot units, each size class's plan's gate layout and hot
        Wd^T (``hot_cold_cache.MAX_HOT_SETS``).

        Call it on every layer after the last weight change (an optimizer step, ``load_state_dict``) and before
        tracing or recording inside that context; nothing checks the copies there.  Returns whether the split's
        copies are ready (False: the layer has no hot set or does not run the split; its TwELL calls still read the
        cached Wd^T).  Synchronises nothing, but builds copies: call it eagerly, not while torch.compile traces or a
        CUDA graph is being recorded."""
        weights = self._weights()
        w = weights[0]
        if torch.compiler.is_compiling() or (w.is_cuda and torch.cuda.is_current_stream_capturing()):
            raise RuntimeError("prepare_static_weights builds weight copies: call it eagerly, not while torch.compile "
                               "traces or a CUDA graph is being recorded")
        from torch._dynamo import mark_static_address  # torch._dynamo's import is heavy: only where it is used

        with torch.no_grad():
            prep = self._prepare_sparse(*weights)
            wd_t = self.w_down_unit_major()
            if wd_t is self._buffers["_wd_unit_major"]:  # cached (not an inference-tensor weight's fresh copy)
                mark_static_address(wd_t)
            if not prep.hot_cold:
                return False
            # every size class's plan (calls come in the weights' dtype, on their device)
            fused_tile = fused_gate_tile(self.tile, w.dtype, self.hidden_size, w.device)
            plans = [s.build_plan(*weights, prep.generation, fused_tile) for s in self._hot_cold.sets()]
            plans = [p for p in plans if p is not None]
            for plan in plans:
                for t in (plan.hot, plan.cold, plan.w_gemm, plan.w_down_hot_t):
                    mark_static_address(t)
        return bool(plans)

    def _choose_hot_set(self, x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """The hot units chosen from ``x`` [M, d] and the plan built (what a sparse call does on a refresh call), where
        the layer runs the hot/cold split."""
        prep = self._prepare_sparse(*weights)
        if prep.hot_cold:
            self._hot_cold.refresh(x, *weights, tile=self.tile, capacity=prep.capacity)
            self._current_plan(x, weights, prep)

    def _current_plan(self, x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                      prep: _SparsePrep) -> HotColdPlan | None:
        """The hot/cold plan of the chosen hot units for the current weights, in the fused gate's layout where the
        kernel takes calls like ``x`` (only its dtype and device are read; built once per change of the weights or the
        set; None without hot units)."""
        return self._hot_cold.plan(*weights, key=prep.generation,
                                   fused_tile=fused_gate_tile(self.tile, x.dtype, self.hidden_size, x.device))

    def _use_sparse(self, n_tokens: int, device: torch.device | str, eager: bool = False) -> bool:
        """Whether a call of ``n_tokens`` tokens on ``device`` takes a sparse path (small-batch kernels or TwELL);
        ``eager``: the policy's eager floor applies (``DispatchPolicy.eager_floor_tokens``)."""
        return self._path(n_tokens, device, eager) != "dense"

    def _path(self, n_tokens: int, device: torch.device | str, eager: bool = False) -> str:
        """``"decode"``, ``"sparse"`` or ``"dense"``: the policy's answer for ``n_tokens`` on ``device`` (a device
        type string means its current device) at the current l0 estimate, cached per (token count, device, eager).

        The answer is a pure function of the policy, the estimate and these three, so it is cached until
        either of the first two changes (the estimate moves on refresh calls only): a cached answer
        costs a dict lookup instead of the policy's checks and table lookup: 0.24 us against 1.14 us per call
        on the CPU (scripts/module_overhead.py).  The sparse path reads it again to tell decode from
        TwELL calls (a second lookup, not a second policy evaluation).
        """
        state = self._state
        policy, estimate = self.policy, state.estimate
        if state.decided_policy is not policy or state.decided_estimate != estimate:
            state.decisions.clear()
            state.decided_policy, state.decided_estimate = policy, estimate
        key = (n_tokens, device, eager)
        path = state.decisions.get(key)
        if path is None:
            dev = torch.device(device) if isinstance(device, str) else device
            shape = (self.hidden_size, self.intermediate_size)
            density = density_of(estimate, self.intermediate_size)
            # the compute capability too: the default policy's tables hold on Hopper only (dispatch.HOPPER)
            where = {"device_type": dev.type, "shape": shape, "capability": cuda_capability(dev), "eager": eager}
            if policy.use_decode(n_tokens, density=density, **where):
                path = "decode"
            elif policy.use_sparse(n_tokens, density, **where):
                path = "sparse"
            else:
                path = "dense"
            if len(state.decisions) < _MAX_CACHED_DECISIONS:
                state.decisions[key] = path
        return path

    def _ffn_sparse(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The sparse FFN of ``x [M, d]`` (plus ``residual`` [M, d] when given: the hot/cold split adds it in its
        gather, the other paths after); its per-(row, tile) non-zero counts give l0 without a host sync.

        The weights are validated once per change (:meth:`_prepare_sparse`) and ``x`` by forward, so
        the unchecked custom ops run here (still custom ops: torch.compile captures them).
        """
        w_gate, w_up, w_down = self._weights()
        prep = self._prepare_sparse(w_gate, w_up, w_down)
        x = x.contiguous()
        # The small-batch kernels take no hot set: a decode call neither uses nor re-chooses one.
        decode = self._path(x.shape[0], x.device) == "decode"
        plan = None
        if prep.hot_cold and not decode:
            # Hot units re-chosen on refresh calls only (the choice synchronises with the host), and on the first call
            # of a size class (its own set: hot_cold_cache.MAX_HOT_SETS).
            if self._state.refresh_now or not self._hot_cold.select(x.shape[0]):
                self._hot_cold.refresh(x, w_gate, w_up, w_down, tile=self.tile, capacity=prep.capacity)
            plan = self._current_plan(x, (w_gate, w_up, w_down), prep)
        w_down_t = self._buffers["_wd_unit_major"]  # current: _prepare_sparse rebuilt it if Wd changed
        if w_down_t is None or prep.key is None:
            w_down_t = self.w_down_unit_major()
        if decode:
            if prep.backend == "triton" and not torch.compiler.is_compiling():
                # Eager decode steps call the launchers directly: through the custom op a call took 25.5 us
                # on the CPU against 11.7 for the launchers it wraps (launches stubbed; M=1,
                # bench_results/cpu/module_overhead_session3.log); under torch.compile the custom op is
                # what gets captured.
                out, counts = launch_decode_ffn(x, w_gate, w_up, w_down_t, match=self.precision == "match")
            else:
                out, counts = torch.ops.twell.decode_gated_ffn_unchecked(x, w_gate, w_up, w_down_t, self.precision,
                                                                        prep.backend)
        elif plan is not None:
            res = None if residual is None else residual.contiguous()
            if EAGER_HOT_COLD_LAUNCH and prep.backend == "triton" and not torch.compiler.is_compiling():
                # the custom op's dispatch and the plan rebuilt from its tensors skipped (EAGER_HOT_COLD_LAUNCH)
                out, counts = launch_hot_cold_ffn(x, plan, w_gate, w_up, w_down_t, tile=self.tile,
                                                  capacity=prep.capacity,
                                                  dense_rows=self._hot_cold.dense_rows(x.shape[0]), residual=res)
            else:
                out, counts = torch.ops.twell.hot_cold_gated_ffn_unchecked(
                    x, w_gate, w_up, w_down_t, plan.hot, plan.cold, plan.w_gemm, plan.w_down_hot_t, self.tile,
                    prep.capacity, prep.backend, plan.fused_tile, self._hot_cold.dense_rows(x.shape[0]), res,
                )
            residual = None  # added
        else:
            out, counts = torch.ops.twell.sparse_gated_ffn_unchecked(
                x, w_gate, w_up, w_down_t, self.tile, prep.capacity, self.precision, prep.backend
            )
        # l0 summed from the counts only when read (_InferenceState.read_l0): the sum and its divide cost
        # three kernels on the GPU (a cast copy of the counts, the reduction, the divide), 11 us a call at
        # M=16384 on the H200 against the 0.811 ms op (bench_results/h200/infer_op_profile_session21.log).
        # A decode call keeps l0 for refresh calls only, as the dense path does.
        if not decode or self._state.refresh_now:
            state = self._state
            state.l0, state.l0_counts, state.l0_tokens = None, counts, x.shape[0]
        if residual is not None:
            out = out.add_(residual)  # the op's fresh output: the bits of residual + out, one [M, d] fewer
        return out

    def _prepare_sparse(self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> _SparsePrep:
        """The sparse path's view of the current weights, rebuilt (and the weights checked) when they change.

        The fingerprint is each weight's identity, storage pointer and version counter (bumped by
        optimizer steps, ``copy_``, ``load_state_dict``); a new dtype, device or shape comes with new
        storage.  Weights that are inference tensors (created under ``torch.inference_mode``) have no
        version counter, so an in-place change to them could not be seen: for them nothing derived is
        cached -- Wd^T is rebuilt per call and the hot/cold split (whose plan copies weights and
        synchronises when built) is not used.
        """
        prep = self._sparse_prep
        try:
            key: tuple[int, ...] | None = (w_gate.data_ptr(), w_gate._version, w_up.data_ptr(), w_up._version,
                                           w_down.data_ptr(), w_down._version)
        except RuntimeError:  # "Inference tensors do not track version counter."
            key = None
        if prep is not None and key is not None and prep.key == key:
            refs = prep.refs
            if refs[0]() is w_gate and refs[1]() is w_up and refs[2]() is w_down:
                return prep
        self._check_weights(w_gate, w_up, w_down)
        backend = resolve_backend(self.backend, w_gate.device)
        if backend == "triton":
            _check_triton_dtype(w_gate)
        if key is not None:
            self.w_down_unit_major()  # rebuild the Wd^T buffer now if Wd changed
        prep = _SparsePrep(
            key=key,
            generation=next(_PREP_GENERATIONS),
            refs=(weakref.ref(w_gate), weakref.ref(w_up), weakref.ref(w_down)),
            backend=backend,
            capacity=self.capacity or default_capacity(self.tile),
            hot_cold=self.hot_cold and self.precision == "match" and backend == "triton" and key is not None,
        )
        self._sparse_prep = prep
        return prep

    def _check_weights(self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> None:
        """The weights still have the layer's shapes and one float dtype and device (they may have been
        replaced since construction)."""
        d, f = self.hidden_size, self.intermediate_size
        named = {"gate_proj.weight": w_gate, "up_proj.weight": w_up, "down_proj.weight": w_down}
        for name, w in named.items():
            check_tensor(w, name, ndim=2, dtypes=FLOAT_DTYPES)
            want = (d, f) if name == "down_proj.weight" else (f, d)
            if tuple(w.shape) != want:
                raise ValueError(f"{name} has shape {tuple(w.shape)} but the layer needs {want} (hidden_size={d}, "
                                 f"intermediate_size={f})")
        check_same_dtype(named)
        check_same_device(named)

    @staticmethod
    def _measure_dense_l0(a: torch.Tensor) -> torch.Tensor:
        """Mean active units per token of a dense activation ``[..., F]``, on its device (NaN counts as active)."""
        return mean_active_per_token(a)

    def _sync_l0_estimate(self) -> None:
        """The only device-to-host synchronisation of the inference path (every ``l0_refresh_every`` calls)."""
        if self.last_l0 is not None:
            self._state.estimate = float(self.last_l0)

    def reset_l0_estimate(self) -> None:
        """Forget the density estimate (e.g. after loading other weights): the next call measures afresh."""
        self._state.estimate = None
        self._state.calls = 0
        self._train_switch.reset()
        self._hot_cold.clear()

    # ------------------------------------------------------------------ cached Wd^T
    def w_down_unit_major(self) -> torch.Tensor:
        """Contiguous ``down_proj.weight.t()`` ([F, d]), rebuilt only when the weight changes.

        A change is detected from the Parameter's identity, storage pointer, shape, dtype and in-place
        version counter (bumped by optimizer steps, ``copy_``, ``load_state_dict``), so the check costs a
        few attribute reads and no device work.  It is built with inference mode off, so a first call
        inside ``torch.inference_mode()`` does not leave an inference tensor in the buffer (an in-place
        update of it, or its use in autograd, would fail later).  An inference-tensor weight has no
        version counter: its transpose is returned fresh and not cached.
        """
        w = self._weights()[2]
        try:
            key = (w.data_ptr(), w._version, tuple(w.shape), w.dtype, w.device)
        except RuntimeError:  # "Inference tensors do not track version counter."
            with torch.inference_mode(False), torch.no_grad():
                return w.detach().t().contiguous()
        cached = self._wd_unit_major
        ref = self._wd_key[0] if self._wd_key is not None else None
        if cached is None or ref is None or ref() is not w or self._wd_key[1:] != key:
            with torch.inference_mode(False), torch.no_grad():
                self._wd_unit_major = w.detach().t().contiguous()
            self._wd_key = (weakref.ref(w), *key)
        return self._wd_unit_major

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / deepcopy without the derived state: the Wd^T cache and the keys that say what it and
        the sparse path were derived from (weakrefs, which cannot be pickled) are rebuilt on demand, and
        ``last_l1`` (a non-leaf tensor holding the training graph, which deepcopy refuses) belongs to the
        step that made it."""
        state = super().__getstate__()
        state["_buffers"] = {**state["_buffers"], "_wd_unit_major": None}
        state["_wd_key"] = None
        state["_sparse_prep"] = None
        state["last_l1"] = None
        state["_graphs"] = LayerGraphs(self._graphs.limit)  # recordings hold device addresses
        return state

    # ------------------------------------------------------------------ statistics and repr
    def l1_loss(self) -> torch.Tensor:
        """The differentiable L1 penalty (mean over tokens of ``sum_j |h_j|``) of the last training forward."""
        if self.last_l1 is None:
            raise RuntimeError(
                "l1_loss() needs a forward in training mode with grad enabled first "
                "(module.train(); no torch.no_grad()); the last forward, if any, was an inference forward"
            )
        return self.last_l1

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, act=relu, "
            f"backend={self.backend!r}, tile={self.tile}, capacity={self.capacity}, precision={self.precision!r}, "
            f"l0_refresh_every={self.l0_refresh_every}"
            + (f", eager_graphs={self.eager_graphs}" if self.eager_graphs != call_graphs.DEFAULT_COUNTS else "")
        )
