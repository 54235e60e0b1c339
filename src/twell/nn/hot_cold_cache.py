"""A layer's hot/cold plans (``twell.ops.hot_cold``), kept current by ``SparseGatedMLP``.

The hot units are re-chosen from a sample of the call's tokens on the layer's l0-refresh calls (the
only calls that may synchronise with the host: the hot count sets tensor sizes; a new set that
differs from the current one in under 10 % of its units is ignored); the plan's weight
copies are rebuilt when a parameter changes (its version counter or storage moves), so an optimizer
step or a ``load_state_dict`` between inference calls never leaves stale copies in use.

The hot set depends on the call's size (``hot_cold_plan.default_max_cold_l0``: at most 3 cold pairs per token under
8192 tokens, 10 (6 on dense layers) up to 131,071, 13 from there), so the cache keeps one set per size class -- the
class is the call's cold-pairs bound -- up to :data:`MAX_HOT_SETS`, and a call uses its own class's set.  With one
set (``max_sets=1``, the behaviour until session 59) a set chosen on a small call served every call size until the
next refresh: on the synthetic 2048x5632 layer (l0 29) the bound-3 set holds 1792 hot units against 320 at bound 10
and 256 at 13 (bench_results/cpu_counts/session59_synthetic_hot_units.log); on the 1.5B benchmark model's layers at
4096 tokens 768-2432 against 128-768 at bound 10 (session59_hot_units_by_bound_4096.log, fp32 on the CPU).

Everything the cache holds is built with inference mode off (and grad mode off): a refresh or a
rebuild that happens inside ``torch.inference_mode()`` would otherwise store inference tensors, which
outlive that block and make a later in-place update or autograd use of them fail ("Inference tensors
cannot be saved for backward").
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..format.twell import DEFAULT_TILE, default_capacity
from ..ops import hot_cold_dense_rows
from ..ops.hot_cold_dense_rows import dense_row_budget, heavy_row_pairs
from ..ops.hot_cold_plan import (
    HOT_MIN_FREQUENCY,
    HotColdPlan,
    active_frequency,
    build_hot_cold_plan,
    check_max_cold_l0,
    choose_hot_units,
    cold_l0_bound,
    default_max_cold_l0,
    overflow_row_fractions,
    sample_active,
)

#: The hot/cold op's dense rows (``twell.ops.hot_cold_dense_rows``): the tokens with an overflowing cold tile
#: computed by three dense GEMMs, as many as the refresh sample predicts (below).  Why: in the 1.5B forward's
#: calibrated sparsity on the H200 the first layers' few dense tokens cost the most (layer 0: 10.504 ms sparse
#: with 13,353 overflowing cold tiles in 739 of 131,072 tokens, against 6.0-6.5 ms for layers without any;
#: bench_results/h200/forward_layer_times_session22.log).  Measured on (session 22, same process, on / off):
#: layer 0 6.725 / 10.889 ms, layer 1 6.814 / 7.924, the 28 FFNs 189.477 / 201.061 ms; the whole forward 1.348x /
#: 1.326x of dense (514.2 / 522.0 ms; bench_results/h200/model_forward_inproc_*dense_rows_session22.json).  On.
#: Off: every overflowing row in the row kernel.
DENSE_OVERFLOW_ROWS = True
#: The dense-row budget of a call: the refresh sample's fraction of rows with an overflowing cold tile times the
#: call's tokens, times this margin (the sample holds 4096 rows: ~23 such rows at layer 0 above), plus the
#: slack below, rounded up to the multiple.  Unused budget costs GEMM rows (~3 x 2 x d x F FLOPs each), a budget
#: short of the rows leaves the rest to the row kernel.
DENSE_ROWS_MARGIN = 1.5
DENSE_ROWS_SLACK = 32
DENSE_ROWS_MULTIPLE = 64
#: ... and none where the call is expected to hold fewer overflowing rows than this: the pass has a fixed cost that a
#: few rows do not repay.  Measured on the H200 in session 29 (bench_results/h200/ffn_16384_rows_{on,off}
#: _session29.json, d=2048, F=5632, 16,384 tokens at 2 %): one overflowing row in the 4096-row sample gave a budget of
#: 64 rows and the module 1.216 ms against 1.137 with no dense pass (1.34x against 1.43x of dense), the op without one
#: 1.136 ms, so the ~4 expected rows cost nothing in the row kernel while the pass cost 0.079 ms. Rows that overflow
#: many tiles cost far more there: ~5.2-5.6 us each in the 1.5B forward's layers 0 and 1 (session 22 above: 4.16 ms for
#: 739 rows, 1.11 ms for 213), so the pass repays ~0.079 ms from ~15 such rows.
DENSE_ROWS_MIN_EXPECTED = 16.0
#: ... unless the call is expected to hold at least ``DENSE_ROWS_MIN_SEVERE`` rows with ``DENSE_ROWS_SEVERE_TILES`` or
#: more overflowing cold tiles each (0: no such rule): the row kernel recomputes a row's overflowing tiles one after
#: another in one program, so such a row is a tail that no other program hides once the kernel is short.  Measured on
#: the H100 in session 46 (``forward_layer_times`` at 8192 tokens, the GPU held, medians of 5; bench_results/h100/
#: forward_layer_times_b4_callrecorded_session46.log): without a budget, layer 3 (48 overflowing tiles in 9
#: tokens) took 1.143 ms, layer 4 (37 in 11) 1.000, layer 5 (19 in 9) 0.843, layers 18 and 22 (2 tiles in 1 token)
#: 0.643 / 0.640 against 0.546 / 0.521 for layers 19 and 23 (the same hot counts, nothing overflowing), while one tile
#: in one token (layers 16, 20, 25, 27) cost 0.555-0.578; layers 0-2, with budgets of 128 rows, took 0.618-0.630 with
#: 109-814 overflowing tiles, the pass ~0.07-0.08 ms over layer 19.  So a row with two such tiles already costs more
#: than the pass.  The 16-row rule alone left the model's recorded forward at 4096 tokens with 11.2 ms of row kernel
#: over 28 layers on an H100 (bench_results/h100/recorded_forward_probe_tables_4096_session46.json) against 3.64 ms
#: with a budget on every layer on an H200 (bench_results/h200/recorded_forward_probe_rows1_4096_bound3_session46.json).
#: Same card, rule off / on (H100, session 47, bench_results/h100/recorded_forward_probe_{severe0,shipped}_*
#: _session47.json, the recorded forward, tables policy): 4096 tokens row kernel 11.15 -> 4.16 ms, the forward 0.787x ->
#: 0.921x of dense by GPU time; 8192 tokens 8.75 -> 6.08 ms, 1.046x -> 1.083x; 12,288 tokens (eager, wall clock)
#: 1.285x -> 1.310x.  A pass on every layer instead (DENSE_ROWS_MIN_EXPECTED = 1) ran 0.920x at 4096: no better.
DENSE_ROWS_SEVERE_TILES = 2
DENSE_ROWS_MIN_SEVERE = 1.0
#: The several-tiles rule also counts rows with more than this many cold pairs, overflowing or not (0: none): their
#: walk in the row kernel is as long.  Such rows reach the pass as the call's heavy rows, so the bound sits above
#: ``hot_cold_dense_rows``' heavy-row bounds (64, 128).  Why (session 53, H100 80GB HBM3, the synthetic 2048x5632 layer
#: held sparse with the benchmark model's steep sequence head, --early-boost 40 --early-decay 4;
#: bench_results/h100/session53_runs.md): at 2048 tokens / 0.5 % the sample held 2 rows with one overflowing tile each
#: and 5 rows over 64 cold pairs (the longest 349 and 282 pairs), none with two overflowing tiles, so no budget: the
#: row kernel took 0.184 ms against 0.035 with the default head (scripts/infer_op_profile.py).  Measured with
#: tune-dispatch, 0 / 256 / 128 in one call: 2048 tokens 0.70x -> 1.02x / 1.02x of dense at 0.5 % (0.325 -> 0.221 /
#: 0.220 ms), 0.83x -> 1.06x / 1.07x at 0.25 %, 0.99x / 0.99x / 1.00x at 1 % (a budget there already); 4096 and 8192
#: tokens within 1 %; the default head (its 2048-token sample: no row over 128 pairs) within 1 % but for 8192 / 1 %
#: (0.552 / 0.582 ms, one run each; session 52's 0.559).  Predicted 0.9-1.1x at 2048 / 0.5 %: hit.  256, the larger
#: of the two that tied: fewer passes on layers whose longest rows are short enough for a longer call's kernel to hide.
DENSE_ROWS_SEVERE_PAIRS = 256
#: The several-tiles rule applies below this many tokens only: it was measured at 4096 and 8192 tokens, where the row
#: kernel takes ~0.13-0.32 ms a layer (H100, above) and one row's serial tiles outlast it.  Larger calls give the
#: gather's heavy-first queue a longer kernel to hide a few such rows behind (session 29: ~4 single-tile rows cost
#: nothing at 16,384 tokens, above), and the 16-row rule already covers the model's layers whose rows overflow several
#: tiles there (layers 3-5: 9-11 such rows at 8192 tokens, ~18-22 at 16,384).
DENSE_ROWS_SEVERE_MAX_TOKENS = 16384
#: Whether the budget of a call under ``hot_cold_dense_rows.HEAVY_ROWS_MAX_TOKENS`` tokens also counts the sample's
#: heavy rows (no overflowing tile, more cold pairs than the call's ``heavy_row_pairs`` bound), which the pass takes
#: in the slots the overflowing rows leave: they count toward the 16-row rule and the margin as overflowing rows do
#: (toward the several-tiles rule only over ``DENSE_ROWS_SEVERE_PAIRS``: one row of 64-320 pairs walks 16-80 gather
#: steps, a row with two overflowing tiles ~190).
#: Without it a layer whose sample shows no overflowing row gets no pass, and its heavy rows stay in the row kernel: in
#: session 48's recorded forward at 8192 tokens 12 of the 28 layers had no budget (H100,
#: bench_results/h100/recorded_forward_probe_fused_8192_session48.json), while each sequence holds 7-15 rows over 64
#: pairs a layer (heavy_rows_stats_2048_session48.log).  Measured in session 49 (H100, the recorded forward with
#: cached weights, tables policy, one run each against the bound alone in the same call;
#: bench_results/h100/recorded_forward_probe_heavy64{,_count}_{2048,4096,8192}_session49.json): 8192 tokens 45.42 ->
#: 43.52 ms, 1.134x -> 1.181x of dense (row kernel 6.04 -> 2.87 ms; budgets of 192-384 rows a layer on the CPU,
#: heavy_rows_stats_8192_heavy64_counted_session49.log; predicted 0.3-0.8 ms), 4096 24.10 -> 23.74 ms (2.03 -> 1.35;
#: the 7 layers without a budget get one), 2048 13.32 both (0.93 ms either way).  On.
DENSE_ROWS_COUNT_HEAVY = True


def _check_takes_two(rule: Callable) -> None:
    """Raise TypeError unless ``rule`` can be called with two positional arguments (tokens, density)."""
    try:
        inspect.signature(rule).bind(0, 0.0)
    except TypeError:
        raise TypeError(
            "max_cold_l0 must be None, a number, or a function of two positional arguments (the refresh call's "
            f"token count and its sample's density, active units per token over F), got {rule!r}"
        ) from None
    except ValueError:  # a builtin without a signature: it is called as documented and fails there if it must
        pass


def _weights_key(*weights: torch.Tensor) -> tuple:
    return tuple((w.data_ptr(), w._version, tuple(w.shape), w.dtype, w.device) for w in weights)


#: How many hot sets (size classes) a layer keeps at most; the class used longest ago gives its place to a new one.
#: Three: the default bound rule has three classes on a layer of steady density (under 8192 tokens, to 131,071, from
#: 131,072).  Each set holds its plan's weight copies (the fused gate layout of Wg and the hot Wu rows, the hot Wd^T
#: rows: (F + 2 H) x d elements), 25.2-37.8 MB a set at 2048x5632 in bf16 for H = 256-1792
#: (bench_results/cpu_counts/session59_synthetic_hot_units.log).  1: one set for every call size, re-chosen by
#: whichever call refreshes.
MAX_HOT_SETS = 3


class _NoClass:
    """The size class of a cache that has chosen nothing: one object, kept by copies and pickles (a plain object()
    would come back as another one and read as a class)."""

    def __reduce__(self) -> str:
        return "_NO_CLASS"

    def __repr__(self) -> str:
        return "_NO_CLASS"


_NO_CLASS = _NoClass()


class HotSet:
    """One size class's hot units, its plan and what its refresh sample measured under them."""

    __slots__ = ("hot", "plan", "key", "overflow_fraction", "severe_overflow_fraction", "heavy_row_fractions")

    def __init__(self) -> None:
        self.hot: torch.Tensor | None = None
        self.plan: HotColdPlan | None = None
        self.key: Any = None
        #: fraction of the last refresh sample's rows with an overflowing cold tile under this hot set
        self.overflow_fraction = 0.0
        #: ... with at least ``DENSE_ROWS_SEVERE_TILES`` of them or more than ``DENSE_ROWS_SEVERE_PAIRS`` cold pairs
        #: (0.0 with both rules off)
        self.severe_overflow_fraction = 0.0
        #: ... and without one but with more than K cold pairs, for each bound K of
        #: ``hot_cold_dense_rows.heavy_row_bounds()`` at the refresh (empty unless DENSE_ROWS_COUNT_HEAVY)
        self.heavy_row_fractions: dict[int, float] = {}

    @property
    def n_hot(self) -> int | None:
        """How many hot units the set holds (None: not chosen)."""
        return None if self.hot is None else int(self.hot.numel())

    def dense_rows(self, n_tokens: int) -> int:
        """See :meth:`HotColdCache.dense_rows`."""
        if not DENSE_OVERFLOW_ROWS:
            return 0
        fraction = self.overflow_fraction
        heavy = heavy_row_pairs(n_tokens)
        if DENSE_ROWS_COUNT_HEAVY and heavy > 0:
            # the pass takes them in the slots the overflowing rows leave (a bound set after the refresh: none known)
            fraction += self.heavy_row_fractions.get(heavy, 0.0)
        return dense_row_budget(n_tokens, fraction, margin=DENSE_ROWS_MARGIN, slack=DENSE_ROWS_SLACK,
                                multiple=DENSE_ROWS_MULTIPLE, min_expected=DENSE_ROWS_MIN_EXPECTED,
                                severe_fraction=self.severe_overflow_fraction
                                if n_tokens < DENSE_ROWS_SEVERE_MAX_TOKENS else 0.0,
                                min_expected_severe=DENSE_ROWS_MIN_SEVERE)

    def build_plan(self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, key: Any,
                   fused_tile: int) -> HotColdPlan | None:
        """See :meth:`HotColdCache.plan` (``key`` computed)."""
        if self.hot is None or self.hot.numel() == 0:
            return None
        if self.plan is None or key != self.key or self.plan.fused_tile != fused_tile:
            with torch.inference_mode(False), torch.no_grad():
                self.plan = build_hot_cold_plan(w_gate.detach(), w_up.detach(), w_down.detach(), self.hot,
                                                fused_tile=fused_tile)
            self.key = key
        return self.plan


class HotColdCache:
    """Holds one layer's hot sets and plans, one per size class of its calls (None plan: no unit fires often enough
    to be worth a dense pass).  The attributes of one set (``_hot``, ``_plan``, the overflow fractions) and
    :meth:`plan`, :meth:`dense_rows`, :attr:`chosen`, :attr:`n_hot` are those of the active set: the class of the last
    :meth:`select` or :meth:`refresh`."""

    def __init__(
        self,
        min_frequency: float = HOT_MIN_FREQUENCY,
        max_cold_l0: float | None | Callable[[int, float], float | None] = default_max_cold_l0,
        max_sets: int | None = None,
    ) -> None:
        """``min_frequency`` and ``max_cold_l0``: :func:`twell.ops.choose_hot_units`'s (None: no bound).
        ``max_cold_l0`` may also be a function of the refresh call's token count and its sample's density (active
        units per token over F; two positional arguments); the default,
        :func:`twell.ops.hot_cold_plan.default_max_cold_l0`, allows more cold pairs on the largest calls and fewer on
        small calls and dense layers.  ``max_sets``: how many size classes keep a set (None: :data:`MAX_HOT_SETS`;
        a fixed ``max_cold_l0`` makes one class)."""
        if not 0.0 < min_frequency <= 1.0:
            raise ValueError(f"min_frequency must be in (0, 1], got {min_frequency}")
        if callable(max_cold_l0):
            _check_takes_two(max_cold_l0)
        else:
            check_max_cold_l0(max_cold_l0)
        max_sets = MAX_HOT_SETS if max_sets is None else max_sets
        if isinstance(max_sets, bool) or not isinstance(max_sets, int) or max_sets < 1:
            raise ValueError(f"max_sets must be an int >= 1 (how many size classes keep a hot set), got {max_sets!r}")
        self.min_frequency = min_frequency
        self.max_cold_l0 = max_cold_l0
        self.max_sets = max_sets
        #: active units per token over F in the last refresh sample (None: none yet): the size class's density
        self.density: float | None = None
        self._active = HotSet()
        self._class: Any = _NO_CLASS
        self._others: dict[Any, HotSet] = {}  # the other classes' sets, the one used longest ago first

    # the active set's fields, under the names the cache had when it held one set (read by scripts and tests)
    @property
    def _hot(self) -> torch.Tensor | None:
        return self._active.hot

    @property
    def _plan(self) -> HotColdPlan | None:
        return self._active.plan

    @property
    def overflow_fraction(self) -> float:
        """Fraction of the active set's refresh sample rows with an overflowing cold tile."""
        return self._active.overflow_fraction

    @property
    def severe_overflow_fraction(self) -> float:
        """... with several overflowing tiles or more than ``DENSE_ROWS_SEVERE_PAIRS`` cold pairs."""
        return self._active.severe_overflow_fraction

    @property
    def heavy_row_fractions(self) -> dict[int, float]:
        """... without an overflowing tile but with more than K cold pairs, per heavy-row bound K."""
        return self._active.heavy_row_fractions

    @property
    def chosen(self) -> bool:
        """Whether the active set's hot units have been chosen (since the last :meth:`clear`)."""
        return self._active.hot is not None

    @property
    def n_hot(self) -> int | None:
        """How many hot units the active set holds (None: not chosen since the last :meth:`clear`)."""
        return self._active.n_hot

    @property
    def classes(self) -> list[Any]:
        """The size classes (cold-pairs bounds) holding a chosen set, the one used longest ago first."""
        active = [self._class] if self._active.hot is not None else []
        return [*self._others, *active]

    def size_class(self, n_tokens: int) -> Any:
        """The size class of a call of ``n_tokens`` tokens: its cold-pairs bound at the last sample's density."""
        return cold_l0_bound(self.max_cold_l0, n_tokens, self.density)

    def select(self, n_tokens: int) -> bool:
        """Make the set of ``n_tokens``' size class the active one (an empty one, which the caller's refresh fills,
        where the class has none yet); returns whether it has been chosen.  Nothing moves before the first refresh
        or with one set."""
        if self._class is _NO_CLASS or self.max_sets == 1:
            return self._active.hot is not None
        self._switch(self.size_class(n_tokens))
        return self._active.hot is not None

    def set_for(self, n_tokens: int, fallback: bool = True) -> HotSet | None:
        """The set a call of ``n_tokens`` tokens uses, without changing the active one (for calls that may not
        synchronise, traced or recorded): its class's chosen set, else (``fallback``) the active one if chosen, else
        None.  With one set, the set whatever the class."""
        if self._class is not _NO_CLASS and self.max_sets > 1:
            key = self.size_class(n_tokens)
            found = self._active if key == self._class else self._others.get(key)
            if found is not None and found.hot is not None:
                return found
            if not fallback:
                return None
        return self._active if self._active.hot is not None else None

    def sets(self) -> list[HotSet]:
        """Every chosen set, the active one last."""
        return [*(s for s in self._others.values() if s.hot is not None),
                *([self._active] if self._active.hot is not None else [])]

    def _switch(self, key: Any) -> None:
        """Make ``key``'s set the active one (a new empty set where it has none), keeping the active set among the
        others where chosen; the class used longest ago gives its place beyond ``max_sets``."""
        if key == self._class:
            return
        if self.max_sets == 1:  # one set, relabelled
            self._class = key
            return
        if self._active.hot is not None and self._class is not _NO_CLASS:
            self._others[self._class] = self._active
        self._active = self._others.pop(key, None) or HotSet()
        self._class = key
        while len(self._others) > self.max_sets - 1:
            self._others.pop(next(iter(self._others)))

    def refresh(self, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *,
                tile: int = DEFAULT_TILE, capacity: int | None = None) -> None:
        """Re-choose the hot units of the size class of ``x``'s call (its token count and the sample's density) from
        (a sample of) the tokens ``x``, which makes that class's set the active one, and measure on the same sample
        the fraction of rows whose cold tiles (of ``tile`` units, ``capacity`` slots; None: the default) overflow
        (for :meth:`dense_rows`); synchronises with the host twice."""
        with torch.inference_mode(False), torch.no_grad():
            active = sample_active(x, w_gate)
            frequency = active_frequency(active)
            self.density = float(frequency.mean()) if frequency.numel() else 0.0
            bound = cold_l0_bound(self.max_cold_l0, x.shape[0], self.density)
            self._switch(bound)
            hot = choose_hot_units(frequency, min_frequency=self.min_frequency, max_cold_l0=bound)
            s = self._active
            if not (s.hot is not None and s.hot.device == hot.device and self._close_enough(s.hot, hot)):
                s.hot = hot
                s.plan = None
                s.key = None
            cap = default_capacity(tile) if capacity is None else capacity
            s.overflow_fraction = s.severe_overflow_fraction = 0.0
            s.heavy_row_fractions = {}
            if s.hot.numel():
                # every bound a call may use (they differ by the call's size), so the sample serves calls of any size
                bounds = hot_cold_dense_rows.heavy_row_bounds() if DENSE_ROWS_COUNT_HEAVY else ()
                # the long rows last (0.0 with both of their tests off)
                read = overflow_row_fractions(active, s.hot, tile, cap, (1,), bounds,  # one host read
                                              long_rows=(DENSE_ROWS_SEVERE_TILES, DENSE_ROWS_SEVERE_PAIRS))
                s.overflow_fraction = read[0]
                s.severe_overflow_fraction = read[-1]
                s.heavy_row_fractions = dict(zip(bounds, read[1:1 + len(bounds)], strict=True))

    def dense_rows(self, n_tokens: int) -> int:
        """The dense-row budget of a call of ``n_tokens`` under the active set (``hot_cold_gated_ffn``'s
        ``dense_rows``): 0 with :data:`DENSE_OVERFLOW_ROWS` off, or where the last refresh sample's overflowing rows
        predict fewer than :data:`DENSE_ROWS_MIN_EXPECTED` in the call and (below :data:`DENSE_ROWS_SEVERE_MAX_TOKENS`
        tokens) its rows with :data:`DENSE_ROWS_SEVERE_TILES` or more overflowing tiles or more than
        :data:`DENSE_ROWS_SEVERE_PAIRS` cold pairs (the long rows) fewer than :data:`DENSE_ROWS_MIN_SEVERE`.  With
        :data:`DENSE_ROWS_COUNT_HEAVY`, in calls under ``HEAVY_ROWS_MAX_TOKENS`` tokens, the sample's heavy rows count
        as overflowing ones."""
        return self._active.dense_rows(n_tokens)

    #: A re-chosen hot set that shares at least this fraction of units with the current one (and has the
    #: same size) is ignored: units near the frequency threshold flip in and out of a 4096-token sample,
    #: and each change would rebuild the plan (a reordered copy of Wg and host syncs) for no speed gain.
    KEEP_OVERLAP = 0.9

    @classmethod
    def _close_enough(cls, old: torch.Tensor, new: torch.Tensor) -> bool:
        if old.numel() != new.numel():
            return False
        if old.numel() == 0:
            return True
        return int(torch.isin(new, old).sum()) >= cls.KEEP_OVERLAP * old.numel()

    def plan(
        self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *, key: Any = None,
        fused_tile: int = 0,
    ) -> HotColdPlan | None:
        """The active set's plan for the current weights (rebuilt if they changed), or None when it has no hot unit.

        ``key``: a fingerprint of the three weights that the caller has already computed (anything
        that compares equal exactly while the weights are unchanged; ``SparseGatedMLP`` passes its
        own, identity included), which saves building one here per call; None: this cache's own
        (storage pointer, version, shape, dtype, device of each weight).  ``fused_tile``: the plan's
        gate weight layout (see ``HotColdPlan``); a change rebuilds the plan.
        """
        if self._active.hot is None or self._active.hot.numel() == 0:
            return None
        if key is None:
            key = _weights_key(w_gate, w_up, w_down)
        return self._active.build_plan(w_gate, w_up, w_down, key, fused_tile)

    def snapshot(self) -> tuple[Any, ...]:
        """Every set and which is active, for :meth:`restore` (copies of the sets: later refreshes leave it as is)."""
        return (self._class, copy.copy(self._active), {k: copy.copy(v) for k, v in self._others.items()},
                self.density)

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Put back what :meth:`snapshot` kept (the rule and the number of places stay the cache's own)."""
        self._class, active, others, self.density = snapshot
        self._active = copy.copy(active)
        self._others = {k: copy.copy(v) for k, v in others.items()}

    def clear(self) -> None:
        """Forget every set (the next call chooses afresh)."""
        self._active = HotSet()
        self._class = _NO_CLASS
        self._others = {}
        self.density = None
