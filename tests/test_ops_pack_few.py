"""The pack kernel's fast path for row-tiles with at most two non-zeros against its general epilogue.

Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU.  The dense pre-activations are
negative except for the positives placed per row-tile, so each program's tile takes a known path: the
fast one where no row has more than two, the general one where some row has three or more.
"""

from __future__ import annotations

import os

import pytest
import torch

from twell.ops.gate_kernel import launch_pack_twell


def _g(m: int, f: int, tile: int, per_tile: list[int], seed: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[m, f] negative values with ``per_tile[(row + tile_index) % len(per_tile)]`` positives per row-tile
    (at random columns)."""
    gen = torch.Generator().manual_seed(seed)
    g = -torch.rand((m, f), generator=gen) - 0.1
    n_tiles = -(-f // tile)
    for r in range(m):
        for t in range(n_tiles):
            width = min(tile, f - t * tile)
            k = min(per_tile[(r + t) % len(per_tile)], width)
            cols = torch.randperm(width, generator=gen)[:k] + t * tile
            g[r, cols] = torch.rand(k, generator=gen) + 0.5
    return g.to(dtype).to(device)


def used_slots(container: tuple, capacity: int) -> torch.Tensor:
    """[M, tiles, capacity] bool: the slots a TwELL container's counts say are written."""
    counts = container[2]
    return torch.arange(capacity, device=counts.device)[None, None, :] < counts.clamp(max=capacity)[:, :, None]


def _assert_same_slots(fast, general, capacity):
    vf, if_, cf = fast
    vg, ig, cg = general
    assert torch.equal(cf, cg)
    used = used_slots(general, capacity)
    assert torch.equal(if_[used], ig[used])
    assert torch.equal(torch.isnan(vf[used]), torch.isnan(vg[used]))
    assert torch.equal(torch.nan_to_num(vf[used]), torch.nan_to_num(vg[used]))


CASES = [
    # m, f, tile, capacity, positives per row-tile (cycled over rows and tiles)
    (37, 300, 128, 16, [0, 1, 2, 0, 1]),  # every tile on the fast path; partial last tile, partial last block
    (40, 256, 128, 16, [0, 3, 1]),  # rows with three: those programs take the general path
    (16, 128, 128, 16, [0]),  # nothing fires
    (20, 300, 64, 2, [2, 1, 0]),  # capacity 2: the fast path fills it exactly
    (20, 300, 64, 1, [2, 1, 0]),  # capacity 1: no fast path (it writes two slots); overflow at 2
    (18, 256, 128, 4, [9, 0]),  # overflowing rows on the general path
]


@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-f{c[1]}-t{c[2]}-c{c[3]}-{c[4]}" for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fast_path_writes_what_the_general_epilogue_writes(case, dtype, device):
    m, f, tile, cap, per_tile = case
    g = _g(m, f, tile, per_tile, seed=m * f + cap, dtype=dtype, device=device)
    fast = launch_pack_twell(g, tile, cap, few=True)
    general = launch_pack_twell(g, tile, cap, few=False)
    _assert_same_slots(fast, general, cap)
    want_counts = (torch.relu(g.float()) != 0).reshape(m, -1).float()
    assert int(fast[2].sum()) == int(want_counts.sum())


def test_nan_and_inf_pass_through_the_fast_path(device):
    g = _g(16, 128, 128, [1, 2], seed=5, dtype=torch.float32, device="cpu")
    pos = (g > 0).nonzero()
    g[pos[0, 0], pos[0, 1]] = float("nan")
    g[pos[1, 0], pos[1, 1]] = float("inf")
    g = g.to(device)
    fast = launch_pack_twell(g, 128, 16, few=True)
    _assert_same_slots(fast, launch_pack_twell(g, 128, 16, few=False), 16)
    assert bool(torch.isnan(fast[0][pos[0, 0], 0, :2]).any())
    assert bool(torch.isinf(fast[0][pos[1, 0], 0, :2]).any())


def test_strided_rows_of_a_wider_matrix(device):
    """The hot/cold split packs a column slice of the GEMM output: rows with a stride > F."""
    full = _g(24, 384, 128, [1, 0, 2], seed=8, dtype=torch.bfloat16, device=device)
    cold = full[:, 128:]
    _assert_same_slots(launch_pack_twell(cold, 128, 16, few=True), launch_pack_twell(cold, 128, 16, few=False), 16)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts interpreted calls of a jit helper")
def test_which_programs_take_the_fast_path(monkeypatch):
    """One program per 16 rows x 128 columns: the fast path exactly where no row of the tile has three."""
    import twell.ops.gate_kernel as gk

    calls = []
    original = gk._twell_store_few

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(gk, "_twell_store_few", spy)
    g = _g(32, 256, 128, [1], seed=2, dtype=torch.float32, device="cpu")
    g[20, 128:131] = 1.0  # three in row 20's second tile: program (1, 1) takes the general path
    launch_pack_twell(g, 128, 16, few=True)
    assert len(calls) == 3  # of the 2 x 2 programs
    calls.clear()
    launch_pack_twell(g, 128, 16, few=False)
    assert calls == []
