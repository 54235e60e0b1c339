"""How much of the cold gather's time can be a tail of heavy rows: a CPU model of its block schedule.

Why: the cold gather runs one program per token row, four resident programs per SM (132 SMs on an H200), and
the hardware hands out programs in index order as slots free up.  A row's cost grows with its cold pairs
(one step per SB = 4 pairs, plus fixed round trips), and the synthetic problem of ``twell bench ffn`` (like a
trained model) has heavy rows: the first positions of each sequence are ~4x denser and a shared per-token
latent makes whole tokens dense.  Rows late in the index order that are heavy finish after every other slot
has gone idle.  At M=131072 there are ~250 rows per slot and such a tail is a small share; at M=16384 only
~31.  Measured hints: the gather costs 14.8 ns a token at M=16384 against 11.9 at 131072 (0.242 / 1.562 ms,
clock_probe_session15.log), and LIST_MAX 32 -> 128 (heavy rows off the slower searched path) gained 8.7 % at
16384 against 3.6 % at 131072 (fused_gate_ab_list_max_session16.log).

This script draws the benchmark's problem (``bench.probe.split_problem``, seed 0), takes its hot set (the
most frequent units, as the probes do), counts each row's cold pairs and whether the gather's list path takes
the row, and schedules the rows on the slots in index order and heaviest first (longest-processing-time
order), under a cost model of ``fixed + per_step * ceil(pairs / SB)`` units, with the searched path's steps
``searched`` times dearer.  It prints each schedule's makespan against the lower bound max(total / slots,
heaviest row).  It is a model, not a measurement: what it can say is whether reordering the rows could move
the gather by more than the run-to-run spread, which a GPU probe then has to confirm.

Usage: ``PYTHONPATH=src python3 scripts/gather_schedule_sim.py [--m 16384 131072] [--l0 28 56]``.
"""

from __future__ import annotations

import argparse
import heapq

import torch

from twell.bench.probe import split_problem
from twell.ops.twell_list_kernel import LIST_MAX

#: an H200's SMs and the gather's resident programs per SM (128 registers, 4 warps: twell_ffn_kernel)
SLOTS = 132 * 4
#: pairs per step of the row kernel (twell_ffn_kernel's SB)
SB = 4
#: the hot units the probes take at each l0 (bench.probe.split_probe_setup)
HOT_UNITS = {28.0: 576, 56.0: 1344}
#: TwELL tile and capacity of the split at this shape
TILE, CAP = 128, 16


def cold_rows(m: int, l0: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pairs, listed)`` per row: the row's cold non-zeros, and whether the list path takes it (no cold tile
    over its capacity, at most LIST_MAX entries)."""
    p = split_problem(m, 2048, 5632, l0, torch.device("cpu"))
    cold = p.by_frequency[HOT_UNITS[l0]:].sort().values
    wg = p.w_gate.index_select(0, cold).float()
    pairs = torch.empty(m, dtype=torch.int64)
    listed = torch.empty(m, dtype=torch.bool)
    n_tiles = -(-cold.numel() // TILE)
    for lo in range(0, m, 4096):  # fp32 on the CPU, in chunks: which units fire, not the rounding, matters here
        fire = (p.x[lo:lo + 4096].float() @ wg.t()) > 0
        pairs[lo:lo + 4096] = fire.sum(1)
        padded = torch.nn.functional.pad(fire, (0, n_tiles * TILE - fire.shape[1]))
        per_tile = padded.view(fire.shape[0], n_tiles, TILE).sum(2)
        listed[lo:lo + 4096] = (per_tile.max(1).values <= CAP) & (pairs[lo:lo + 4096] <= LIST_MAX)
    return pairs, listed


def makespan(costs: list[float], slots: int) -> float:
    """List scheduling in the given order: each row goes to the slot that frees first."""
    free = [0.0] * slots
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[16384, 131072])
    ap.add_argument("--l0", type=float, nargs="+", default=[28.0, 56.0])
    ap.add_argument("--fixed", type=float, default=2.0, help="a row's cost before its steps (round trips)")
    ap.add_argument("--searched", type=float, default=2.0, help="cost of a searched-path step over a listed one")
    ap.add_argument("--heavy-min", type=int, default=32, help="pairs above which a row counts as heavy")
    a = ap.parse_args()
    for l0 in a.l0:
        for m in a.m:
            pairs, listed = cold_rows(m, l0)
            steps = (pairs + SB - 1) // SB
            cost = (a.fixed + steps.double() * torch.where(listed, 1.0, a.searched)).tolist()
            bound = max(sum(cost) / SLOTS, max(cost))
            in_order = makespan(cost, SLOTS)
            heavy_first = makespan(sorted(cost, reverse=True), SLOTS)
            # what a list pass can build without a sort: rows over --heavy-min pairs (and every searched row)
            # first, in index order, then the others in index order
            heavy = ((pairs > a.heavy_min) | ~listed).tolist()
            pairs_cost = list(zip(cost, heavy, strict=True))
            split = makespan([c for c, h in pairs_cost if h] + [c for c, h in pairs_cost if not h], SLOTS)
            q = torch.quantile(pairs.double(), torch.tensor([0.5, 0.99, 0.999], dtype=torch.float64)).tolist()
            print(f"M={m:6d} l0={l0:4.0f} | cold pairs a row: mean {pairs.double().mean():.1f}, median {q[0]:.0f}, "
                  f"p99 {q[1]:.0f}, p99.9 {q[2]:.0f}, max {int(pairs.max())}; searched rows {int((~listed).sum())} | "
                  f"makespan in index order {in_order / bound:.3f}x the bound, "
                  f"heaviest first {heavy_first / bound:.3f}x, "
                  f"rows over {a.heavy_min} pairs first {split / bound:.3f}x ({sum(heavy)} rows)",
                  flush=True)


if __name__ == "__main__":
    main()
