"""The plan of the hot/cold split: which units are hot, and the weight copies it needs.

Kept free of Triton so that ``twell.ops`` imports on machines without it; the kernels are in
``twell.ops.hot_cold``, whose docstring explains the method.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .._validation import check_tensor
from ..reference.inference import tile_counts

#: Units firing on at least this fraction of tokens are made hot by :func:`choose_hot_units`.  From
#: the H200 probe at d=2048, F=5632, M=131072, l0=28: going from 384 to 512 hot units (frequencies
#: ~1.0-0.7 %) still saved 0.03 ms, from 512 to 768 (~0.7-0.5 %) cost 0.08 ms; at l0=56 768 units
#: still won.  0.6 % sits at that break-even.  Re-measured in session 16 with the list pass and the PTX
#: slots (scripts/hot_threshold_probe.py, back to back at the power cap, bench_results/h200/
#: hot_threshold_probe_session16.log): flat within the runs' spread.  At M=131072, l0=28 the op took 7.596 /
#: 7.580 ms and 5.26 / 5.24 J at 0.6 % (576 hot units), 7.883 ms at 0.4 %, 7.629 at 0.8 %, 7.499 at 1.0 %, 7.396
#: at 1.3 % (5.20 J), 7.659 at 1.6 %; at l0=56 9.107 / 9.073 ms at 0.6 %, 8.897 / 8.900 at 1.0 / 1.3 %; at
#: l0=14 6.590 / 6.604 at 0.6 % and 6.665-6.816 elsewhere; at M=16384, l0=28 0.977-1.025 ms.  No threshold
#: is better at every point by more than the spread (1-2 %; 0.8 % is slower than both its neighbours), so
#: 0.6 % stayed then.  Session 20 re-ran the probe with the heavy-first cold gather
#: (hot_threshold_probe_session20.log), the shipped 0.6 % first and last: 1.3 % won where session 16 had
#: it ahead, now by more than the spread: M=131072, l0=28 7.123 vs 7.385 / 7.376 ms (-3.5 %), 5.07 vs
#: 5.16 / 5.26 J (256 vs 576 hot units); l0=56 8.451 vs 8.847 / 8.832 ms (-4.4 %, 576 vs 1344); M=16384,
#: l0=28 0.911 vs 0.941 / 0.938 ms (-3 %).  It loses only at l0=14 (128 vs 256 hot units), 6.471 vs
#: 6.425 / 6.421 ms (+0.7 %).  Inference only: training keeps its own threshold
#: (``hot_cold_training.TRAIN_HOT_MIN_FREQUENCY``), whose per-unit gradient kernel has no token splits.
HOT_MIN_FREQUENCY = 0.013
#: ... and more units are hot where the 1.3 % threshold leaves more cold pairs per token than this.  The
#: threshold alone was a loss wherever it left many cold pairs (session 20's sweep: 4096 tokens at 2 %
#: 0.66x, 16384 1.03x, against 1.23x and 1.37x with 0.6 %).  Session 20's probe at l0=112
#: (hot_threshold_probe_l0_112_session20.log) had its best time at 9.5-9.7 cold pairs per token at every M
#: (M=16384: 1.292 ms with 2304 hot units against 1.339 with 3072 and 1.529 with 1344; M=131072: 10.282
#: against 11.015 and 10.389), except at 4096 tokens (0.365 ms at 0.8 cold pairs, 0.383 at 9.7, 0.571 at
#: 18.8); at l0=56 the best was 10.9 cold pairs at M=32768 (2.164 vs 2.395 ms at 15.6), 13.0 at 16384
#: (1.120 vs 1.137-1.142 at 15.3) but 15.3 at 131072 (8.451 vs 8.695 at 11.2).  10 keeps l0 <= 28 on the
#: threshold alone (9.8 cold pairs at l0=28).
HOT_MAX_COLD_L0 = 10.0
#: From ``HOT_LARGE_TOKENS`` tokens on, the bound is ``HOT_MAX_COLD_L0_LARGE`` (:func:`default_max_cold_l0`): fewer hot
#: units, more cold pairs.  Measured on the H200 in session 23.  In the 1.5B forward (131,072 tokens a call, per-layer
#: FFN times with the rules interleaved round by round, medians of 5;
#: bench_results/h200/forward_hot_sets_interleaved_session23.log) the 28 FFNs took 188.900 ms with bound 13 against
#: 194.895 with 10.  The 14 layers where the bound changes the hot set (2-15: 256-512 hot units instead of 320-832,
#: 10.2-12.9 cold pairs per token) account for -4.570 ms of it; the 14 whose set did not change moved -1.423 ms, which
#: is the run's spread.  Bound 16 gave -2.281 ms on the changed layers, no bound -4.161.  The whole forward, bound 13
#: against 10 in one call: 1.349x against 1.338x of dense (model_forward_bound{13,10}_session23.json).  On the synthetic
#: FFN at 131,072 tokens and l0=56 (hot_bound_probe_session23.log, back to back at the power cap) bound 13 took 8.489 ms
#: against 8.569 / 8.597 with bound 10, and bound 16 took 8.370 ms.  At l0=28 the bound does not bind.  At 16,384 tokens
#: and l0=56 the larger bounds lose: 1.095 ms with 13 and 1.113 with 16, against 1.076 / 1.080 with 10.  Session 20 also
#: found the best bound at 32,768 tokens to be 10.9, so smaller calls keep 10.  Between 16,384 and 131,072 tokens
#: nothing was measured until session 29 (below); 131,072 is the smallest size where the larger bound won.  Session 29
#: (call 2, bench_results/h200/dispatch_2048x5632_session29_large_bound{6,10,13}.json, module held sparse against
#: dense): at 131,072 tokens 13 and 10 within 0.02x of each other at 0.5-5 % (0.5 %: 2.00x / 2.01x), 6 behind at 0.5-1 %
#: (1.91x / 1.57x against 2.00x / 1.65x) and within 0.03x from 2 %; 13 kept.
HOT_LARGE_TOKENS = 131072
HOT_MAX_COLD_L0_LARGE = 13.0
#: Below ``HOT_SMALL_TOKENS`` tokens the bound is ``HOT_MAX_COLD_L0_SMALL``: more hot units, fewer cold pairs.  Measured
#: on the H200 in session 28 (d=2048, F=5632, ``twell tune-dispatch`` with the module held sparse against the dense
#: module, interleaved, one run per bound in one call; bench_results/h200/dispatch_2048x5632_session28_bound{1,3,10}
#: .json): with bound 3 instead of 10, 4096 tokens won at every density, 1.23-1.80x against 0.99-1.68x (3 %: 1.31x
#: against 0.99x), and 2048 tokens 1.17-1.49x against 0.95-1.60x (1-3 %: 1.17-1.30x against 0.95-1.04x; only 0.25 % was
#: slower, 1.49x against 1.60x); bound 1 was no better than 3 anywhere by more than 0.04x.  At 8192 tokens the two
#: bounds split (3: 1.35x / 1.30x at 2 % / 3 % against 1.18x / 1.15x; 10: 1.50x / 1.78x at 1 % / 0.5 % against 1.45x /
#: 1.62x), so 8192 keeps the middle tier's bounds (10, and 6 from ``HOT_DENSE_DENSITY``, below).  Session 20's probe
#: pointed the same way (4096 tokens at l0=112: 0.365 ms at 0.8 cold pairs per token against 0.383 at 9.7).  Why: at
#: these sizes a hot unit's GEMM columns cost little in absolute time, while the cold gather over a few thousand tokens
#: is short of programs to hide its latency.
HOT_SMALL_TOKENS = 8192
HOT_MAX_COLD_L0_SMALL = 3.0
#: Between ``HOT_SMALL_TOKENS`` and ``HOT_LARGE_TOKENS`` tokens, a layer whose refresh sample has a density (active
#: units per token over F) of at least ``HOT_DENSE_DENSITY`` gets the bound ``HOT_MAX_COLD_L0_DENSE`` instead of
#: ``HOT_MAX_COLD_L0``.  Measured on the H200 in session 29 (d=2048, F=5632, ``twell tune-dispatch`` with the module
#: held sparse against the dense module, one run per bound in one call;
#: bench_results/h200/dispatch_2048x5632_session29_mid_bound{3,6,10}.json).  Speedup at 1.5 / 2 / 3 % (l0 84 / 112 /
#: 168), bound 6 against 10: 16,384 tokens 1.46x / 1.43x / 1.34x against 1.42x / 1.36x / 1.27x; 32,768 tokens 1.44x /
#: 1.42x / 1.33x against 1.42x / 1.39x / 1.30x; 8192 tokens 1.42x / 1.39x / 1.32x against 1.43x / 1.35x / 1.16x.  At
#: 0.5 / 1 % (l0 28 / 56) 10 stays ahead at 16,384 and 32,768 tokens (2.01x / 1.68x and 1.97x / 1.69x against 1.93x /
#: 1.60x and 1.94x / 1.59x); at 5-10 % the two are level within 0.01x.  Bound 3 was behind 6 below 5 % at these sizes
#: and level from there.  At 65,536 tokens (call 2, dispatch_2048x5632_session29_large_bound{6,10}.json) 6 and 10 tie
#: from 2 % (1.42x / 1.33x against 1.42x / 1.32x at 2 / 3 %), so the tier keeps one rule to 131,071 tokens.  Session
#: 29 set the split in l0 (70, between 56 and 84); session 30 found that it misfired at 4096 x 14336, where 0.5 % is
#: l0 72: at 16,384 tokens / 0.5 % the op took 4.876 ms with 5056 hot units (bound 6; 1.57x,
#: ffn_4096x14336_session30.json) against 4.507 ms with 3392 in session 27 (bound 10; 1.69x,
#: ffn_4096x14336_session27.json) of the same ~7.6 ms dense FFN.  So the split is a density: 1.25 % lies between
#: session 29's 1 % and 1.5 % points and leaves 2048 x 5632 where it was (l0 70.4).  Timed at 4096 x 14336 in session
#: 31 (bench_results/h200/ffn_4096x14336_split_session31.json): 16,384 tokens / 0.5 % 4.424 ms with 3392 hot units,
#: 1.68x.  There bound 6 does not win at 1.5-3 % as it did at 2048 x 5632: tune-dispatch as shipped against bound 10
#: everywhere (dispatch_4096x14336_session31_{split,bound10}.json) read 1.33x / 1.30x / 1.29x against 1.34x / 1.31x /
#: 1.28x at 16,384 tokens and 1.36x / 1.31x / 1.27x against 1.39x / 1.36x / 1.27x at 32,768 (one run).
HOT_DENSE_DENSITY = 0.0125
HOT_MAX_COLD_L0_DENSE = 6.0
#: The hot count is rounded down to a multiple of this (GEMM and tile alignment of the [M, F + H] output).
HOT_MULTIPLE = 64
#: Tokens sampled by :func:`unit_frequency` (one [4096, F] GEMM: ~0.14 ms at d=2048, F=5632 on an H200).
FREQUENCY_SAMPLE_TOKENS = 4096
#: Plans built for ``SparseGatedMLP`` (and ``twell bench ffn``'s hot/cold column) hold the fused gate
#: kernel's weight layout (``twell.ops.hot_cold_gate_kernel``) where :func:`fused_gate_tile` allows it:
#: the GEMM, the hot hidden state and the cold pack in one kernel.  On since the H200 probe
#: (bench_results/h200/hot_cold_gate_probe_session8.log, d=2048, F=5632): the three kernels it replaces
#: 6.797 -> 6.038 ms at M=131072, l0=28, the op 9.383 -> 8.559 ms (dense 13.483); 1.256 -> 1.152 ms at
#: M=16384.  ``twell bench ffn / model --no-fused-gate`` turn it off for a run.
FUSED_GATE = True
#: The TwELL tiles the fused gate kernel takes (output tiles of 2 * tile columns, at most 256).
FUSED_TILES = (16, 32, 64, 128)


@dataclass(frozen=True)
class HotColdPlan:
    """Which units are hot, and the weight copies the split needs (built by :func:`build_hot_cold_plan`).

    Attributes:
        hot: int64 [H], the hot unit ids, increasing.
        cold: int32 [F - H], the cold unit ids, increasing (TwELL column -> weight row).
        w_gemm: the gate GEMM's weight: with ``fused_tile`` 0, [F + H, d], rows ``Wg[hot]``, ``Wg[cold]``,
            ``Wu[hot]`` (a cuBLAS GEMM, then the hot hidden kernel and the cold pack); else the fused
            kernel's layout for that TwELL tile (:func:`fused_gate_weight`).
        w_down_hot_t: [H, d], ``Wd[:, hot]^T`` contiguous.
        fused_tile: 0, or the TwELL tile whose fused layout ``w_gemm`` holds (the op must run at it).
    """

    hot: torch.Tensor
    cold: torch.Tensor
    w_gemm: torch.Tensor
    w_down_hot_t: torch.Tensor
    fused_tile: int = 0

    @property
    def n_hot(self) -> int:
        return int(self.hot.shape[0])

    @property
    def n_units(self) -> int:
        return int(self.hot.shape[0] + self.cold.shape[0])


def sample_active(x: torch.Tensor, w_gate: torch.Tensor, *, max_tokens: int = FREQUENCY_SAMPLE_TOKENS) -> torch.Tensor:
    """Which units fire (gate > 0, or NaN) on up to ``max_tokens`` evenly spaced rows of x: bool [S, F]."""
    check_tensor(x, "x", ndim=2)
    check_tensor(w_gate, "w_gate", ndim=2)
    m = x.shape[0]
    if m > max_tokens:
        x = x[torch.linspace(0, m - 1, max_tokens, device=x.device).long()]
    g = torch.nn.functional.linear(x, w_gate)
    return (g > 0) | g.isnan()


def unit_frequency(x: torch.Tensor, w_gate: torch.Tensor, *, max_tokens: int = FREQUENCY_SAMPLE_TOKENS) -> torch.Tensor:
    """Fraction of tokens on which each unit fires, from up to ``max_tokens`` evenly spaced rows of x; fp32 [F]."""
    return active_frequency(sample_active(x, w_gate, max_tokens=max_tokens))


def active_frequency(active: torch.Tensor) -> torch.Tensor:
    """Per-unit firing fraction of a bool [S, F] sample (:func:`sample_active`); zeros for an empty sample."""
    if active.shape[0] == 0:
        return torch.zeros(active.shape[1], dtype=torch.float32, device=active.device)
    return active.float().mean(0)


def _cold_tile_counts(active: torch.Tensor, hot: torch.Tensor, tile: int) -> torch.Tensor | None:
    """Per-(row, cold tile) non-zero counts of the split's cold part (None: no row or no cold unit)."""
    s, f = active.shape
    cold_mask = torch.ones(f, dtype=torch.bool, device=active.device)
    cold_mask[hot.to(active.device)] = False
    cold = active[:, cold_mask]
    if s == 0 or cold.shape[1] == 0:
        return None
    return tile_counts(cold.to(torch.int8), tile)  # 1 where a unit fires: the split's per-tile counts


def overflow_tiles_per_row(active: torch.Tensor, hot: torch.Tensor, tile: int, capacity: int) -> torch.Tensor:
    """int64 [S]: how many cold tiles of each sample row hold more than ``capacity`` non-zeros (on ``active``'s device).

    ``active``: bool [S, F] (:func:`sample_active`); ``hot``: the hot unit ids.  The cold tiles are the split's:
    the cold units in increasing id order, ``tile`` to a tile (``build_hot_cold_plan``'s ``cold``).
    """
    per_tile = _cold_tile_counts(active, hot, tile)
    if per_tile is None:
        return torch.zeros(active.shape[0], dtype=torch.int64, device=active.device)
    return (per_tile > capacity).sum(1, dtype=torch.int64)


def overflow_row_fractions(active: torch.Tensor, hot: torch.Tensor, tile: int, capacity: int,
                           min_tiles: Sequence[int], heavy_pairs: int | Sequence[int] = 0, *,
                           long_rows: tuple[int, int] | None = None) -> list[float]:
    """For each entry of ``min_tiles``, the fraction of the sample's rows with at least that many cold tiles of more
    than ``capacity`` non-zeros (:func:`overflow_tiles_per_row`); then, for each heavy-row bound in ``heavy_pairs``
    (one int, 0 for none, or a sequence of ints >= 1), one more entry: the fraction of rows without such a tile whose
    cold pairs exceed it (the dense-row pass's heavy rows, ``hot_cold_dense_rows.heavy_row_pairs``); then, with
    ``long_rows = (tiles, pairs)``, a last entry: the fraction of rows with at least ``tiles`` overflowing cold tiles
    (0: that test off) or more than ``pairs`` cold pairs (0: off), the rows whose walk in the row kernel is long
    (``hot_cold_cache``'s several-tiles rule).  One host sync for all of them; 0.0 for an empty sample."""
    if not min_tiles or any(k < 1 for k in min_tiles):
        raise ValueError(f"min_tiles must be one or more ints >= 1, got {list(min_tiles)}")
    bounds = _heavy_bounds(heavy_pairs)
    if long_rows is not None and (not isinstance(long_rows, (tuple, list)) or len(long_rows) != 2 or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in long_rows)):
        raise ValueError(f"long_rows must be None or (tiles, pairs), two ints >= 0 (0: that test off), got "
                         f"{long_rows!r}")
    n_out = len(min_tiles) + len(bounds) + (long_rows is not None)
    per_tile = _cold_tile_counts(active, hot, tile)
    if per_tile is None:
        return [0.0] * n_out
    per_row = (per_tile > capacity).sum(1, dtype=torch.int64)
    fractions = [(per_row >= k).float().mean() for k in min_tiles]
    pairs = per_tile.sum(1, dtype=torch.int64) if bounds or long_rows else None
    fractions += [((per_row == 0) & (pairs > k)).float().mean() for k in bounds]
    if long_rows is not None:
        tiles, many = long_rows
        long = torch.zeros_like(per_row, dtype=torch.bool)
        if tiles:
            long |= per_row >= tiles
        if many:
            long |= pairs > many
        fractions.append(long.float().mean())
    return torch.stack(fractions).tolist()


def _heavy_bounds(heavy_pairs: object) -> tuple[int, ...]:
    """``overflow_row_fractions``' ``heavy_pairs`` as a tuple of bounds (an int 0: none)."""
    def bad(v: object) -> bool:
        return isinstance(v, bool) or not isinstance(v, int)
    if isinstance(heavy_pairs, Sequence) and not isinstance(heavy_pairs, str):
        if any(bad(k) or k < 1 for k in heavy_pairs):
            raise ValueError(f"heavy_pairs as a sequence must hold ints >= 1, got {list(heavy_pairs)!r}")
        return tuple(heavy_pairs)
    if bad(heavy_pairs) or heavy_pairs < 0:  # type: ignore[operator]
        raise ValueError(f"heavy_pairs must be an int >= 0 (0: none) or a sequence of ints >= 1, got {heavy_pairs!r}")
    return (heavy_pairs,) if heavy_pairs else ()  # type: ignore[return-value]


def overflow_row_fraction(active: torch.Tensor, hot: torch.Tensor, tile: int, capacity: int,
                          min_tiles: int = 1) -> float:
    """Fraction of the sample's rows with at least ``min_tiles`` cold tiles of more than ``capacity`` non-zeros
    (:func:`overflow_row_fractions` for one threshold)."""
    if min_tiles < 1:
        raise ValueError(f"min_tiles must be >= 1, got {min_tiles}")
    return overflow_row_fractions(active, hot, tile, capacity, (min_tiles,))[0]


def default_max_cold_l0(n_tokens: int, density: float | None = None) -> float:
    """The cold-pairs bound of the hot set chosen on a call of ``n_tokens`` tokens whose sample has ``density``
    (active units per token over F; None: not known): ``HOT_MAX_COLD_L0_LARGE`` from ``HOT_LARGE_TOKENS`` tokens on,
    ``HOT_MAX_COLD_L0_SMALL`` below ``HOT_SMALL_TOKENS``; between them ``HOT_MAX_COLD_L0_DENSE`` where ``density``
    is at least ``HOT_DENSE_DENSITY``, else ``HOT_MAX_COLD_L0`` (the constants are read at call time)."""
    if n_tokens >= HOT_LARGE_TOKENS:
        return HOT_MAX_COLD_L0_LARGE
    if n_tokens < HOT_SMALL_TOKENS:
        return HOT_MAX_COLD_L0_SMALL
    if density is not None and density >= HOT_DENSE_DENSITY:
        return HOT_MAX_COLD_L0_DENSE
    return HOT_MAX_COLD_L0


def check_max_cold_l0(max_cold_l0: float | None) -> None:
    """Raise ValueError unless ``max_cold_l0`` (a bound on the cold pairs per token) is None or finite and >= 0."""
    if max_cold_l0 is not None and not (math.isfinite(max_cold_l0) and max_cold_l0 >= 0):
        raise ValueError(f"max_cold_l0 must be None or a finite number >= 0, got {max_cold_l0}")


def choose_hot_units(
    frequency: torch.Tensor,
    *,
    min_frequency: float = HOT_MIN_FREQUENCY,
    multiple: int = HOT_MULTIPLE,
    max_cold_l0: float | None = HOT_MAX_COLD_L0,
) -> torch.Tensor:
    """Ids (int64, increasing) of the most frequent units: those with frequency >= ``min_frequency``, and
    more where needed so that the cold units' expected pairs per token (the sum of their frequencies) is at
    most ``max_cold_l0`` (None: no such bound).

    The threshold's count is rounded down to a multiple of ``multiple``, the bound's up (it is a bound; at
    most F rounded down); an empty tensor means "no hot units".  One host synchronisation
    (the count decides tensor sizes): call it when refreshing a plan, not per step.
    """
    check_tensor(frequency, "frequency", ndim=1)
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    check_max_cold_l0(max_cold_l0)
    n = int((frequency >= min_frequency).sum())
    n -= n % multiple
    order = torch.argsort(frequency, descending=True, stable=True)
    if max_cold_l0 is not None:
        ranked = frequency[order].double()
        # cold pairs per token left after making the k most frequent units hot, k = 0 .. F: suffix sums,
        # so that the units that never fire leave exactly 0 (a total minus a prefix sum leaves rounding)
        cold_after = torch.cat([ranked.flip(0).cumsum(0).flip(0), ranked.new_zeros(1)])
        n_bound = int((cold_after > max_cold_l0).sum())  # cold_after decreases: the first k within the bound
        f = frequency.shape[0]
        n = max(n, min(-(-n_bound // multiple) * multiple, f - f % multiple))
    return order[:n].sort().values


def hot_units_for_call(
    frequency: torch.Tensor,
    n_tokens: int,
    *,
    min_frequency: float = HOT_MIN_FREQUENCY,
    max_cold_l0: float | None | Callable[[int, float], float | None] = default_max_cold_l0,
) -> torch.Tensor:
    """:func:`choose_hot_units` for a call of ``n_tokens`` tokens whose sample fired at ``frequency`` (fp32 [F]): a
    callable ``max_cold_l0`` is first asked for the bound with the call's token count and the sample's density (its
    mean frequency, active units per token over F).  The one rule of ``SparseGatedMLP``'s cache and of
    ``twell bench ffn``."""
    bound = cold_l0_bound(max_cold_l0, n_tokens, float(frequency.mean()) if frequency.numel() else 0.0)
    return choose_hot_units(frequency, min_frequency=min_frequency, max_cold_l0=bound)


def cold_l0_bound(max_cold_l0: float | None | Callable[[int, float | None], float | None], n_tokens: int,
                  density: float | None) -> float | None:
    """The cold-pairs bound of a call of ``n_tokens`` tokens at ``density`` (active units per token over F; None: not
    known yet): ``max_cold_l0`` itself, or its answer where it is a rule of the two (as
    :func:`default_max_cold_l0`).  The bound is also a call's size class in ``SparseGatedMLP``'s hot sets
    (``twell.nn.hot_cold_cache``)."""
    return max_cold_l0(n_tokens, density) if callable(max_cold_l0) else max_cold_l0


def build_hot_cold_plan(
    w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, hot: torch.Tensor, *, fused_tile: int = 0
) -> HotColdPlan:
    """The plan for hot unit ids ``hot``; weights as ``nn.Linear`` stores them (Wg, Wu [F, d], Wd [d, F]).
    ``fused_tile``: 0, or a tile of FUSED_TILES whose fused gate layout ``w_gemm`` takes (see HotColdPlan)."""
    if fused_tile and fused_tile not in FUSED_TILES:
        raise ValueError(f"fused_tile must be 0 or one of {FUSED_TILES}, got {fused_tile}")
    check_tensor(hot, "hot", ndim=1, dtypes=(torch.int32, torch.int64))
    f, d = w_gate.shape
    if w_up.shape != (f, d) or w_down.shape != (d, f):
        raise ValueError(
            f"weights must be w_gate, w_up [F, d] and w_down [d, F]; got {tuple(w_gate.shape)}, "
            f"{tuple(w_up.shape)}, {tuple(w_down.shape)}"
        )
    hot = hot.to(device=w_gate.device, dtype=torch.int64)
    is_hot = torch.zeros(f, dtype=torch.bool, device=w_gate.device)
    if hot.numel():
        if int(hot.min()) < 0 or int(hot.max()) >= f:
            raise ValueError(f"hot unit ids must lie in [0, {f}), got range [{int(hot.min())}, {int(hot.max())}]")
        is_hot[hot] = True
        if int(is_hot.sum()) != hot.numel():
            raise ValueError("hot unit ids must be unique")
    hot = is_hot.nonzero().flatten()
    cold = (~is_hot).nonzero().flatten().to(torch.int32)
    with torch.no_grad():
        w_gemm, w_down_hot_t = plan_weight_copies(w_gate, w_up, w_down, hot, cold, fused_tile=fused_tile)
    return HotColdPlan(hot=hot, cold=cold, w_gemm=w_gemm, w_down_hot_t=w_down_hot_t, fused_tile=fused_tile)


def plan_weight_copies(
    w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, hot: torch.Tensor, cold: torch.Tensor, *,
    fused_tile: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_gemm, w_down_hot_t)`` of a :class:`HotColdPlan` for unit ids ``hot`` and ``cold`` (checked by
    the caller): rows ``Wg[hot]``, ``Wg[cold]``, ``Wu[hot]`` (or the fused layout for ``fused_tile``), and
    ``Wd[:, hot]^T``, both contiguous.  Also what ``SparseGatedMLP``'s compiled path builds in its graph
    from the current weights."""
    if fused_tile:
        w_gemm = fused_gate_weight(w_gate, w_up, hot, cold, fused_tile)
    else:
        w_gemm = torch.cat([w_gate.index_select(0, hot), w_gate.index_select(0, cold), w_up.index_select(0, hot)], 0)
    return w_gemm, w_down.index_select(1, hot).t().contiguous()


def fused_gate_weight(
    w_gate: torch.Tensor, w_up: torch.Tensor, hot: torch.Tensor, cold: torch.Tensor, tile: int
) -> torch.Tensor:
    """The weight of the fused hot/cold gate kernel (``twell.ops.hot_cold_gate_kernel``),
    [2 * tile * ceil(H / tile) + (F - H), d]: per tile of ``tile`` hot units their Wg and Wu rows
    interleaved (unit j's gate row at 2j, its up row at 2j + 1), zero rows padding the last hot tile,
    then ``Wg[cold]``.  ``hot`` / ``cold`` as in :class:`HotColdPlan`."""
    n_hot, d = hot.numel(), w_gate.shape[1]
    padded = -(-n_hot // tile) * tile
    pairs = torch.zeros((padded, 2, d), dtype=w_gate.dtype, device=w_gate.device)
    pairs[:n_hot, 0] = w_gate.index_select(0, hot)
    pairs[:n_hot, 1] = w_up.index_select(0, hot)
    return torch.cat([pairs.reshape(2 * padded, d), w_gate.index_select(0, cold)], 0)


def fused_gate_tile(tile: int, dtype: torch.dtype, hidden_size: int, device: torch.device | None = None) -> int:
    """The ``fused_tile`` a plan for this layer gets: ``tile`` when :data:`FUSED_GATE` is on and the fused
    kernel takes the layer (a tile of FUSED_TILES, bf16 or fp16, rows of a multiple of 16 bytes for its
    TMA loads, and on CUDA a device with TMA: compute capability >= 9.0), else 0."""
    from ._runtime import tma_capable

    ok = tile in FUSED_TILES and dtype in (torch.bfloat16, torch.float16) and hidden_size * 2 % 16 == 0
    ok = ok and (device is None or device.type != "cuda" or tma_capable(device))
    return tile if FUSED_GATE and ok else 0
