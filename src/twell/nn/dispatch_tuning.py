"""A dispatch table from timed points: where the sparse layer beat the dense one, by how much, and how safely.

``twell tune-dispatch`` times :class:`~twell.nn.SparseGatedMLP` on the sparse path against the dense
module over token counts and densities on the user's GPU; :func:`derive_table` turns those points into the
rows ``(min_tokens, max_density)`` of a :class:`~twell.nn.DispatchPolicy`.  The rules, all conservative:

* a point counts as a win only if its output was correct and sparse was at least ``min_speedup`` times
  faster than dense (default 1.05: the margin covers timing noise and the token counts between the
  measured ones, and switching for less is not worth a model's risk);
* at each measured token count the sparse path is allowed up to the highest measured density below
  which *every* measured density won (one loss ends the run: no islands of sparse above a dense point);
* a row applies from its token count up to the next measured one (the table's semantics), so a call
  between two measured counts gets the lower count's answer; sparse speedups grow with the token count
  in every sweep of large calls so far (bench_results/h200/ffn_sweep_session8.json: 1.53x at 16384 and
  1.63x at 131072 tokens, 0.5 %), which makes the lower answer the safe one there;
* except where the next measured count *lost* at a density the lower count's row allows: then the calls
  between the two get the larger count's limit, from one token past the lower count.  Below a few hundred
  tokens the speedup can fall with the token count (2048 x 5632: one token won at every target density to
  10 %, 16 tokens at none, bench_results/h200/dispatch_2048x5632_session30_tiny{,_b}.json), and the calls
  between were never timed: the only 2-token calls that ran on that one-token row, in session 33's
  decode (policy ``decode-1`` at batch 2, model_decode_batch_call4_session33.log), ran 0.799x of dense.  Where
  the larger count won everything the lower one allows, the lower count's answer stands;
* a token count where nothing won after one where something did gets a row of density 0, which turns
  the sparse path off there (only an all-zero activation, whose sparse path is trivially exact and
  fast, still takes it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .dispatch import DispatchTable, dense_ffn_flops

__all__ = ["DEFAULT_MIN_SPEEDUP", "TuningPoint", "derive_decode_table", "derive_eager_floor", "derive_eager_min_flops",
           "derive_table"]

#: Sparse must be at least this many times faster than dense at a point to count as a win.
DEFAULT_MIN_SPEEDUP = 1.05


@dataclass(frozen=True)
class TuningPoint:
    """One timed point: ``tokens`` per call, activation ``density`` (l0 / F as measured), the two
    modules' median ms per call, and whether the sparse output matched the reference."""

    tokens: int
    density: float
    dense_ms: float
    sparse_ms: float
    ok: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 1:
            raise ValueError(f"tokens must be an int >= 1, got {self.tokens!r}")
        if not isinstance(self.density, (int, float)) or not 0.0 <= self.density <= 1.0:
            raise ValueError(f"density must lie in [0, 1] (l0 / intermediate_size), got {self.density!r}")
        for name in ("dense_ms", "sparse_ms"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite time > 0 ms, got {v!r}")
        if not isinstance(self.ok, bool):
            raise TypeError(f"ok must be a bool, got {type(self.ok).__name__}")

    @property
    def speedup(self) -> float:
        return self.dense_ms / self.sparse_ms


def _limit_at(points: list[TuningPoint], min_speedup: float) -> tuple[float | None, float | None]:
    """The highest density up to which every point (sorted by density) won, or None if the lowest lost; and the
    density of the first point that did not win, or None if every point won."""
    limit = None
    for p in points:
        if not (p.ok and p.speedup >= min_speedup):
            return limit, p.density
        limit = p.density
    return limit, None


def _limits_by_tokens(points: Iterable[TuningPoint],
                      min_speedup: float) -> dict[int, tuple[float | None, float | None]]:
    """Each measured token count's limit and first losing density (:func:`_limit_at`), checked arguments."""
    if isinstance(min_speedup, bool) or not isinstance(min_speedup, (int, float)) or not min_speedup >= 1.0:
        raise ValueError(f"min_speedup must be a number >= 1 (sparse never chosen where it is slower), "
                         f"got {min_speedup!r}")
    pts = list(points)
    if not pts:
        raise ValueError("no points to derive a dispatch table from")
    for p in pts:
        if not isinstance(p, TuningPoint):
            raise TypeError(f"points must be TuningPoint, got {type(p).__name__}")
    by_tokens: dict[int, list[TuningPoint]] = {}
    for p in pts:
        by_tokens.setdefault(p.tokens, []).append(p)
    # by density; at equal densities (repeated runs) a loss first, so that the worse run decides
    return {tokens: _limit_at(sorted(group, key=lambda p: (p.density, p.ok and p.speedup >= min_speedup)),
                              min_speedup)
            for tokens, group in sorted(by_tokens.items())}


def derive_table(points: Iterable[TuningPoint], *, min_speedup: float = DEFAULT_MIN_SPEEDUP) -> DispatchTable:
    """Rows ``(min_tokens, max_density)`` for a :class:`~twell.nn.DispatchPolicy` from timed points (see the
    module docstring for the rules).  An empty table (dense everywhere) when sparse never won."""
    rows: list[tuple[int, float]] = []

    def add(tokens: int, limit: float) -> None:
        if rows and rows[-1][1] == limit:
            return
        if rows or limit > 0.0:  # dense below a first row is what no row says
            rows.append((tokens, limit))

    counts = list(_limits_by_tokens(points, min_speedup).items())
    for i, (tokens, (limit, _)) in enumerate(counts):
        value = 0.0 if limit is None else float(limit)
        add(tokens, value)
        if i + 1 < len(counts) and counts[i + 1][0] > tokens + 1:
            next_limit, next_loss = counts[i + 1][1]
            if next_loss is not None and next_loss <= value:  # the larger count lost inside this row
                add(tokens + 1, 0.0 if next_limit is None else float(next_limit))
    return tuple(rows)


def derive_decode_table(points: Iterable[TuningPoint], *, min_speedup: float = DEFAULT_MIN_SPEEDUP,
                        max_tokens: int | None = None) -> DispatchTable:
    """A decode table (``DispatchPolicy.decode_tables``) from timed points of the small-batch kernels.

    The per-count limits follow :func:`derive_table`'s rules, but a call between two measured token counts takes
    the *larger* count's limit: the small-batch kernels' speedup falls as the token count grows (the tokens' union
    of firing units grows; ``twell tune-decode`` on the H200, session 34: 2048 x 5632 at 1 % density 2.04x at one
    token, 1.24x at 8, 1.07x at 64), the opposite of the large calls ``derive_table`` serves.  So the rows start one
    past each measured count, and calls above the largest measured one (up to ``max_tokens``, when given) get a
    row of density 0: dense."""
    limits = _limits_by_tokens(points, min_speedup)
    rows: list[tuple[int, float]] = []
    start = 1
    for tokens, (limit, _) in limits.items():
        value = 0.0 if limit is None else float(limit)
        if not rows or rows[-1][1] != value:
            rows.append((start, value))
        start = tokens + 1
    if max_tokens is not None and start <= max_tokens and rows[-1][1] != 0.0:
        rows.append((start, 0.0))
    while rows and rows[0][1] == 0.0:  # dense below a first row is what no row says
        rows.pop(0)
    return tuple(rows)


def derive_eager_floor(outcomes: Iterable[tuple[int, bool]]) -> int:
    """A ``DispatchPolicy.eager_min_tokens`` from eager calls timed by the wall clock: ``outcomes`` are
    ``(tokens, lost)`` pairs, one per measured point (several per token count: the count loses if any of its points
    did); ``lost`` says that an eager call the table sends sparse ran slower than the bar against dense, and a point
    the table leaves dense is ``(tokens, False)``.

    The floor is the next measured count above the largest losing one, so the counts between a loss and the next
    measured win, never timed, run dense (the safe answer: a host-bound call's speedup grows with its tokens as the
    GPU work grows while the host's issuing stays the same); one past the largest loss when no larger count was
    measured; 0 (no floor) when nothing lost.  Raises ValueError for a token count below 1 and TypeError for a
    ``lost`` that is not a bool."""
    losing: set[int] = set()
    counts: set[int] = set()
    for tokens, lost in outcomes:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens must be an int >= 1, got {tokens!r}")
        if not isinstance(lost, bool):
            raise TypeError(f"lost must be a bool, got {type(lost).__name__}")
        counts.add(tokens)
        if lost:
            losing.add(tokens)
    if not losing:
        return 0
    last = max(losing)
    above = [t for t in counts if t > last]
    return min(above) if above else last + 1


def derive_eager_min_flops(outcomes: Iterable[tuple[int, int, int, bool]]) -> float:
    """A ``DispatchPolicy.eager_min_flops`` from eager calls of several layer shapes timed by the wall clock:
    ``outcomes`` are ``(hidden_size, intermediate_size, tokens, lost)``, one per measured point, ``lost`` as in
    :func:`derive_eager_floor`.  Each point's work is its dense FFN's floating-point operations, ``6 * tokens *
    hidden_size * intermediate_size``; the floor is the next measured work above the largest losing one (one past it
    when none is larger; 0 when nothing lost), :func:`derive_eager_floor` over work instead of tokens: a host-bound
    call's speedup grows with the GPU work it carries, whatever the shape that carries it."""
    def work_of(o: tuple[int, int, int, bool]) -> tuple[int, bool]:
        h, f, tokens, lost = o
        for name, v in (("hidden_size", h), ("intermediate_size", f), ("tokens", tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        return dense_ffn_flops(tokens, (h, f)), lost

    return float(derive_eager_floor(work_of(o) for o in outcomes))
