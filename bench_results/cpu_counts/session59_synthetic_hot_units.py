"""Session 59: hot units of the synthetic 2048x5632 layer (twell.synthetic.unit_frequencies, l0 29, seed 0) under each
cold-pairs bound of hot_cold_plan.default_max_cold_l0 (3 under 8192 tokens, 6 / 10 to 131,071, 13 from there), and the
plan's bytes in bf16 for each set (hot_cold_cache.MAX_HOT_SETS's cost).

    PYTHONPATH=src python3 bench_results/cpu_counts/session59_synthetic_hot_units.py
"""

import torch

from twell.ops.hot_cold_plan import build_hot_cold_plan, choose_hot_units
from twell.synthetic import SparsityProfile, unit_frequencies

d, f = 2048, 5632
freq = unit_frequencies(f, SparsityProfile(mean_l0=29.0), generator=torch.Generator().manual_seed(0)).float()
gen = torch.Generator().manual_seed(1)
wg, wu = (torch.randn(f, d, generator=gen).bfloat16() for _ in range(2))
wd = torch.randn(d, f, generator=gen).bfloat16()
for bound in (3.0, 6.0, 10.0, 13.0):
    hot = choose_hot_units(freq, max_cold_l0=bound)
    plan = build_hot_cold_plan(wg, wu, wd, hot)
    size = sum(t.numel() * t.element_size() for t in (plan.hot, plan.cold, plan.w_gemm, plan.w_down_hot_t))
    print(f"bound {bound:4.1f}: {hot.numel():4d} hot units, plan {size / 1e6:.1f} MB")
