"""Session 22: does the synthetic FFN problem (twell bench ffn's) have rows with an overflowing cold tile in
the hot/cold refresh sample?  If not, the dense-row budget (twell.nn.hot_cold_cache.HotColdCache.dense_rows)
is 0 and the FFN sweep runs without the dense rows.  CPU, fp32, 2048 x 5632, a 16,384-token problem; tile
128, 16 slots.  Run: PYTHONPATH=src python bench_results/cpu_counts/session22_overflow_rows.py"""

import torch

from twell.nn.hot_cold_cache import HotColdCache
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

F = 5632
for dens in (0.25, 0.5, 1, 2, 5, 10):
    p = synthetic_ffn_problem(16384, 2048, F, SparsityProfile(mean_l0=dens / 100 * F),
                              generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    c = HotColdCache()
    c.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=128, capacity=16)
    print(f"density {dens:5.2f} %: hot units {c._hot.numel():4d}, overflow fraction of the sample "
          f"{c.overflow_fraction:.6f}, budget at 4096 / 16384 / 131072 tokens {c.dense_rows(4096)} / "
          f"{c.dense_rows(16384)} / {c.dense_rows(131072)}", flush=True)
