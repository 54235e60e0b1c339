"""Weight-row ids in the cold TwELL container: the pack's ``unit_map`` and the row-gather kernel's
``idx_is_unit`` (``twell.ops.hot_cold.COLD_UNIT_IDS``) against the column indices plus the map lookup.

Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_hot_cold import CASES, _plan, _run
from test_ops_kernels import make_problem

from twell.format.twell import live_slots
from twell.ops import hot_cold
from twell.ops.gate_kernel import launch_pack_twell
from twell.tolerances import REL_TOL, rel_error


def used_slots(container: tuple, capacity: int) -> torch.Tensor:
    """[M, tiles, capacity] bool: the slots a TwELL container's counts say are written."""
    return live_slots(container[2], capacity)


def test_pack_stores_the_mapped_ids(device):
    gen = torch.Generator().manual_seed(4)
    m, f, tile, cap = 37, 300, 64, 4
    g = torch.where(torch.rand((m, f), generator=gen) < 0.03, torch.rand((m, f), generator=gen) + 0.5,
                    -torch.rand((m, f), generator=gen)).to(torch.bfloat16).to(device)
    g[3, :9] = 1.0  # a row-tile over capacity
    unit_map = (torch.randperm(5000, generator=gen)[:f]).to(torch.int32).to(device)
    plain = launch_pack_twell(g, tile, cap)
    mapped = launch_pack_twell(g, tile, cap, unit_map=unit_map)
    used = used_slots(plain, cap).cpu()
    assert torch.equal(mapped[2], plain[2]) and torch.equal(mapped[0].cpu()[used], plain[0].cpu()[used])
    tiles = torch.arange(plain[2].shape[1])[None, :, None].expand_as(plain[1].cpu())
    columns = tiles * tile + plain[1].cpu().long()
    assert torch.equal(mapped[1].cpu()[used].long(), unit_map.cpu().long()[columns[used]])


def test_pack_refuses_a_bad_map(device):
    g = torch.randn(4, 64, device=device)
    with pytest.raises(ValueError, match="unit_map must be int32"):
        launch_pack_twell(g, 32, 4, unit_map=torch.arange(64, device=device))
    with pytest.raises(ValueError, match="unit_map must be int32"):
        launch_pack_twell(g, 32, 4, unit_map=torch.arange(60, dtype=torch.int32, device=device))


def _spy_idx_is_unit(monkeypatch) -> list[bool]:
    """The ``idx_is_unit`` flag of every row-gather launch the hot/cold op makes from now on."""
    flags: list[bool] = []
    original = hot_cold.launch_twell_ffn

    def spy(*args, **kwargs):
        flags.append(kwargs["idx_is_unit"])
        return original(*args, **kwargs)

    monkeypatch.setattr(hot_cold, "launch_twell_ffn", spy)
    return flags


@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-t{c[3]}-h{c[6]}" for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_hot_cold_op_gives_the_same_bits_with_unit_ids(case, dtype, device, monkeypatch):
    m, d, f, tile, cap, frac, n_hot = case
    p = make_problem(m, d, f, frac_pos=frac, seed=23 + n_hot, dtype=dtype, device=device)
    plan = _plan(p, n_hot)
    monkeypatch.setattr(hot_cold, "COLD_UNIT_IDS", False)
    want = _run(p, plan, "triton", tile=tile, capacity=cap, cold_format="twell")
    monkeypatch.setattr(hot_cold, "COLD_UNIT_IDS", True)
    flags = _spy_idx_is_unit(monkeypatch)
    got = _run(p, plan, "triton", tile=tile, capacity=cap, cold_format="twell")
    assert flags == ([True] if n_hot < f else [])  # the gather read unit ids (no cold column: no gather)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_wide_layers_keep_column_indices(device, monkeypatch):
    """Unit ids are stored as int16: from F = 2**15 units the cold pack keeps column indices and the
    gather its map lookup, whatever COLD_UNIT_IDS says."""
    m, d, f, tile, cap = 3, 16, 2**15 + 40, 256, 4
    p = make_problem(m, d, f, frac_pos=0.0, seed=5, dtype=torch.float32, device="cpu")
    firing = torch.tensor([5, 100, 20000, 32770, 32800])  # the first two hot, three cold ids beyond int16
    p["w_gate"][firing, 0] = torch.ceil((p["x"] @ p["w_gate"].T).abs().max()) * 2 + 0.5
    p = {k: v.to(device) for k, v in p.items()}
    plan = _plan(p, 2)
    monkeypatch.setattr(hot_cold, "COLD_UNIT_IDS", True)
    flags = _spy_idx_is_unit(monkeypatch)
    out, counts = _run(p, plan, "triton", tile=tile, capacity=cap, cold_format="twell")
    ref_out, ref_counts = _run(p, plan, "torch", tile=tile, capacity=cap)
    assert flags == [False]
    assert torch.equal(counts.cpu(), ref_counts.cpu())
    assert rel_error(out, ref_out) <= REL_TOL[torch.float32]
