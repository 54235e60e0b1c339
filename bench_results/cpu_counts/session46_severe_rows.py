"""Session 46: does the synthetic FFN problem (twell bench ffn's, tune-dispatch's) hold rows that overflow two or more
cold tiles in the hot/cold refresh sample, so that the several-tiles dense-row rule
(twell.nn.hot_cold_cache.DENSE_ROWS_SEVERE_TILES) would change the tuned sweeps?  CPU, fp32, 2048 x 5632, the shipped
tile and capacity; the hot set chosen as for calls of 4096 and of 8192 tokens (the refresh sees that many tokens).
Run: PYTHONPATH=src python bench_results/cpu_counts/session46_severe_rows.py"""

import torch

from twell.nn.hot_cold_cache import HotColdCache
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

F = 5632
for dens in (0.25, 0.5, 1, 2, 5, 10):
    p = synthetic_ffn_problem(8192, 2048, F, SparsityProfile(mean_l0=dens / 100 * F),
                              generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    for n in (4096, 8192):
        c = HotColdCache()
        c.refresh(p["x"][:n], p["w_gate"], p["w_up"], p["w_down"])
        print(f"density {dens:5.2f} %, refresh on {n} tokens: hot units {c._hot.numel():4d}, overflowing rows "
              f"{c.overflow_fraction:.6f} of the sample, with >= 2 overflowing tiles {c.severe_overflow_fraction:.6f}; "
              f"budget at {n} tokens {c.dense_rows(n)}", flush=True)
