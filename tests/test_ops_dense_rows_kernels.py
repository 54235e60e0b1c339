"""The dense-row pass's Triton kernels (twell.ops.dense_rows_kernels) against their PyTorch twins in
twell.ops.hot_cold_dense_rows: the selection, the gated product and the write-back give the same bits.

Kernels run in Triton's interpreter on the CPU (natively on a GPU), on fresh random inputs: rows with and without an
overflowing tile, all-zero and all-overflowing counts, budgets below, at and above the overflowing rows, several
program blocks, strided counts, awkward sizes.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import INT_VIEW, set_dense_row_pass

from twell.ops import hot_cold_dense_rows
from twell.ops.dense_rows_kernels import gated_product, launch_select_overflow_rows, scatter_rows
from twell.ops.hot_cold_dense_rows import dense_rows_ffn, select_overflow_rows, select_overflow_rows_torch
from twell.tolerances import REL_TOL, rel_error


def _counts(m: int, n_tiles: int, p_over: float, capacity: int, seed: int, device) -> torch.Tensor:
    """int32 [m, n_tiles] counts at or under ``capacity``, a fraction ``p_over`` of the rows with 1-3 tiles above."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, capacity + 1, (m, n_tiles), generator=g, dtype=torch.int32)
    over = torch.rand(m, generator=g) < p_over
    for r in torch.nonzero(over).flatten().tolist():
        k = int(torch.randint(1, min(3, n_tiles) + 1, (1,), generator=g))
        tiles = torch.randperm(n_tiles, generator=g)[:k]
        c[r, tiles] = capacity + torch.randint(1, 50, (k,), generator=g, dtype=torch.int32)
    return c.to(device)


def _same_selection(counts: torch.Tensor, capacity: int, budget: int,
                    heavy_pairs: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    skip, rows = launch_select_overflow_rows(counts, capacity, budget, heavy_pairs)
    want_skip, want_rows = select_overflow_rows_torch(counts, capacity, budget, heavy_pairs)
    assert skip.dtype == torch.int8 and rows.dtype == torch.int64
    assert torch.equal(skip.cpu(), want_skip.cpu())
    assert torch.equal(rows.cpu(), want_rows.cpu())
    return skip, rows


@pytest.mark.parametrize(("m", "n_tiles"), [(1, 1), (7, 3), (255, 44), (256, 44), (257, 5), (1000, 70), (3000, 2)])
@pytest.mark.parametrize("p_over", [0.0, 0.02, 0.3, 1.0])
def test_selection_matches_its_twin(m, n_tiles, p_over, device):
    capacity = 8
    counts = _counts(m, n_tiles, p_over, capacity, seed=m * 131 + n_tiles, device=device)
    n_over = int((counts.amax(1) > capacity).sum())
    for budget in sorted({1, 3, max(1, n_over // 2), n_over + 5, m}):
        skip, rows = _same_selection(counts, capacity, budget)
        assert int(skip.sum()) == min(n_over, budget)


@pytest.mark.parametrize(("m", "n_tiles"), [(7, 3), (257, 44), (1000, 70)])
@pytest.mark.parametrize("p_over", [0.0, 0.05, 1.0])
def test_selection_with_heavy_rows_matches_its_twin(m, n_tiles, p_over, device):
    """Long rows without an overflowing tile ranked after every overflowing row, in the slots those leave."""
    capacity = 8
    counts = _counts(m, n_tiles, p_over, capacity, seed=m * 7 + n_tiles, device=device)
    pairs = counts.sum(1).cpu()
    over = (counts.amax(1) > capacity).cpu()
    for heavy_pairs in (1, int(pairs.float().median()), int(pairs.max()) + 1):
        heavy = ~over & (pairs > heavy_pairs)
        n_over, n_heavy = int(over.sum()), int(heavy.sum())
        for budget in sorted({1, max(1, n_over // 2), n_over + 3, n_over + n_heavy, m}):
            skip, rows = _same_selection(counts, capacity, budget, heavy_pairs)
            taken = skip.cpu().bool()
            assert int(taken.sum()) == min(n_over + n_heavy, budget)
            # every overflowing row the budget holds comes first; heavy rows only in the slots left
            assert int((taken & over).sum()) == min(n_over, budget)
            assert int((taken & heavy).sum()) == min(n_heavy, max(0, budget - n_over))
            assert not bool((taken & ~over & ~heavy).any())
            head = rows.cpu()[:min(n_over, budget)]
            assert bool(over[head].all()) and torch.equal(head, head.sort().values)


def test_selection_heavy_rows_by_hand(device):
    counts = torch.tensor([[1, 2], [5, 0], [3, 3], [3, 9], [4, 4], [0, 7]], dtype=torch.int32, device=device)
    # capacity 4: rows 1 and 3 overflow; more than 5 pairs: rows 2 (6), 4 (8), then row 5 (7) overflows too
    skip, rows = _same_selection(counts, 4, 6, heavy_pairs=5)
    assert skip.cpu().tolist() == [0, 1, 1, 1, 1, 1] and rows.cpu().tolist() == [1, 3, 5, 2, 4, 0]
    skip, rows = _same_selection(counts, 4, 4, heavy_pairs=5)
    assert skip.cpu().tolist() == [0, 1, 1, 1, 0, 1] and rows.cpu().tolist() == [1, 3, 5, 2]
    skip, rows = _same_selection(counts, 4, 2, heavy_pairs=5)
    assert skip.cpu().tolist() == [0, 1, 0, 1, 0, 0] and rows.cpu().tolist() == [1, 3]
    skip, rows = _same_selection(counts, 4, 6, heavy_pairs=0)  # 0: no heavy rows
    assert skip.cpu().tolist() == [0, 1, 0, 1, 0, 1] and rows.cpu().tolist() == [1, 3, 5, 0, 0, 0]


def test_selection_reads_strided_counts(device):
    """The op's cold counts are a view of the joined count buffer (cold columns, then hot): a row stride above the
    width."""
    joined = _counts(600, 40, 0.1, 6, seed=3, device=device)
    cold = joined[:, :29]
    assert not cold.is_contiguous()
    _same_selection(cold, 6, 32)
    _same_selection(cold, 6, 600)


def test_selection_without_rows_or_overflow(device):
    skip, rows = launch_select_overflow_rows(torch.zeros(0, 4, dtype=torch.int32, device=device), 2, 3)
    assert skip.numel() == 0 and rows.cpu().tolist() == [0, 0, 0]
    skip, rows = _same_selection(torch.zeros(300, 4, dtype=torch.int32, device=device), 2, 64)
    assert int(skip.sum()) == 0 and int(rows.abs().sum()) == 0  # every slot holds row 0


@pytest.mark.parametrize("fused", [True, False])
def test_selection_first_rows_in_order_through_the_op_entry(fused, device, monkeypatch):
    monkeypatch.setattr(hot_cold_dense_rows, "FUSED_PASS", fused)
    counts = torch.tensor([[1, 2], [5, 0], [0, 0], [3, 9], [4, 4], [0, 7]], dtype=torch.int32, device=device)
    skip, rows = select_overflow_rows(counts, 4, 2)
    assert skip.cpu().tolist() == [0, 1, 0, 1, 0, 0] and rows.cpu().tolist() == [1, 3]
    skip, rows = select_overflow_rows(counts, 4, 5)
    assert skip.cpu().tolist() == [0, 1, 0, 1, 0, 1] and rows.cpu().tolist() == [1, 3, 5, 0, 0]


@pytest.mark.parametrize(("counts", "capacity", "budget", "match"), [
    (torch.zeros(4, 2, dtype=torch.int64), 2, 1, r"cold_counts must be an int32 tensor \[M, n_cold_tiles\], got "
                                                r"torch.int64"),
    (torch.zeros(4, dtype=torch.int32), 2, 1, r"cold_counts must be an int32 tensor .* of shape \(4,\)"),
    ([[1, 2]], 2, 1, "cold_counts must be an int32 tensor .* got list"),
    (torch.zeros(4, 2, dtype=torch.int32), -1, 1, "capacity must be an int >= 0, got -1"),
    (torch.zeros(4, 2, dtype=torch.int32), True, 1, "capacity must be an int >= 0, got True"),
    (torch.zeros(4, 2, dtype=torch.int32), 2, 1.5, "budget must be an int >= 0, got 1.5"),
])
def test_selection_bad_inputs_are_named(counts, capacity, budget, match):
    with pytest.raises(ValueError, match=match):
        select_overflow_rows(counts, capacity, budget)


@pytest.mark.parametrize("heavy_pairs", [-1, 2.5, True])
def test_selection_bad_heavy_bound_is_named(heavy_pairs):
    with pytest.raises(ValueError, match=f"heavy_pairs must be an int >= 0, got {heavy_pairs!r}"):
        select_overflow_rows(torch.zeros(4, 2, dtype=torch.int32), 2, 1, heavy_pairs)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns, every NaN as one pattern (NaN payloads and signs are not compared)."""
    t = t.cpu().contiguous()
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(INT_VIEW[t.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 100), (64, 5632 // 8), (5, 8193)])
def test_gated_product_matches_torch_bits(shape, dtype, device):
    g = torch.randn(shape, dtype=dtype, device=device) * 3
    u = torch.randn(shape, dtype=dtype, device=device) * 3
    flat_g = g.view(-1)
    flat_g[: min(4, flat_g.numel())] = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf")],
                                                    dtype=dtype)[: min(4, flat_g.numel())]
    got = gated_product(g, u)
    assert got.dtype == dtype and got.shape == g.shape
    assert torch.equal(_bits(got), _bits(torch.relu(g) * u))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("d", [16, 1500])
@pytest.mark.parametrize("with_residual", [False, True])
def test_scatter_rows_matches_index_copy(d, dtype, with_residual, device):
    m = 9
    y = torch.randn(4, d, dtype=dtype, device=device)
    rows = torch.tensor([6, 0, 2, 0], dtype=torch.int64, device=device)
    y[3] = y[1]  # a repeated row carries the same values (unused budget slots recompute row 0)
    residual = torch.randn(m, d, dtype=dtype, device=device) if with_residual else None
    out = torch.full((m, d), float("nan"), dtype=dtype, device=device)
    want = out.clone()
    scatter_rows(y, rows, out, residual)
    yy = y + residual.index_select(0, rows) if with_residual else y
    want.index_copy_(0, rows, yy)
    assert torch.equal(_bits(out), _bits(want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
def test_dense_rows_ffn_same_bits_with_and_without_the_kernels(dtype, with_residual, device, monkeypatch):
    g = torch.Generator().manual_seed(7)
    m, d, f = 11, 64, 192
    x = torch.randn(m, d, generator=g).to(dtype=dtype, device=device)
    w_gate = (torch.randn(f, d, generator=g) / 8).to(dtype=dtype, device=device)
    w_up = (torch.randn(f, d, generator=g) / 8).to(dtype=dtype, device=device)
    w_down_t = (torch.randn(f, d, generator=g) / 8).to(dtype=dtype, device=device)
    residual = torch.randn(m, d, generator=g).to(dtype=dtype, device=device) if with_residual else None
    rows = torch.tensor([3, 9, 0, 0], dtype=torch.int64, device=device)
    results = []
    for fused in (True, False):
        monkeypatch.setattr(hot_cold_dense_rows, "FUSED_PASS", fused)
        out = torch.full((m, d), float("nan"), dtype=dtype, device=device)
        dense_rows_ffn(x, rows, w_gate, w_up, w_down_t, out, residual=residual)
        results.append(out)
    assert torch.equal(_bits(results[0]), _bits(results[1]))
    assert not torch.isnan(results[0][[0, 3, 9]]).any() and torch.isnan(results[0][[1, 2]]).all()


def _pass_problem(m: int, d: int, f: int, dtype: torch.dtype, device, seed: int) -> dict:
    """x [m, d], Wg and Wu [F, d], Wd^T [F, d] and a residual [m, d]; every third unit's Wg row is zero (it never
    fires: the small-batch kernels skip it), the others fire on about half the rows."""
    g = torch.Generator().manual_seed(seed)
    names = ("x", "w_gate", "w_up", "w_down_t", "residual")
    scale = {"x": 1.0, "w_gate": d**-0.5, "w_up": d**-0.5, "w_down_t": f**-0.5, "residual": 1.0}
    shape = {"x": (m, d), "w_gate": (f, d), "w_up": (f, d), "w_down_t": (f, d), "residual": (m, d)}
    p = {k: (torch.randn(shape[k], generator=g) * scale[k]) for k in names}
    p["w_gate"][::3] = 0.0
    return {k: v.to(dtype=dtype, device=device) for k, v in p.items()}


def _pass_outputs(p: dict, rows: torch.Tensor, variants: list[tuple[bool, int]], with_residual: bool,
                  monkeypatch) -> list[torch.Tensor]:
    outs = []
    for fused, batch_rows in variants:
        set_dense_row_pass(monkeypatch, fused, batch_rows)
        out = torch.full_like(p["x"], float("nan"))  # poisoned before the launch
        dense_rows_ffn(p["x"], rows, p["w_gate"], p["w_up"], p["w_down_t"], out,
                       residual=p["residual"] if with_residual else None)
        outs.append(out)
    return outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
def test_dense_rows_ffn_batch_pass_is_the_dense_ffn(dtype, with_residual, device, monkeypatch):
    """BATCH_PASS_MAX_ROWS: a pass of up to that many rows through the small-batch kernels writes the twins' values
    within the dtype's tolerance (only the down sum's order differs) on the listed rows, a repeated row 0 included,
    and leaves the others alone; a longer pass keeps the three GEMMs (the twins' bits)."""
    m, d, f = 13, 64, 320  # F not a multiple of the kernels' unit block
    p = _pass_problem(m, d, f, dtype, device, seed=3)
    rows = torch.tensor([5, 12, 0, 0, 0], dtype=torch.int64, device=device)
    twins, batch, gemms = _pass_outputs(p, rows, [(False, 0), (True, 64), (True, 4)], with_residual, monkeypatch)
    listed = [0, 5, 12]
    assert rel_error(batch[listed].float(), twins[listed].float()) <= REL_TOL[dtype]
    assert torch.isnan(batch[[r for r in range(m) if r not in listed]].float()).all()
    assert not torch.isnan(batch[listed].float()).any()
    assert torch.equal(_bits(gemms), _bits(twins))  # 5 rows > 4: not the small-batch kernels


def test_dense_rows_ffn_batch_pass_rows_that_fire_nothing(device, monkeypatch):
    """Rows whose gate fires no unit get exactly 0 (or their residual) through the small-batch kernels."""
    m, d, f = 6, 32, 128
    p = _pass_problem(m, d, f, torch.float32, device, seed=4)
    p["x"][[1, 3]] = 0.0  # g = 0 everywhere on these rows: relu(0) = 0, nothing fires
    rows = torch.tensor([1, 3, 0], dtype=torch.int64, device=device)
    for with_residual in (False, True):
        twins, batch = _pass_outputs(p, rows, [(False, 0), (True, 64)], with_residual, monkeypatch)
        want = p["residual"][[1, 3]] if with_residual else torch.zeros(2, d, device=device)
        assert torch.equal(batch[[1, 3]], want) and torch.equal(twins[[1, 3]], want)
        assert rel_error(batch[0], twins[0]) <= REL_TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.parametrize("with_residual", [False, True])
def test_gpu_dense_rows_ffn_batch_pass_at_the_model_shape(with_residual, monkeypatch):
    """64 budget rows of 4096 tokens at d=2048, F=5632, bf16, 40 distinct and row 0 again: the small-batch pass
    against the twins and against an fp32 reference of those rows."""
    m, d, f = 4096, 2048, 5632
    p = _pass_problem(m, d, f, torch.bfloat16, "cuda", seed=5)
    rows = torch.cat([torch.randperm(m, device="cuda")[:40], torch.zeros(24, dtype=torch.int64, device="cuda")])
    twins, batch = _pass_outputs(p, rows, [(False, 0), (True, 64)], with_residual, monkeypatch)
    xr = p["x"][rows].float()
    want = (torch.relu(xr @ p["w_gate"].float().t()) * (xr @ p["w_up"].float().t())) @ p["w_down_t"].float()
    if with_residual:
        want += p["residual"][rows].float()
    assert rel_error(batch[rows].float(), twins[rows].float()) <= REL_TOL[torch.bfloat16]
    assert rel_error(batch[rows].float(), want) <= REL_TOL[torch.bfloat16]
    assert not torch.isnan(batch[rows].float()).any()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4096, 131072])
def test_gpu_selection_at_model_sizes(m):
    """The 1.5B layer's cold tiles (at most 44 of 128 units at F=5632) at 4096 and 131,072 tokens, bf16 runs' counts."""
    counts = _counts(m, 44, 0.01, 13, seed=m, device="cuda")
    for budget in (64, 1152):
        _same_selection(counts, 13, budget)
        _same_selection(counts, 13, budget, heavy_pairs=300)  # ~half the rows (sums of 44 counts of 0-13)


@pytest.mark.gpu
@pytest.mark.parametrize("with_residual", [False, True])
def test_gpu_dense_rows_ffn_same_bits_at_the_model_shape(with_residual, monkeypatch):
    """64 budget rows of 4096 tokens at d=2048, F=5632, bf16: the kernels' pass writes the twins' bits."""
    m, d, f = 4096, 2048, 5632
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    w_gate, w_up = (torch.randn(f, d, device="cuda", dtype=torch.bfloat16) / 45 for _ in range(2))
    w_down_t = torch.randn(f, d, device="cuda", dtype=torch.bfloat16) / 75
    residual = torch.randn(m, d, device="cuda", dtype=torch.bfloat16) if with_residual else None
    rows = torch.cat([torch.randperm(m, device="cuda")[:40], torch.zeros(24, dtype=torch.int64, device="cuda")])
    results = []
    for fused in (True, False):
        monkeypatch.setattr(hot_cold_dense_rows, "FUSED_PASS", fused)
        out = torch.full((m, d), float("nan"), dtype=torch.bfloat16, device="cuda")  # poisoned before the launch
        dense_rows_ffn(x, rows, w_gate, w_up, w_down_t, out, residual=residual)
        results.append(out)
    assert torch.equal(_bits(results[0]), _bits(results[1]))
    assert not torch.isnan(results[0][rows]).any()
