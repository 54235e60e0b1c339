"""The per-layer training switch of ``SparseGatedMLP(train_impl="auto")``: sparse Triton op or dense autograd.

The sparse training op (the hot/cold split :func:`twell.ops.twell_gated_ffn_l1_hot_cold` where Triton
runs, chosen by :func:`sparse_train_fn`'s answer) pays off only when the layer's
activation is sparse enough for its token count M, and a layer's density moves during training (L1
makes it fall over the first ~1,000 steps; dead-unit revival and per-layer differences move it too).
So the decision is taken per layer and per call from two things:

* a **threshold table** per layer shape ``(hidden_size, intermediate_size)``: rows
  ``(min_tokens, max_density)`` sorted by ``min_tokens``, read exactly like the inference table of
  :mod:`twell.nn.dispatch` (the row with the largest ``min_tokens <= M`` applies; sparse iff
  ``l0 / F <= max_density``; below the first row, dense).  The thresholds are measurements of
  ``twell bench train-ffn`` on the target GPU and dtype, nothing else;
* the layer's **l0** (mean active units per token).  Both paths produce it on the device every call
  (the sparse op from its row counts, the dense path with one Triton read of the gate activation,
  :func:`twell.ops.active_count.mean_active_per_token`: ``count_nonzero`` took 10 % of a dense step),
  and the host reads it (one synchronisation) only every ``l0_refresh_every`` training calls, at the
  *start* of a call, from the previous call's value (by then long computed, so the read rarely waits).
  Calls in between take no host sync.

Gradient checkpointing re-runs the forward inside the backward; that re-run must take the path the
original forward took or the recomputed tensors would not match.  The re-run is recognised by running
inside the autograd engine (``torch._C._current_graph_task_id() != -1``, which is how
``torch.utils.checkpoint`` itself tells), and it neither counts as a call nor refreshes the estimate, so
it sees the estimate the forward saw.  (A second forward of the same layer between a forward and its
backward, e.g. two micro-batches before one backward, can refresh in between; checkpointing then
raises its "recomputed tensors differ" error rather than computing wrong gradients.)

:data:`H200_BF16_TRAIN_TABLES` holds the crossings measured on an H200 (bf16, hot/cold op); a shape
without a measured table always runs dense autograd, with no host synchronisation at all (it never
pays the l0 read), and so does every layer on a GPU that is not a Hopper under :data:`DEFAULT_TRAIN_POLICY`
(``capabilities``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..ops._runtime import cuda_capability, interpreting, triton_available
from ..ops.active_count import mean_active_per_token
from ..ops.training import twell_gated_ffn_l1
from ..reference.inference import _acc_dtype
from ..reference.training import gated_ffn_l1
from .dispatch import (
    HOPPER,
    DispatchPolicy,
    DispatchTable,
    _check_tokens,
    capability_allowed,
    check_capabilities,
    density_of,
)

__all__ = [
    "DEFAULT_TRAIN_POLICY",
    "H200_BF16_TRAIN_TABLES",
    "TrainDispatchPolicy",
    "TrainSwitch",
    "autocast_dtype",
    "compute_dtype",
    "dense_train_ffn_l1",
    "sparse_train_fn",
]

Shape = tuple[int, int]
TrainFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

#: ``(hidden_size, intermediate_size) -> ((min_tokens, max_density), ...)`` for bf16 on one H200, from
#: ``twell bench train-ffn --sparse-impl hot-cold`` (forward+backward with L1 vs dense autograd; the
#: layer's sparse path is the hot/cold op), bench_results/h200/train_ffn_hotcold_sweep_final.json (commit
#: 086b78a).  At 2048 x 5632 the hot/cold op lost at M=4096 at every density (0.41-0.54x: its fixed
#: costs against a 1.45 ms dense step); from M=16384 it won at every measured density up to 10 %
#: (M=16384: 1.72x at 0.5 %, 1.35x at 2 %, 1.20x at 10 %; M=65536: 2.48x, 1.41x, 1.28x; M=131072: 2.52x,
#: 1.49x, 1.36x).  Densities above 10 % were not measured, so they train dense; shapes without a row too.
H200_BF16_TRAIN_TABLES: dict[Shape, DispatchTable] = {(2048, 5632): ((16384, 0.10),)}


def _check_shape(shape: object) -> Shape:
    try:
        d, f = shape  # type: ignore[misc]
        if isinstance(d, bool) or isinstance(f, bool):
            raise TypeError
        return int(d), int(f)
    except (TypeError, ValueError):
        raise TypeError(f"a layer shape must be a pair (hidden_size, intermediate_size), got {shape!r}") from None


@dataclass(frozen=True, eq=False)
class TrainDispatchPolicy:
    """Which training FFN a layer of a given shape runs for M tokens at density l0 / F.

    Attributes:
        tables: ``{(hidden_size, intermediate_size): ((min_tokens, max_density), ...)}`` (see the module
            docstring); a shape that is not a key gets ``default_table``.
        default_table: the table for shapes not in ``tables``; empty (always dense) unless given.
        device_types: device types the tables were measured on; elsewhere dense (unless ``force``).
        dtypes: compute dtypes the tables were measured in (the autocast dtype under autocast); a layer
            computing in another dtype gets dense (unless ``force``).
        force: apply the tables on every device type and dtype (tests, the interpreter, experiments).
        capabilities: CUDA compute capabilities ``(major, minor)`` the tables were measured on, or None (any); on a
            CUDA device of another capability, dense (unless ``force``).  :data:`DEFAULT_TRAIN_POLICY`: Hopper
            (:data:`twell.nn.dispatch.HOPPER`), as the inference policy.
    """

    tables: Mapping[Shape, DispatchTable] = field(default_factory=lambda: dict(H200_BF16_TRAIN_TABLES))
    default_table: DispatchTable = ()
    device_types: tuple[str, ...] = ("cuda",)
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)
    force: bool = False
    capabilities: tuple[tuple[int, int], ...] | None = None
    _policies: dict[Shape, DispatchPolicy] = field(init=False, repr=False)
    _default: DispatchPolicy = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tables, Mapping):
            raise TypeError(f"tables must be a mapping (hidden_size, intermediate_size) -> table, got {self.tables!r}")
        # Each table is checked (and looked up) by a forced DispatchPolicy: one table format, one reader.
        policies = {_check_shape(s): DispatchPolicy(table=t, force=True, shapes=None) for s, t in self.tables.items()}
        object.__setattr__(self, "tables", {s: p.table for s, p in policies.items()})
        object.__setattr__(self, "_policies", policies)
        object.__setattr__(self, "_default", DispatchPolicy(table=self.default_table, force=True, shapes=None))
        object.__setattr__(self, "default_table", self._default.table)
        if isinstance(self.device_types, str) or not all(isinstance(t, str) for t in self.device_types):
            raise TypeError(f"device_types must be a tuple of device type strings, got {self.device_types!r}")
        object.__setattr__(self, "device_types", tuple(self.device_types))
        if not all(isinstance(t, torch.dtype) for t in self.dtypes):
            raise TypeError(f"dtypes must be a tuple of torch dtypes, got {self.dtypes!r}")
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        if not isinstance(self.force, bool):
            raise TypeError(f"force must be a bool, got {type(self.force).__name__}")
        object.__setattr__(self, "capabilities", check_capabilities(self.capabilities))

    @classmethod
    def always_sparse(cls) -> TrainDispatchPolicy:
        """Sparse for every shape, token count, density, device and dtype."""
        return cls(tables={}, default_table=((0, 1.0),), force=True)

    @classmethod
    def always_dense(cls) -> TrainDispatchPolicy:
        """Dense for every call."""
        return cls(tables={}, default_table=(), force=True)

    def _policy(self, shape: Shape) -> DispatchPolicy:
        return self._policies.get(_check_shape(shape), self._default)

    def may_use_sparse(self, *, device_type: str, shape: Shape, dtype: torch.dtype,
                       capability: tuple[int, int] | None = None) -> bool:
        """False when no density can give the sparse path (so the caller need not read l0 at all).  ``capability``:
        the CUDA device's compute capability (:func:`twell.ops._runtime.cuda_capability`; None: not checked)."""
        if not self.force and (device_type not in self.device_types or dtype not in self.dtypes
                               or not capability_allowed(self.capabilities, device_type, capability)):
            return False
        return bool(self._policy(shape).table)

    def use_sparse(
        self, n_tokens: int, density: float, *, device_type: str, shape: Shape, dtype: torch.dtype,
        capability: tuple[int, int] | None = None,
    ) -> bool:
        """True iff the sparse op should run for ``n_tokens`` tokens at ``density`` (= l0 / F, in [0, 1])."""
        _check_tokens(n_tokens)
        if not self.may_use_sparse(device_type=device_type, shape=shape, dtype=dtype, capability=capability):
            return False
        return self._policy(shape).use_sparse(n_tokens, density, device_type=device_type)


#: The policy of every ``SparseGatedMLP`` unless given another (``train_policy``).
DEFAULT_TRAIN_POLICY = TrainDispatchPolicy(capabilities=HOPPER)


def _in_backward() -> bool:
    """True inside the autograd engine, i.e. during a checkpointed forward's recomputation."""
    return torch._C._current_graph_task_id() != -1


class TrainSwitch:
    """The per-layer state of the switch: call counter, host-side l0 estimate, last decision.

    ``choose`` is called once per training forward of the layer.  ``host_reads`` counts the
    device-to-host reads of l0 (what tests check); ``last_sparse`` is the last decision (None before
    the first call).
    """

    def __init__(self) -> None:
        self.calls = 0
        self.estimate: float | None = None
        self.host_reads = 0
        self.last_sparse: bool | None = None

    def reset(self) -> None:
        """Forget the estimate and the counter (e.g. after loading other weights)."""
        self.__init__()  # type: ignore[misc]

    @staticmethod
    def _possible(policy: TrainDispatchPolicy, n_tokens: int, device_type: str, shape: Shape, dtype: torch.dtype,
                  capability: tuple[int, int] | None) -> bool:
        """Whether any density could give the sparse path (if not, l0 need not be read at all)."""
        if n_tokens == 0 or not policy.may_use_sparse(device_type=device_type, shape=shape, dtype=dtype,
                                                      capability=capability):
            return False
        return device_type != "cuda" or triton_available() or policy.force

    def traced_choice(
        self, policy: TrainDispatchPolicy, n_tokens: int, *, device: torch.device, shape: Shape, dtype: torch.dtype
    ) -> bool:
        """:meth:`choose` for a call traced by torch.compile: the same rule on the current estimate, with
        no counting and no l0 read (state that changes per call would recompile the graph every call)."""
        capability = cuda_capability(device)
        if not self._possible(policy, n_tokens, device.type, shape, dtype, capability):
            return False
        return policy.use_sparse(n_tokens, density_of(self.estimate, shape[1]), device_type=device.type, shape=shape,
                                 dtype=dtype, capability=capability)

    def choose(
        self,
        policy: TrainDispatchPolicy,
        n_tokens: int,
        *,
        device: torch.device,
        shape: Shape,
        dtype: torch.dtype,
        last_l0: torch.Tensor | None,
        refresh_every: int,
    ) -> bool:
        """Sparse (True) or dense for this call; reads ``last_l0`` on the host only on refresh calls."""
        device_type, capability = device.type, cuda_capability(device)
        if not self._possible(policy, n_tokens, device_type, shape, dtype, capability):
            self.last_sparse = False
            return False
        if not _in_backward():
            # Refresh before deciding, so that a checkpoint's recomputation (which skips this) decides
            # from the same estimate as the forward it repeats.
            if last_l0 is not None and (self.estimate is None or self.calls % refresh_every == 0):
                self.estimate = float(last_l0)  # the switch's only device-to-host synchronisation
                self.host_reads += 1
            self.calls += 1
        density = density_of(self.estimate, shape[1])
        self.last_sparse = policy.use_sparse(n_tokens, density, device_type=device_type, shape=shape, dtype=dtype,
                                             capability=capability)
        return self.last_sparse


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype when autocast is on for ``device_type``, else None (also for device types
    autocast does not know, such as ``meta``)."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except RuntimeError:
        pass
    return None


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the layer computes in: the autocast dtype under autocast on x's device, else x's."""
    return autocast_dtype(x.device.type) or x.dtype


def sparse_train_fn(device: torch.device) -> TrainFn:
    """The sparse training FFN for ``device``: the Triton op on CUDA (or under ``TRITON_INTERPRET=1``),
    else the pure-PyTorch sparse reference (reachable on the CPU only through a forced policy)."""
    if triton_available() and (device.type == "cuda" or interpreting()):
        return twell_gated_ffn_l1
    return gated_ffn_l1


def dense_train_ffn_l1(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *, with_l0: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Dense autograd of the ReLU-gated FFN with L1 at cuBLAS speed: ``(out, l1, l0)``.

    ``out = F.linear(relu(F.linear(x, Wg)) * F.linear(x, Wu), Wd)`` in the input dtype (or the autocast
    dtype), ``l1 = sum |h| / M`` accumulated in float32 (float64 for float64), ``l0`` the mean number of
    active units per token (float32, no grad; a NaN gate counts as active) or None when ``with_l0`` is
    False.  Unlike :func:`twell.reference.training.dense_gated_ffn_l1` (the oracle's dense twin, which
    keeps u and h in float32 and so runs float32 matmuls for bf16 inputs, ~10x slower on a GPU) the
    matmuls run in the input dtype with their outputs rounded to it: what ordinary bf16 training does.
    Autograd saves relu(g), u and h ([M, F] each, input dtype).
    """
    m = x.shape[0]
    a = F.relu(F.linear(x, w_gate))
    h = a * F.linear(x, w_up)
    out = F.linear(h, w_down)
    # abs() is not saved by sum's backward, and abs's backward reuses h, which the down matmul saves.
    l1 = h.abs().sum(dtype=_acc_dtype(h.dtype)) / max(1, m)
    l0 = None
    if with_l0:
        l0 = mean_active_per_token(a)
    return out, l1, l0
