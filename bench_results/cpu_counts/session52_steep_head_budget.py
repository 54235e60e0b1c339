"""Session 52: what the hot/cold refresh chooses for tune-dispatch's 2048- and 4096-token calls of the synthetic
2048 x 5632 layer with the benchmark model's steep sequence head (--early-boost 40 --early-decay 4) against the default
head (4 / 32), which the H100 ran at 0.70x / 1.40x of dense at 2048 tokens / 0.5 % held sparse
(bench_results/h100/session52_runs.md, call 3).  CPU, bf16, the shipped tile (128) and capacity (16); the problem of
tune-dispatch (8192 tokens, the call's tokens the first whole sequences), drawn with a CPU generator, so its rows are
not the GPU run's: statistics, not the same tokens.  Per call: the hot set, the sample's overflowing / several-tiles /
heavy rows (by the shipped bounds), the dense-row budget, and the five rows with the most cold pairs (their pairs and
overflowing tiles).
Run: PYTHONPATH=src python bench_results/cpu_counts/session52_steep_head_budget.py"""

import torch

from twell.bench.ffn import _rows_for
from twell.nn.hot_cold_cache import HotColdCache
from twell.ops.hot_cold_plan import _cold_tile_counts, sample_active
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

D, F, TILE, CAP = 2048, 5632, 128, 16
for boost, decay in ((40.0, 4.0), (4.0, 32.0)):
    for dens in (0.25, 0.5, 1.0):
        gen = torch.Generator().manual_seed(0)
        profile = SparsityProfile(mean_l0=dens / 100 * F, early_boost=boost, early_decay=decay)
        p = synthetic_ffn_problem(8192, D, F, profile, generator=gen, dtype=torch.bfloat16)
        for m in (2048, 4096):
            x = _rows_for(p["x"], m, profile.seq_len, gen)
            cache = HotColdCache()
            cache.refresh(x, p["w_gate"], p["w_up"], p["w_down"], tile=TILE, capacity=CAP)
            per_tile = _cold_tile_counts(sample_active(x, p["w_gate"]), cache._hot, TILE)
            pairs, over = per_tile.sum(1), (per_tile > CAP).sum(1)
            top = torch.argsort(pairs, descending=True, stable=True)[:5]
            heavy = {k: round(v * m, 1) for k, v in cache.heavy_row_fractions.items()}
            several = cache.severe_overflow_fraction * m
            print(f"head {boost:g}/{decay:g} density {dens:4.2f} % tokens {m}: hot units {cache.n_hot}, rows with an "
                  f"overflowing tile {cache.overflow_fraction * m:.1f}, with several {several:.1f}, "
                  f"heavy rows by bound {heavy}, budget {cache.dense_rows(m)}; top rows (position, cold pairs, "
                  f"overflowing tiles) {[(int(i), int(pairs[i]), int(over[i])) for i in top]}", flush=True)
