"""The per-row entry lists of ``twell.ops.twell_list_kernel`` against a pure-PyTorch twin, and the row-gather
kernel over them (``launch_twell_ffn(listed=True)``): same bits as the searched path with rows of every kind
(listed, empty, overflowing, over ``LIST_MAX``), and clear errors where a container cannot be listed.

Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_kernels import make_problem

from twell.ops import twell_list_kernel
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.ops.twell_list_kernel import launch_list_twell_rows, list_eligible


def reference_lists(values: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor, *, tile: int,
                    unit_map: torch.Tensor | None, idx_is_unit: bool, list_max: int) -> tuple[list, list]:
    """Per row: None where the row is not listed (a tile over capacity, or more than ``list_max`` entries),
    else its [(value bits, weight row)] in tile order then slot order; and the expected ``lst_n``."""
    cap = values.shape[2]
    bits = (values.cpu().view(torch.int16).int() & 0xFFFF).tolist()
    indices, all_counts = indices.cpu().tolist(), counts.cpu().tolist()
    unit_map = unit_map.cpu().tolist() if unit_map is not None else None
    rows, ns = [], []
    for r in range(len(all_counts)):
        c = all_counts[r]
        total = sum(n for n in c if n <= cap)
        if any(n > cap for n in c) or total > list_max:
            rows.append(None)
            ns.append(-1)
            continue
        entries = []
        for t, n in enumerate(c):
            for s in range(n):
                unit = indices[r][t][s]
                if not idx_is_unit:
                    unit += t * tile
                    if unit_map is not None:
                        unit = unit_map[unit]
                entries.append((bits[r][t][s], unit))
        rows.append(entries)
        ns.append(total)
    return rows, ns


def _gates(m: int, f: int, *, seed: int, device) -> torch.Tensor:
    """bf16 gate activations with empty rows, an overflowing row-tile and a row of many entries."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.where(torch.rand((m, f), generator=gen) < 0.04, torch.rand((m, f), generator=gen) + 0.25,
                    -torch.rand((m, f), generator=gen))
    g[0] = -1.0  # empty row
    g[1, :9] = 2.0  # 9 non-zeros in the first tile: over a capacity of 4
    g[2, ::7] = 1.5  # many entries, no tile over capacity 4 at tile 32 (5 per tile)
    g[3, 5] = float("nan")  # NaN gate values are kept (relu_keep_nan) and must travel through the list
    return g.to(torch.bfloat16).to(device)


@pytest.mark.parametrize("mode", ["columns", "columns+map", "unit-ids"])
@pytest.mark.parametrize("list_max", [4, 32])
def test_lists_match_the_reference(mode, list_max, device):
    m, f, tile, cap = 19, 160, 32, 4
    g = _gates(m, f, seed=3, device=device)
    gen = torch.Generator().manual_seed(8)
    unit_map = torch.randperm(30000, generator=gen)[:f].to(torch.int32).to(device) if mode != "columns" else None
    idx_is_unit = mode == "unit-ids"
    v, i, c = launch_pack_twell(g, tile, cap, unit_map=unit_map if idx_is_unit else None)
    lst, lst_n = launch_list_twell_rows(v, i, c, tile=tile, unit_map=unit_map, idx_is_unit=idx_is_unit,
                                        list_max=list_max)
    want_rows, want_n = reference_lists(v, i, c, tile=tile, unit_map=unit_map, idx_is_unit=idx_is_unit,
                                        list_max=list_max)
    assert lst.shape == (m, list_max) and lst.dtype == torch.int32
    assert lst_n.cpu().tolist() == want_n
    assert -1 in want_n and 0 in want_n and any(n > 0 for n in want_n)  # every kind of row is in the problem
    got = lst.cpu()
    for r, entries in enumerate(want_rows):
        if entries is None:
            continue
        packed = [(int(p) >> 16 & 0xFFFF, int(p) & 0xFFFF) for p in got[r, : len(entries)]]
        assert packed == entries, f"row {r}"


def _gather(p: dict, container: tuple, *, tile: int, listed: bool, unit_map=None, idx_is_unit=False,
            init=None, gated: bool = True) -> torch.Tensor:
    m, d = p["x"].shape
    out = torch.empty(m, d, dtype=p["x"].dtype, device=p["x"].device)
    f = p["w_gate"].shape[0]
    return launch_twell_ffn(p["x"], *container, None, None, p["w_gate"], p["w_up"] if gated else None,
                            p["w_down"].t().contiguous(), n_cols=f, tile=tile, round_hidden=True, out=out,
                            unit_map=unit_map, init=init, idx_is_unit=idx_is_unit, listed=listed)


@pytest.mark.parametrize("list_max", [4, 32])
@pytest.mark.parametrize("gated", [True, False], ids=["gated", "relu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_listed_gather_same_bits_as_searched(dtype, gated, list_max, device, monkeypatch):
    """Listed rows, rows over LIST_MAX (4: most rows here) and rows with an overflowing tile in one launch."""
    m, d, f, tile, cap = 23, 32, 192, 32, 4
    p = make_problem(m, d, f, frac_pos=0.025, seed=12, dtype=dtype, device=device)
    p["x"][5] = 0.0  # an empty row
    g = p["x"] @ p["w_gate"].T
    g[7, :10] = 1.0  # an overflowing row-tile (recomputed from Wg: no spill area)
    container = launch_pack_twell(g, tile, cap)
    monkeypatch.setattr(twell_list_kernel, "LIST_MAX", list_max)
    lst_n = launch_list_twell_rows(*container, tile=tile, unit_map=None, idx_is_unit=False)[1].cpu()
    assert int(lst_n[7]) == -1 and int(lst_n[5]) == 0 and bool((lst_n > 0).any())
    if list_max == 4:
        assert bool((lst_n == -1).sum() > 1)  # rows over LIST_MAX take the searched path as well
    searched = _gather(p, container, tile=tile, listed=False, gated=gated)
    listed = _gather(p, container, tile=tile, listed=True, gated=gated)
    assert torch.equal(listed, searched)
    assert torch.count_nonzero(listed[5]) == 0


@pytest.mark.parametrize("idx_is_unit", [False, True], ids=["columns+map", "unit-ids"])
def test_listed_gather_with_unit_map_and_init(idx_is_unit, device):
    """As the hot/cold split runs it: a unit map into a larger weight, fp32 init rows."""
    m, d, f, tile, cap = 17, 32, 256, 32, 4
    p = make_problem(m, d, f, frac_pos=0.05, seed=21, dtype=torch.bfloat16, device=device)
    n_cold = 160
    unit_map = torch.randperm(f, generator=torch.Generator().manual_seed(2))[:n_cold].sort().values
    unit_map = unit_map.to(torch.int32).to(device)
    g = p["x"] @ p["w_gate"][unit_map.long()].T
    container = launch_pack_twell(g, tile, cap, unit_map=unit_map if idx_is_unit else None)
    init = torch.randn(m, d, generator=torch.Generator().manual_seed(6)).to(device)

    def run(listed: bool) -> torch.Tensor:
        out = torch.empty(m, d, dtype=p["x"].dtype, device=device)
        return launch_twell_ffn(p["x"], *container, None, None, p["w_gate"], p["w_up"],
                                p["w_down"].t().contiguous(), n_cols=n_cold, tile=tile, round_hidden=True, out=out,
                                unit_map=unit_map, init=init, idx_is_unit=idx_is_unit, listed=listed)

    assert torch.equal(run(True), run(False))


def test_list_refusals(device):
    """A container the list cannot hold, or a path it cannot join, is refused with the reason."""
    m, d, f, tile, cap = 5, 32, 64, 32, 4
    p = make_problem(m, d, f, frac_pos=0.1, seed=4, dtype=torch.float32, device=device)
    container = launch_pack_twell(p["x"] @ p["w_gate"].T, tile, cap)
    assert "16-bit gate values" in list_eligible(container[0], f)
    assert "16-bit weight-row ids" in list_eligible(container[0].to(torch.bfloat16), 70000)
    assert list_eligible(container[0].to(torch.bfloat16), 65536) is None
    with pytest.raises(ValueError, match="listed=True but the list packs 16-bit gate values"):
        _gather(p, container, tile=tile, listed=True)
    q = {k: v.to(torch.bfloat16) for k, v in p.items()}
    c16 = (container[0].to(torch.bfloat16), container[1], container[2])
    with pytest.raises(ValueError, match="excludes the preload"):
        out = torch.empty(m, d, dtype=torch.bfloat16, device=device)
        launch_twell_ffn(q["x"], *c16, None, None, q["w_gate"], q["w_up"], q["w_down"].t().contiguous(), n_cols=f,
                         tile=tile, round_hidden=True, out=out, preload=True, listed=True)
    with pytest.raises(ValueError, match="fewer than a step's 4"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(twell_list_kernel, "LIST_MAX", 2)
            out = torch.empty(m, d, dtype=torch.bfloat16, device=device)
            launch_twell_ffn(q["x"], *c16, None, None, q["w_gate"], q["w_up"], q["w_down"].t().contiguous(),
                             n_cols=f, tile=tile, round_hidden=True, out=out, sb=4, listed=True)
    with pytest.raises(ValueError, match="list_max must be >= 1"):
        launch_list_twell_rows(*c16, tile=tile, unit_map=None, idx_is_unit=False, list_max=0)
    # the default (listed=None) takes the searched path where the list cannot be used, with the same result
    assert torch.equal(_gather(p, container, tile=tile, listed=None), _gather(p, container, tile=tile, listed=False))


@pytest.mark.gpu
def test_gpu_lists_of_the_split_cold_container():
    """d=2048, F=5632, 4096 synthetic tokens at ~0.5 % density, the cold container as the fused hot/cold gate
    writes it (unit ids): every row's count and every listed row's entries as the reference has them, and most
    rows listed (97.7 % at 16384 tokens on the H200, bench_results/h200/cold_pack_gather_probe_session14_*.log)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from twell import ops
    from twell.ops.hot_cold import launch_hot_cold_ffn
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    dev = torch.device("cuda")
    q = synthetic_ffn_problem(4096, 2048, 5632, SparsityProfile(mean_l0=28.0),
                              generator=torch.Generator(device=dev).manual_seed(0), device=dev)
    plan = ops.build_hot_cold_plan(q["w_gate"], q["w_up"], q["w_down"],
                                   ops.choose_hot_units(ops.unit_frequency(q["x"], q["w_gate"])), fused_tile=128)
    seen = []
    original = launch_list_twell_rows

    def spy(*args, **kwargs):
        lists = original(*args, **kwargs)
        seen.append((args, kwargs, lists))
        return lists

    import twell.ops.hot_cold as hot_cold_module
    import twell.ops.twell_ffn_kernel as row_kernel

    with pytest.MonkeyPatch.context() as mp:
        # the gather lists the rows, or the op does beside its fused gate (hot_cold.LIST_BESIDE_GATE, on)
        mp.setattr(row_kernel, "launch_list_twell_rows", spy)
        mp.setattr(hot_cold_module, "launch_list_twell_rows", spy)
        mp.setattr(row_kernel, "GATHER_LISTED", True)
        mp.setattr(row_kernel, "GATHER_HEAVY_FIRST", False)  # unmarked lists (marks: test_ops_gather_heavy_first)
        launch_hot_cold_ffn(q["x"], plan, q["w_gate"], q["w_up"], q["w_down"].t().contiguous(), tile=128, capacity=16)
    assert len(seen) == 1
    (v, i, c), kwargs, (lst, lst_n) = seen[0]
    want_rows, want_n = reference_lists(v, i, c, tile=kwargs["tile"], unit_map=kwargs["unit_map"],
                                        idx_is_unit=kwargs["idx_is_unit"], list_max=lst.shape[1])
    assert lst_n.cpu().tolist() == want_n and sum(n >= 0 for n in want_n) >= 0.9 * len(want_n)
    got = lst.cpu()
    for r, entries in enumerate(want_rows):
        if entries is None:
            continue
        assert [(int(p) >> 16 & 0xFFFF, int(p) & 0xFFFF) for p in got[r, : len(entries)]] == entries, f"row {r}"
