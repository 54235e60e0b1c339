"""Cold entries per row of the hot/cold split on the synthetic problem (session 16, CPU): how many rows, and how
many of the cold pairs, a per-row list of LIST_MAX entries leaves to the searched path, at d=2048, F=5632,
M=16384, the hot set chosen as SparseGatedMLP chooses it.  The count behind twell_list_kernel.LIST_MAX = 128.

    PYTHONPATH=src python bench_results/cpu_counts/session16_cold_list_lengths.py
"""
import torch

from twell.ops.hot_cold_plan import choose_hot_units
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

M, D, F, TILE, CAP = 16384, 2048, 5632, 128, 16
for l0 in (28.0, 56.0):
    p = synthetic_ffn_problem(M, D, F, SparsityProfile(mean_l0=l0), generator=torch.Generator().manual_seed(0),
                              device="cpu", dtype=torch.float32)
    act = (p["x"] @ p["w_gate"].T) > 0
    hot = choose_hot_units(act.float().mean(0))
    cold = torch.ones(F, dtype=torch.bool)
    cold[hot] = False
    ca = act[:, cold]
    n_tiles = -(-ca.shape[1] // TILE)
    padded = torch.zeros(M, n_tiles * TILE, dtype=torch.bool)
    padded[:, :ca.shape[1]] = ca
    per_tile = padded.view(M, n_tiles, TILE).sum(2)
    total = per_tile.sum(1)
    print(f"l0 {l0}: {hot.numel()} hot units, {total.float().mean():.2f} cold pairs per row, rows with a tile over "
          f"capacity {int((per_tile > CAP).any(1).sum())}")
    for list_max in (32, 48, 64, 96, 128):
        over = total > list_max
        print(f"  LIST_MAX {list_max:3d}: rows over it {int(over.sum())} of {M} ({float(over.float().mean()):.1%}), "
              f"holding {float(total[over].sum() / total.sum()):.1%} of the cold pairs")
