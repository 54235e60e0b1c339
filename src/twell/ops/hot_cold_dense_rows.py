"""The hot/cold op's dense rows: tokens with an overflowing cold tile computed by three dense GEMMs.

A cold tile of a row holds at most ``capacity`` non-zeros in the TwELL container; the row-gather kernel
recomputes a tile with more densely, one token at a time on CUDA cores (``twell_ffn_kernel``: per token and
overflowing tile, the tile's 128 Wg rows, 512 KB at d=2048), in one latency-bound program per row.  Such rows
are rare but not uniform: in the 1.5B forward's calibrated sparsity (``twell bench model``) the first positions
of each sequence fire hundreds of units in the first layers, and on the H200 layer 0 had 13,353 overflowing
tiles in 739 of its 131,072 tokens and took 10.504 ms sparse against 6.0-6.5 ms for the layers without any
(layer 1: 1,675 tiles in 213 tokens, 7.659 ms; bench_results/h200/forward_layer_times_session22.log).

With a budget of ``K`` rows the op instead (all on the device, no host synchronisation, so CUDA graphs and
torch.compile keep it):

1. picks the first ``K`` rows (in row order) that have an overflowing cold tile, from the gate's cold counts, and
   with :data:`HEAVY_ROW_PAIRS` the rows with many cold pairs in the slots left (:func:`select_overflow_rows`); the
   row kernel skips them (``skip_overflow_rows``);
2. computes those rows' whole FFN as the dense PyTorch FFN does in the input dtype (:func:`dense_rows_ffn`:
   ``relu(x Wg^T) * (x Wu^T)`` rounded, then ``@ Wd^T``), and writes them into the output.

Rows past the budget keep the row kernel's exact dense pass, so nothing is dropped; the budget only moves time.
Unused budget slots compute row 0 again and write the same dense result over it (a valid value for that row).

Measured (H200, session 22, the same forward): layer 0 10.889 -> 6.725 ms and layer 1 7.924 -> 6.814 ms with budgets
of 1152 and 384 rows (bench_results/h200/forward_layer_times_{no_,}dense_rows_session22.log); the 1.5B forward
1.326x -> 1.348x of dense.  The budget comes from ``twell.nn.hot_cold_cache``.

With :data:`FUSED_PASS` on, on CUDA (and under Triton's interpreter) the selection, the gated product and the
write-back run as Triton kernels (``twell.ops.dense_rows_kernels``): eight launches a pass instead of ~20, the same
bits; the PyTorch expressions below are their twins and run elsewhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._runtime import kernels_run_on
from .decode_batch_kernels import BATCH_MAX_TOKENS, launch_batch_ffn
from .dense_rows_kernels import gated_product, launch_select_overflow_rows, scatter_rows

#: The pass's selection, gated product and write-back as Triton kernels where they run (CUDA, the interpreter);
#: off: the PyTorch twins everywhere.  Built in session 47 (~20 launches a pass -> 8, bit-equal to the twins).
#: Session 48 (H100 80GB HBM3, the recorded 1.5B forward with cached weights and the tables policy, each variant in
#: its own process; bench_results/h100/recorded_forward_probe_{fused,unfused}_{4096,8192}_session48.json): GPU time of
#: a held call 27.11 -> 26.52 ms at 4096 tokens (23 passes; 0.991x -> 1.013x of recorded dense) and 45.63 -> 45.40 at
#: 8192 (16 passes; 1.123x -> 1.129x); the eager decoder layers' host time 39.66 -> 38.00 / 35.58 -> 32.39 ms.  The
#: four kernels take ~10 us a pass (223.7 us over 23 passes).  Predicted 0.5-0.8 / 0.3-0.6 ms: hit / just under.  Its
#: GPU tests passed (pytest_gpu_dense_rows_callfusedpass_session48.log).  On.
FUSED_PASS = True
#: With :data:`FUSED_PASS`, a pass of at most this many rows (a budget, unused slots included; at most the small-batch
#: kernels' ``BATCH_MAX_TOKENS`` = 64) runs through ``twell.ops.decode_batch_kernels`` instead of the three cuBLAS
#: GEMMs: the gate through cuBLAS, then Wu and Wd^T read only at the units that fire in some of the pass's rows (0:
#: never).  Why it was tried (session 53, H100): a 2048-token call's budget is 64 rows, a few long rows and row 0 again,
#: and the GEMMs read Wg, Wu and Wd whole for them (~69 MB at d=2048, F=5632); the steep-head layer's call (0.221 ms)
#: trailed the default head's (0.160 ms).  The same values up to the order of the down projection's fp32 sum.
#: Measured (H100 80GB HBM3, session 54, bench_results/h100/session54_runs.md): no faster.  The steep-head layer at 2048
#: tokens / l0 28: the pass 0.041 ms (cuBLAS gate 0.012, up kernel 0.013, down kernel 0.014, partial sum 0.002) against
#: the GEMMs' 0.038 (predicted 0.028-0.035: the rows' union of firing units is large, and at 64 rows these kernels move
#: their bytes no faster than cuBLAS); tune-dispatch held sparse 0.220 -> 0.222 ms at 0.5 %, 0.245 -> 0.251 at 1 %; the
#: recorded 1.5B forward at 2048 tokens 13.30 -> 13.34 ms.  Off.
BATCH_PASS_MAX_ROWS = 0
#: Rows of a call below :data:`HEAVY_ROWS_MAX_TOKENS` tokens with more than this many cold pairs (and no overflowing
#: tile) also go to the pass, after the overflowing rows, in the budget's slots those leave (0: none).  Why (session
#: 48): the recorded 1.5B forward at 2048 tokens ran 0.83x of dense on an H100 with the row kernel at 3.67 ms over 28
#: layers (4.21 at 4096 tokens: it barely shrinks with the call), while a layer's budget of 64 rows held only its 2-4
#: overflowing rows; the rows the row kernel kept there were one sequence's positions 2-10 with 188-321 cold pairs each
#: against 2.0-2.6 on the mean row (scripts/heavy_rows_stats.py on the CPU, bench_results/h100/heavy_rows_stats_2048
#: _session48.log): at 4 pairs a step (the row kernel's SB at d=2048) one program walked ~50-80 steps while the others
#: walked one.  The spare slots computed row 0 again, so taking these rows there costs no more GEMM rows.  64 pairs: 16
#: steps, against ~1 for the mean row; 7-15 rows a layer there (31 at most over 32 pairs, 49 over 16).  Measured (H100,
#: session 48, the recorded forward with cached weights, tables policy, at 2048 tokens;
#: bench_results/h100/recorded_forward_probe_{bound3,heavy64}_2048_session48.json, two calls on two machines of the same
#: card whose dense forward took 13.42 ms on both; the same call's run without it was cut by the session's device time):
#: the row kernel 3.67 -> 0.92 ms, the forward 16.06 -> 13.25 ms, 0.835x -> 1.014x of dense; predicted 1.0-1.5 ms and
#: 0.93-0.97x.  Session 49, same-call A/B (H100, one run each, bench_results/h100/recorded_forward_probe_heavy{64,0}_
#: {2048,4096,8192}_session49.json): 2048 tokens 16.11 -> 13.32 ms (row kernel 3.66 -> 0.93 ms; 0.832x -> 1.002x of
#: dense), 4096 26.39 -> 24.10 (4.22 -> 2.03 ms; 1.010x -> 1.113x; predicted 1.5-2.0 ms, 1.08-1.10x), 8192 45.42 both
#: (6.13 -> 6.04 ms: 51-196 rows a layer over 64 pairs left there, more than the budgets hold) until the budget counts
#: them (hot_cold_cache.DENSE_ROWS_COUNT_HEAVY, on since).  Session 50, 32 against 64 with counted budgets (H200, one
#: run each, bench_results/h200/session50_runs.md): 2048 tokens 12.92 -> 12.85 ms (row kernel 0.80 -> 0.70 ms, 1.019x
#: -> 1.023x; predicted ~0.3 ms off the kernel): under 64 pairs the longest row no longer sets the kernel's time.
#: Session 51 (H100 80GB HBM3, one run each, bench_results/h100/session51_runs.md): 2048 tokens 13.30 ms at 64 against
#: 13.73 at 128 (row kernel 0.92 -> 1.43 ms; 1.010x -> 0.985x of dense).  Calls from :data:`HEAVY_ROWS_LARGE_TOKENS`
#: tokens take :data:`HEAVY_ROW_PAIRS_LARGE` instead.  On.
HEAVY_ROW_PAIRS = 64
#: The bound of calls from :data:`HEAVY_ROWS_LARGE_TOKENS` tokens (below :data:`HEAVY_ROWS_MAX_TOKENS`).  Session 51
#: (H100 80GB HBM3, the recorded 1.5B forward at 8192 tokens with cached weights, the tables policy and counted budgets,
#: each bound in its own process, one run each; bench_results/h100/recorded_forward_probe_heavy{32,64,128}_count_8192
#: _session51.json): 43.44 / 43.33 / 42.82 ms at 32 / 64 / 128 against dense's 51.05-51.17 (1.178x / 1.178x /
#: 1.192x).  At 8192 tokens the counted budgets grow with a lower bound (128-256 rows a layer at 128, 192-384 at 64,
#: 384-640 at 32) and the pass's cuBLAS GEMMs with them (1.06 / 1.67 / 1.87 ms over 28 layers), while a row of 64-128
#: cold pairs costs the row kernel little in a call this long (2.72 / 2.86 / 3.02 ms): 128 is 0.51 ms ahead of 64, of
#: which the pass's GEMMs give 0.61.  At 2048 tokens 128 lost (above), so the larger bound starts at the measured 8192.
HEAVY_ROW_PAIRS_LARGE = 128
#: ... from this many tokens.
HEAVY_ROWS_LARGE_TOKENS = 8192
#: No heavy rows at or above this many tokens (the several-tiles rule's bound: larger calls give the heavy-first queue
#: a long kernel to hide a few long rows behind, and their heavy rows carry a large share of the gather's pairs).
HEAVY_ROWS_MAX_TOKENS = 16384


def heavy_row_pairs(n_tokens: int) -> int:
    """The heavy-row bound of a call of ``n_tokens`` (0: no heavy rows): :data:`HEAVY_ROW_PAIRS` below
    :data:`HEAVY_ROWS_LARGE_TOKENS` tokens, :data:`HEAVY_ROW_PAIRS_LARGE` from there to below
    :data:`HEAVY_ROWS_MAX_TOKENS` (all read at call time).  The op's selection and the cache's budget."""
    if n_tokens >= HEAVY_ROWS_MAX_TOKENS:
        return 0
    return HEAVY_ROW_PAIRS_LARGE if n_tokens >= HEAVY_ROWS_LARGE_TOKENS else HEAVY_ROW_PAIRS


def heavy_row_bounds() -> tuple[int, ...]:
    """The distinct positive bounds :func:`heavy_row_pairs` can return now, ascending (the hot/cold cache measures
    its sample's heavy rows under each, so that a call of any size finds its own)."""
    return tuple(sorted({k for k in (HEAVY_ROW_PAIRS, HEAVY_ROW_PAIRS_LARGE) if k > 0}))


def _check_selection(cold_counts: torch.Tensor, capacity: int, budget: int, heavy_pairs: int = 0) -> None:
    if not isinstance(cold_counts, torch.Tensor) or cold_counts.dim() != 2 or cold_counts.dtype != torch.int32:
        got = (f"{cold_counts.dtype} of shape {tuple(cold_counts.shape)}" if isinstance(cold_counts, torch.Tensor)
               else type(cold_counts).__name__)
        raise ValueError(f"cold_counts must be an int32 tensor [M, n_cold_tiles], got {got}")
    for name, v in (("capacity", capacity), ("budget", budget), ("heavy_pairs", heavy_pairs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")


def select_overflow_rows(cold_counts: torch.Tensor, capacity: int, budget: int,
                         heavy_pairs: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(skip int8 [M], rows int64 [budget])``: the first ``budget`` rows with a cold tile of more than
    ``capacity`` non-zeros (in row order), then, in the slots they leave, the rows without one whose cold pairs
    (the sum of their counts) exceed ``heavy_pairs`` (0: none; in row order), flagged in ``skip`` and listed in
    ``rows`` (unused slots hold 0).

    ``cold_counts``: int32 [M, n_cold_tiles], the cold part of the op's counts (any strides).  Deterministic: the
    Triton kernels (:data:`FUSED_PASS`) and :func:`select_overflow_rows_torch` give the same result.
    """
    _check_selection(cold_counts, capacity, budget, heavy_pairs)
    if FUSED_PASS and kernels_run_on(cold_counts.device):
        return launch_select_overflow_rows(cold_counts, capacity, budget, heavy_pairs)
    return select_overflow_rows_torch(cold_counts, capacity, budget, heavy_pairs)


def select_overflow_rows_torch(cold_counts: torch.Tensor, capacity: int, budget: int,
                               heavy_pairs: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`select_overflow_rows` in PyTorch ops: prefix sums, then a scatter whose only repeated target is a
    discarded slot."""
    m = cold_counts.shape[0]
    over = cold_counts.amax(1) > capacity
    rank = torch.cumsum(over, 0, dtype=torch.int64)  # inclusive: the k-th overflowing row has rank k
    flagged = over
    if heavy_pairs > 0:
        heavy = ~over & (cold_counts.sum(1, dtype=torch.int64) > heavy_pairs)
        # ranked after every overflowing row: over.sum() + the heavy row's own inclusive rank
        rank = torch.where(over, rank, over.sum(dtype=torch.int64) + torch.cumsum(heavy, 0, dtype=torch.int64))
        flagged = over | heavy
    take = flagged & (rank <= budget)
    slot = torch.where(take, rank - 1, budget)  # slot ``budget`` collects the rest and is dropped
    rows = torch.zeros(budget + 1, dtype=torch.int64, device=cold_counts.device)
    rows.scatter_(0, slot, torch.arange(m, dtype=torch.int64, device=cold_counts.device))
    return take.to(torch.int8), rows[:budget]


def dense_rows_ffn(x: torch.Tensor, rows: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                   w_down_t: torch.Tensor, out: torch.Tensor, *, residual: torch.Tensor | None = None) -> None:
    """``out[rows] = FFN(x[rows])``, the dense FFN's own ops in the input dtype (u, relu(g) and h rounded to it,
    fp32 accumulation in every GEMM, the output rounded once); ``w_down_t`` is Wd^T [F, d].  With ``residual``
    ([M, d]) ``out[rows] = residual[rows] + FFN(x[rows])``, the sum rounded again (the row kernel's bits).  With
    :data:`BATCH_PASS_MAX_ROWS` a short pass runs through the small-batch kernels: the same values up to the order of
    the down projection's fp32 sum."""
    xr = x.index_select(0, rows)
    fused = (FUSED_PASS and kernels_run_on(x.device) and out.stride(1) == 1
             and (residual is None or residual.stride(1) == 1))
    if fused and 0 < rows.shape[0] <= min(BATCH_PASS_MAX_ROWS, BATCH_MAX_TOKENS) and w_gate.shape[0] > 0:
        scatter_rows(launch_batch_ffn(xr, w_gate, w_up, w_down_t)[0], rows, out, residual)
        return
    g, u = F.linear(xr, w_gate), F.linear(xr, w_up)
    h = gated_product(g, u) if fused else F.relu(g) * u
    y = torch.mm(h, w_down_t)
    if fused:
        scatter_rows(y, rows, out, residual)
        return
    if residual is not None:
        y += residual.index_select(0, rows)
    out.index_copy_(0, rows, y)


def dense_row_budget(n_tokens: int, overflow_fraction: float, *, margin: float, slack: int, multiple: int,
                     min_expected: float = 0.0, severe_fraction: float = 0.0,
                     min_expected_severe: float = math.inf) -> int:
    """Rows to set aside for the dense pass in a call of ``n_tokens``: 0 where no overflowing row is expected, or
    where fewer than ``min_expected`` are and fewer than ``min_expected_severe`` of the rows that overflow several
    tiles (``severe_fraction`` of the rows, a subset of the overflowing ones) are; else ``margin`` times the expected
    overflowing rows plus ``slack``, rounded up to ``multiple`` and at most ``n_tokens``."""
    expected = n_tokens * overflow_fraction
    if overflow_fraction <= 0.0 or n_tokens <= 0:
        return 0
    if expected < min_expected and n_tokens * severe_fraction < min_expected_severe:
        return 0
    want = int(expected * margin) + slack
    return min(n_tokens, -(-want // multiple) * multiple)
