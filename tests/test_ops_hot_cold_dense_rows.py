"""The hot/cold op's dense rows (twell.ops.hot_cold_dense_rows): rows with an overflowing cold tile computed by
dense GEMMs, the row kernel skipping them, the budget chosen from the refresh sample.

Kernels run in Triton's interpreter on the CPU (natively on a GPU); inputs are exact-grid values from
test_ops_kernels.make_problem, so counts equal the reference's bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import row_kernel_args, set_dense_row_pass
from test_ops_hot_cold import _plan, _run
from test_ops_kernels import make_problem

import twell.ops as ops
from twell.nn import hot_cold_cache
from twell.nn.hot_cold_cache import HotColdCache
from twell.ops import hot_cold, hot_cold_dense_rows
from twell.ops.hot_cold_dense_rows import (
    dense_row_budget,
    dense_rows_ffn,
    heavy_row_bounds,
    heavy_row_pairs,
    select_overflow_rows,
)
from twell.ops.hot_cold_plan import (
    _cold_tile_counts,
    overflow_row_fraction,
    overflow_row_fractions,
    overflow_tiles_per_row,
    sample_active,
)
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.reference import inference as ref
from twell.tolerances import REL_TOL, rel_error


def _problem_with_dense_rows(m: int, d: int, f: int, dense: list[int], dtype: torch.dtype, device) -> dict:
    """A sparse problem whose rows ``dense`` fire most units (their cold tiles overflow any small capacity)."""
    p = make_problem(m, d, f, frac_pos=0.06, seed=5, dtype=torch.float32, device="cpu")
    # the bias channel (x[:, 0] = 1 against each unit's negative offset in Wg[:, 0]) turned over on these rows:
    # the offset then adds 4x its size to every gate, and most units fire
    p["x"][dense, 0] = -4.0
    return {k: v.to(dtype=dtype, device=device) for k, v in p.items()}


@pytest.fixture
def selections(monkeypatch) -> list[int]:
    """The budgets of the op's dense-row selections (``select_overflow_rows`` calls) while the test runs."""
    budgets: list[int] = []
    real = hot_cold.select_overflow_rows

    def spy(*a, **k):
        budgets.append(a[2])
        return real(*a, **k)

    monkeypatch.setattr(hot_cold, "select_overflow_rows", spy)
    return budgets


def _overflowing_rows(counts: torch.Tensor, plan: ops.HotColdPlan, tile: int, cap: int) -> list[int]:
    n_cold_tiles = -(-(plan.n_units - plan.n_hot) // tile)
    return torch.nonzero((counts[:, :n_cold_tiles] > cap).any(1)).flatten().tolist()


def test_select_overflow_rows_first_rows_in_order():
    counts = torch.tensor([[1, 2], [5, 0], [0, 0], [3, 9], [4, 4], [0, 7]], dtype=torch.int32)
    # capacity 4: rows 1 (5), 3 (9) and 5 (7) overflow; row 4 sits at the capacity
    skip, rows = select_overflow_rows(counts, 4, 2)
    assert skip.dtype == torch.int8
    assert skip.tolist() == [0, 1, 0, 1, 0, 0]
    assert rows.tolist() == [1, 3]
    skip, rows = select_overflow_rows(counts, 4, 5)
    assert skip.tolist() == [0, 1, 0, 1, 0, 1]
    assert rows.tolist() == [1, 3, 5, 0, 0]  # unused slots hold row 0
    skip, rows = select_overflow_rows(counts, 9, 3)
    assert skip.tolist() == [0] * 6 and rows.tolist() == [0, 0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dense_rows_ffn_is_the_dense_ffn_on_those_rows(dtype):
    p = make_problem(7, 16, 48, frac_pos=0.3, seed=2, dtype=dtype, device="cpu")
    out = torch.full((7, 16), float("nan"), dtype=dtype)
    rows = torch.tensor([4, 1, 1], dtype=torch.int64)  # a repeated row writes the same values twice
    dense_rows_ffn(p["x"], rows, p["w_gate"], p["w_up"], p["w_down"].t().contiguous(), out)
    want = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], precision="match")
    for r in (1, 4):
        assert rel_error(out[r], want[r]) <= REL_TOL[dtype]
    assert torch.isnan(out[[0, 2, 3, 5, 6]]).all()  # rows not listed are left alone


def test_row_kernel_skips_flagged_overflowing_rows_only(device):
    m, d, f, tile, cap = 6, 16, 64, 16, 2
    p = _problem_with_dense_rows(m, d, f, [1, 4], torch.float32, device)
    gate = ops.gate_twell(p["x"], p["w_gate"], tile=tile, capacity=cap)
    over = (gate.counts > cap).any(1).cpu()
    assert over.any() and not over.all(), "the problem must have rows with and without an overflowing tile"
    wdt = p["w_down"].t().contiguous()
    flags = torch.ones(m, dtype=torch.int8, device=device)  # every row flagged: only overflowing ones skip
    out = torch.full((m, d), float("nan"), device=device)
    launch_twell_ffn(p["x"], gate.values, gate.indices, gate.counts, None, None, p["w_gate"], p["w_up"], wdt,
                     n_cols=f, tile=tile, round_hidden=True, out=out, skip_overflow_rows=flags)
    want = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], precision="match")
    out = out.cpu()
    assert torch.isnan(out[over]).all()
    assert rel_error(out[~over], want.cpu()[~over]) <= REL_TOL[torch.float32]


@pytest.mark.parametrize("lists", [True, False], ids=["listed", "searched"])
def test_row_kernel_skips_every_flagged_row_with_skip_flagged(lists, device):
    """``skip_flagged`` (the pass's long rows): a flagged row is skipped whether or not a tile overflows, listed or
    searched; unflagged rows are computed."""
    m, d, f, tile, cap = 6, 16, 64, 16, 6
    p = _problem_with_dense_rows(m, d, f, [1, 4], torch.bfloat16, device)  # lists pack 16-bit values
    gate = ops.gate_twell(p["x"], p["w_gate"], tile=tile, capacity=cap)
    over = (gate.counts > cap).any(1).cpu()
    plain = torch.nonzero(~over).flatten().tolist()
    assert len(plain) >= 2 and over.any(), "needs an overflowing row and two without one"
    flagged = torch.zeros(m, dtype=torch.bool)
    flagged[[plain[0], int(torch.nonzero(over)[0])]] = True  # a plain row and an overflowing one
    wdt = p["w_down"].t().contiguous()
    out = torch.full((m, d), float("nan"), dtype=torch.bfloat16, device=device)
    launch_twell_ffn(p["x"], gate.values, gate.indices, gate.counts, None, None, p["w_gate"], p["w_up"], wdt,
                     n_cols=f, tile=tile, round_hidden=True, out=out,
                     skip_overflow_rows=flagged.to(torch.int8).to(device), skip_flagged=True, listed=lists)
    want = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], precision="match").cpu()
    out = out.cpu()
    assert torch.isnan(out[flagged]).all()
    left = ~flagged & ~over
    assert not torch.isnan(out[left]).any()
    assert rel_error(out[left], want[left]) <= REL_TOL[torch.bfloat16]
    with pytest.raises(ValueError, match="`skip_flagged` needs the flags, `skip_overflow_rows`"):
        launch_twell_ffn(p["x"], gate.values, gate.indices, gate.counts, None, None, p["w_gate"], p["w_up"], wdt,
                         n_cols=f, tile=tile, round_hidden=True, out=out, skip_flagged=True)


PASS_VARIANTS = {"twins": (False, 0), "fused_pass": (True, 0), "batch_pass": (True, 64)}


def _set_pass(monkeypatch, variant: str) -> None:
    """The dense-row pass as its PyTorch twins, as its Triton kernels with three cuBLAS GEMMs, or with passes of up
    to 64 rows through the small-batch kernels."""
    set_dense_row_pass(monkeypatch, *PASS_VARIANTS[variant])


@pytest.mark.parametrize("variant", list(PASS_VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_op_with_heavy_rows_matches_reference(dtype, variant, device, monkeypatch):
    """With HEAVY_ROW_PAIRS the pass also takes long rows without an overflowing tile (the row kernel skips them):
    the output is still the layer's, and the selection saw the bound (HEAVY_ROW_PAIRS_LARGE from
    HEAVY_ROWS_LARGE_TOKENS tokens); at or above HEAVY_ROWS_MAX_TOKENS it does not."""
    _set_pass(monkeypatch, variant)
    m, d, f, tile, cap, n_hot = 9, 32, 128, 16, 2, 16
    p = _problem_with_dense_rows(m, d, f, [0, 4, 8], dtype, device)
    plan = _plan(p, n_hot)
    seen: list[int] = []
    real = hot_cold.select_overflow_rows

    def spy(counts, capacity, budget, heavy_pairs=0):
        seen.append(heavy_pairs)
        return real(counts, capacity, budget, heavy_pairs)

    monkeypatch.setattr(hot_cold, "select_overflow_rows", spy)
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS", 1)
    ref_out, _ = _run(p, plan, "torch", tile=tile, capacity=cap)
    dense = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], precision="match")
    for budget in (1, 4, 64):
        out, _ = _run(p, plan, "triton", tile=tile, capacity=cap, dense_rows=budget)
        assert rel_error(out, ref_out) <= REL_TOL[dtype] and rel_error(out, dense) <= REL_TOL[dtype]
        assert not torch.isnan(out.float()).any()
    assert seen == [1, 1, 1]
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROWS_LARGE_TOKENS", m)  # this call is a large one: its own bound
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS_LARGE", 2)
    out, _ = _run(p, plan, "triton", tile=tile, capacity=cap, dense_rows=4)
    assert seen[-1] == 2 and rel_error(out, ref_out) <= REL_TOL[dtype] and rel_error(out, dense) <= REL_TOL[dtype]
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROWS_MAX_TOKENS", m)  # this call is not below it: no heavy rows
    out, _ = _run(p, plan, "triton", tile=tile, capacity=cap, dense_rows=64)
    assert seen[-1] == 0 and rel_error(out, dense) <= REL_TOL[dtype]


def test_row_kernel_skip_flags_checked(device):
    p = make_problem(4, 16, 32, frac_pos=0.3, seed=1, dtype=torch.float32, device=device)
    args = row_kernel_args(p, 16, 4)
    out = torch.empty(4, 16, device=device)
    kw = dict(n_cols=32, tile=16, round_hidden=True, out=out)
    with pytest.raises(ValueError, match=r"skip_overflow_rows must be int8 \[4\]"):
        launch_twell_ffn(*args, **kw, skip_overflow_rows=torch.zeros(4, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match=r"skip_overflow_rows must be int8 \[4\]"):
        launch_twell_ffn(*args, **kw, skip_overflow_rows=torch.zeros(3, dtype=torch.int8, device=device))
    with pytest.raises(ValueError, match="does not combine with `taken`"):
        launch_twell_ffn(*args, **kw, skip_overflow_rows=torch.zeros(4, dtype=torch.int8, device=device),
                         taken=torch.zeros(4, dtype=torch.int8, device=device))


@pytest.mark.parametrize("fused", [False, True], ids=["twins", "fused_pass"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("budget", [0, 1, 2, 3, 64])
def test_op_with_dense_rows_matches_reference(budget, dtype, fused, device, monkeypatch):
    monkeypatch.setattr(hot_cold_dense_rows, "FUSED_PASS", fused)
    m, d, f, tile, cap, n_hot = 9, 32, 128, 16, 2, 16
    p = _problem_with_dense_rows(m, d, f, [0, 4, 8], dtype, device)
    plan = _plan(p, n_hot)
    out, counts = _run(p, plan, "triton", tile=tile, capacity=cap, dense_rows=budget)
    ref_out, ref_counts = _run(p, plan, "torch", tile=tile, capacity=cap)
    assert torch.equal(counts.cpu(), ref_counts.cpu())
    over = _overflowing_rows(counts.cpu(), plan, tile, cap)
    assert {0, 4, 8} <= set(over) and len(over) < m  # some rows overflow (more than the small budgets), some not
    dense = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], precision="match")
    assert rel_error(out, ref_out) <= REL_TOL[dtype]
    assert rel_error(out, dense) <= REL_TOL[dtype]
    for r in over[:budget]:  # the dense-row path computed these rows whole
        assert rel_error(out[r], dense[r]) <= REL_TOL[dtype]


def test_op_dense_rows_bad_values(device):
    p = make_problem(4, 16, 64, frac_pos=0.2, seed=3, dtype=torch.float32, device=device)
    plan = _plan(p, 16)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="dense_rows must be an int >= 0"):
            _run(p, plan, "triton", tile=16, dense_rows=bad)


def test_op_dense_rows_uses_the_selection(device, selections):
    """A budget > 0 takes the dense-row path (the selection runs), 0 does not."""
    p = _problem_with_dense_rows(6, 32, 128, [2], torch.float32, device)
    plan = _plan(p, 16)
    _run(p, plan, "triton", tile=16, capacity=2, dense_rows=0)
    assert selections == []
    _run(p, plan, "triton", tile=16, capacity=2, dense_rows=100)
    assert selections == [6]  # the budget is capped at the call's rows


def test_overflow_row_fraction_counts_cold_tiles_only():
    active = torch.zeros(4, 8, dtype=torch.bool)
    active[0, [0, 1, 2]] = True  # cold tile 0 holds units 0, 1, 3 (unit 2 is hot): 2 non-zeros
    active[1, [3, 4, 5, 6]] = True  # cold units 3 | 4 5 6 (tiles [0 1 3], [4 5 6], [7]): tile 1 holds 3
    active[2, [7]] = True
    hot = torch.tensor([2])
    assert overflow_row_fraction(active, hot, 3, 2) == 0.25  # row 1 only
    assert overflow_row_fraction(active, hot, 3, 3) == 0.0
    assert overflow_row_fraction(active, torch.arange(8), 3, 1) == 0.0  # nothing cold
    assert overflow_row_fraction(active[:0], hot, 3, 1) == 0.0
    active[3, [3, 4, 5, 6]] = True  # row 3: tile 0 (units 0, 1, 3) holds 3 as well, tile 1 holds 3
    active[3, [0, 1]] = True
    assert overflow_tiles_per_row(active, hot, 3, 2).tolist() == [0, 1, 0, 2]
    assert overflow_row_fraction(active, hot, 3, 2) == 0.5
    assert overflow_row_fraction(active, hot, 3, 2, min_tiles=2) == 0.25  # row 3 only
    assert overflow_tiles_per_row(active, torch.arange(8), 3, 1).tolist() == [0, 0, 0, 0]
    assert overflow_tiles_per_row(active[:0], hot, 3, 1).shape == (0,)
    with pytest.raises(ValueError, match="min_tiles must be >= 1"):
        overflow_row_fraction(active, hot, 3, 2, min_tiles=0)


def test_dense_row_budget():
    assert dense_row_budget(131072, 0.0, margin=1.5, slack=32, multiple=64) == 0
    assert dense_row_budget(0, 0.1, margin=1.5, slack=32, multiple=64) == 0
    assert dense_row_budget(131072, 23 / 4096, margin=1.5, slack=32, multiple=64) == 1152  # 1104 + 32 -> 1152
    assert dense_row_budget(100, 0.5, margin=1.5, slack=32, multiple=64) == 100  # at most the call's rows
    # fewer expected rows than min_expected: no pass (one row of a 4096-row sample predicts 4 at 16,384 tokens)
    assert dense_row_budget(16384, 1 / 4096, margin=1.5, slack=32, multiple=64, min_expected=16) == 0
    assert dense_row_budget(16384, 4 / 4096, margin=1.5, slack=32, multiple=64, min_expected=16) == 64  # 24 + 32
    assert dense_row_budget(131072, 1 / 4096, margin=1.5, slack=32, multiple=64, min_expected=16) == 128  # 48 + 32
    # ... unless the rows overflowing several tiles are expected at least min_expected_severe times
    few = {"margin": 1.5, "slack": 32, "multiple": 64, "min_expected": 16}
    assert dense_row_budget(8192, 9 / 8192, severe_fraction=2 / 8192, min_expected_severe=1.0, **few) == 64  # 13 + 32
    assert dense_row_budget(8192, 9 / 8192, severe_fraction=2 / 8192, min_expected_severe=3.0, **few) == 0
    assert dense_row_budget(2048, 9 / 8192, severe_fraction=2 / 8192, min_expected_severe=1.0, **few) == 0  # 0.5
    assert dense_row_budget(8192, 9 / 8192, severe_fraction=2 / 8192, **few) == 0  # the rule off by default
    assert dense_row_budget(8192, 0.0, severe_fraction=2 / 8192, min_expected_severe=1.0, **few) == 0


def test_cache_measures_the_overflow_fraction(device, monkeypatch):
    p = _problem_with_dense_rows(8, 32, 128, [1, 6], torch.float32, device)
    cache = HotColdCache(min_frequency=0.3, max_cold_l0=None)  # 8 tokens: the default would make every unit hot
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=2)
    assert 0 < cache._hot.numel() < 128
    active = sample_active(p["x"], p["w_gate"])
    want = overflow_row_fraction(active, cache._hot, 16, 2)
    assert want >= 2 / 8
    assert cache.overflow_fraction == want
    severe = overflow_row_fraction(active, cache._hot, 16, 2, min_tiles=hot_cold_cache.DENSE_ROWS_SEVERE_TILES)
    assert severe >= 2 / 8  # rows 1 and 6 fire most units: several cold tiles overflow
    assert cache.severe_overflow_fraction == severe
    # the shipped rules: 8 tokens hold too few overflowing rows for the 16-row minimum, but two rows that overflow
    # several tiles each are a tail worth the pass
    assert hot_cold_cache.DENSE_ROWS_MIN_EXPECTED > 8 * want
    assert 8 * severe >= hot_cold_cache.DENSE_ROWS_MIN_SEVERE
    assert cache.dense_rows(8) == 8
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_MAX_TOKENS", 8)  # the rule for smaller calls only
    assert cache.dense_rows(8) == 0
    monkeypatch.undo()
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_MIN_SEVERE", 8 * severe + 1)
    assert cache.dense_rows(8) == 0
    # 64 tokens are expected to hold enough overflowing rows for the 16-row minimum alone
    assert cache.dense_rows(64) == dense_row_budget(64, want, margin=hot_cold_cache.DENSE_ROWS_MARGIN,
                                                    slack=hot_cold_cache.DENSE_ROWS_SLACK,
                                                    multiple=hot_cold_cache.DENSE_ROWS_MULTIPLE) > 0
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_MIN_EXPECTED", 0.0)
    assert cache.dense_rows(8) == 8 and cache.dense_rows(0) == 0
    monkeypatch.setattr(hot_cold_cache, "DENSE_OVERFLOW_ROWS", False)
    assert cache.dense_rows(8) == 0
    cache.clear()
    assert cache.overflow_fraction == 0.0 and cache.severe_overflow_fraction == 0.0
    # the several-tiles rule off: the refresh measures no such rows
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_TILES", 0)
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=2)
    assert cache.overflow_fraction == want and cache.severe_overflow_fraction == 0.0
    # no hot unit: the layer has no plan (the plain TwELL op runs), so no dense-row budget either
    cache = HotColdCache(min_frequency=1.0, max_cold_l0=None)
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=2)
    assert cache._hot.numel() == 0 and cache.overflow_fraction == 0.0


def test_overflow_row_fractions_with_heavy_rows():
    active = torch.zeros(4, 8, dtype=torch.bool)
    active[0, [0, 1, 3]] = True  # cold tiles [0 1 3], [4 5 6], [7] (unit 2 hot): tile 0 holds 3 (overflows at 2)
    active[1, [0, 4, 7]] = True  # 3 cold pairs, no tile above 2
    active[2, [3]] = True  # 1 pair
    active[3, [0, 1, 2, 4, 5]] = True  # 4 cold pairs (unit 2 is hot), tiles hold 2 and 2
    hot = torch.tensor([2])
    assert overflow_row_fractions(active, hot, 3, 2, (1,), heavy_pairs=2) == [0.25, 0.5]  # rows 1 and 3 heavy
    assert overflow_row_fractions(active, hot, 3, 2, (1, 2), heavy_pairs=3) == [0.25, 0.0, 0.25]  # row 3 only
    assert overflow_row_fractions(active, hot, 3, 2, (1,)) == [0.25]  # no heavy entry without a bound
    assert overflow_row_fractions(active[:0], hot, 3, 2, (1,), heavy_pairs=2) == [0.0, 0.0]
    assert overflow_row_fractions(active, torch.arange(8), 3, 2, (1,), heavy_pairs=2) == [0.0, 0.0]  # nothing cold
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="heavy_pairs must be an int >= 0"):
            overflow_row_fractions(active, hot, 3, 2, (1,), heavy_pairs=bad)
    # several bounds (the shipped bound differs by the call's size): one entry each, in the order given
    assert overflow_row_fractions(active, hot, 3, 2, (1,), heavy_pairs=(2, 3)) == [0.25, 0.5, 0.25]
    assert overflow_row_fractions(active, hot, 3, 2, (1, 2), heavy_pairs=[3, 2, 8]) == [0.25, 0.0, 0.25, 0.5, 0.0]
    assert overflow_row_fractions(active, hot, 3, 2, (1,), heavy_pairs=()) == [0.25]
    assert overflow_row_fractions(active[:0], hot, 3, 2, (1,), heavy_pairs=(2, 3)) == [0.0, 0.0, 0.0]
    for bad in ((0,), (2, 1.5), [True], (-2,)):
        with pytest.raises(ValueError, match="heavy_pairs as a sequence must hold ints >= 1"):
            overflow_row_fractions(active, hot, 3, 2, (1,), heavy_pairs=bad)


def test_overflow_row_fractions_with_long_rows():
    active = torch.zeros(4, 8, dtype=torch.bool)  # the rows of test_overflow_row_fractions_with_heavy_rows
    active[0, [0, 1, 3]] = True  # 3 cold pairs, tile 0 overflows at capacity 2
    active[1, [0, 4, 7]] = True  # 3 cold pairs, no tile above 2
    active[2, [3]] = True  # 1 pair
    active[3, [0, 1, 2, 4, 5]] = True  # 4 cold pairs (unit 2 is hot), tiles hold 2 and 2
    hot = torch.tensor([2])
    assert overflow_row_fractions(active, hot, 3, 2, (1,), long_rows=(1, 0)) == [0.25, 0.25]  # row 0: a tile
    assert overflow_row_fractions(active, hot, 3, 2, (1,), long_rows=(0, 3)) == [0.25, 0.25]  # row 3: 4 pairs
    assert overflow_row_fractions(active, hot, 3, 2, (1,), long_rows=(1, 2)) == [0.25, 0.75]  # rows 0, 1 and 3
    assert overflow_row_fractions(active, hot, 3, 2, (1,), long_rows=(2, 3)) == [0.25, 0.25]  # row 3 by its pairs
    assert overflow_row_fractions(active, hot, 3, 2, (1,), long_rows=(0, 0)) == [0.25, 0.0]  # both tests off
    # after the heavy-row entries, one entry whatever their number
    assert overflow_row_fractions(active, hot, 3, 2, (1, 2), heavy_pairs=(2, 3), long_rows=(1, 2)) == [
        0.25, 0.0, 0.5, 0.25, 0.75]
    assert overflow_row_fractions(active[:0], hot, 3, 2, (1,), heavy_pairs=2, long_rows=(1, 2)) == [0.0] * 3
    assert overflow_row_fractions(active, torch.arange(8), 3, 2, (1,), long_rows=(1, 2)) == [0.0, 0.0]  # none cold
    for bad in ((1,), (1, 2, 3), (-1, 0), (1.5, 0), (True, 0), (0, None), 5, "1, 2"):
        with pytest.raises(ValueError, match="long_rows must be None or"):
            overflow_row_fractions(active, hot, 3, 2, (1,), long_rows=bad)


def test_long_rows_by_pairs_give_a_budget(device, monkeypatch):
    # capacity = tile: no cold tile overflows, so only the pair bound can make a row long
    p = _problem_with_dense_rows(8, 32, 128, [1, 6], torch.float32, device)
    cache = HotColdCache(min_frequency=0.3, max_cold_l0=None)
    active = sample_active(p["x"], p["w_gate"])
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=16)
    pairs = _cold_tile_counts(active, cache._hot, 16).sum(1)
    bound = int(pairs[[0, 2, 3, 4, 5, 7]].max())  # the plain rows' most
    assert int(pairs[[1, 6]].min()) > bound  # rows 1 and 6 fire most units: the two rows above it
    # those two are the call's heavy rows (the pass takes them), counted in the budget: 2 of the 16-row rule's 16
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS", bound)
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_PAIRS", 0)  # the pair test off: no long row
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=16)
    assert cache.overflow_fraction == cache.severe_overflow_fraction == 0.0
    assert cache.heavy_row_fractions[bound] == 2 / 8 and cache.dense_rows(8) == 0
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_PAIRS", bound)
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=16)
    want = overflow_row_fractions(active, cache._hot, 16, 16, (1,), long_rows=(hot_cold_cache.DENSE_ROWS_SEVERE_TILES,
                                                                               bound))[-1]
    assert cache.severe_overflow_fraction == want == 2 / 8
    assert cache.dense_rows(8) == 8  # the two long rows: a pass
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_MAX_TOKENS", 8)  # the rule for smaller calls only
    assert cache.dense_rows(8) == 0
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_MAX_TOKENS", 16384)
    # the pair test alone, with the several-tiles test off
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_TILES", 0)
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_PAIRS", bound)
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=16)
    assert cache.severe_overflow_fraction == 2 / 8
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_PAIRS", int(pairs.max()))  # "more than": none
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=16)
    assert cache.severe_overflow_fraction == 0.0 and cache.dense_rows(8) == 0


def test_heavy_row_bound_by_call_size(monkeypatch):
    """HEAVY_ROW_PAIRS below HEAVY_ROWS_LARGE_TOKENS, HEAVY_ROW_PAIRS_LARGE from there, none from HEAVY_ROWS_MAX_TOKENS
    (read at call time); heavy_row_bounds lists the distinct positive ones."""
    large, top = hot_cold_dense_rows.HEAVY_ROWS_LARGE_TOKENS, hot_cold_dense_rows.HEAVY_ROWS_MAX_TOKENS
    assert 0 < large < top
    small_k, large_k = hot_cold_dense_rows.HEAVY_ROW_PAIRS, hot_cold_dense_rows.HEAVY_ROW_PAIRS_LARGE
    assert [heavy_row_pairs(n) for n in (1, large - 1, large, top - 1, top, 10 * top)] == \
        [small_k, small_k, large_k, large_k, 0, 0]
    assert heavy_row_bounds() == tuple(sorted({small_k, large_k} - {0}))
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS", 32)
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS_LARGE", 0)  # none from HEAVY_ROWS_LARGE_TOKENS
    assert (heavy_row_pairs(large - 1), heavy_row_pairs(large), heavy_row_bounds()) == (32, 0, (32,))
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS_LARGE", 32)
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROWS_LARGE_TOKENS", 100)
    assert (heavy_row_pairs(99), heavy_row_pairs(100), heavy_row_bounds()) == (32, 32, (32,))
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS", 0)
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS_LARGE", 0)
    assert (heavy_row_pairs(1), heavy_row_pairs(100), heavy_row_bounds()) == (0, 0, ())


def test_cache_counts_heavy_rows_when_asked(device, monkeypatch):
    """DENSE_ROWS_COUNT_HEAVY (on since session 49): the refresh measures the heavy rows and small calls' budgets
    count them; off, neither."""
    p = _problem_with_dense_rows(64, 32, 128, [1, 6], torch.float32, device)
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS", 4)
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS_LARGE", 5)
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROWS_LARGE_TOKENS", 2048)
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_COUNT_HEAVY", False)
    cache = HotColdCache(min_frequency=0.05, max_cold_l0=None)  # 64 hot units of 128: 2-6 cold pairs a plain row
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=4)
    assert cache.heavy_row_fractions == {}  # the switch off: not measured
    off = cache.dense_rows(1024)
    monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_COUNT_HEAVY", True)
    cache.refresh(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=16, capacity=4)
    active = sample_active(p["x"], p["w_gate"])
    over, severe, heavy, heavy_large = overflow_row_fractions(active, cache._hot, 16, 4,
                                                              (1, hot_cold_cache.DENSE_ROWS_SEVERE_TILES), (4, 5))
    assert 0 < cache._hot.numel() < 128
    assert heavy > heavy_large > 0 and cache.heavy_row_fractions == {4: heavy, 5: heavy_large}
    assert (cache.overflow_fraction, cache.severe_overflow_fraction) == (over, severe)
    budget = dict(margin=hot_cold_cache.DENSE_ROWS_MARGIN, slack=hot_cold_cache.DENSE_ROWS_SLACK,
                  multiple=hot_cold_cache.DENSE_ROWS_MULTIPLE, min_expected=hot_cold_cache.DENSE_ROWS_MIN_EXPECTED,
                  severe_fraction=severe, min_expected_severe=hot_cold_cache.DENSE_ROWS_MIN_SEVERE)
    assert cache.dense_rows(1024) == dense_row_budget(1024, over + heavy, **budget) > off
    # a call from HEAVY_ROWS_LARGE_TOKENS counts the rows over the large bound, from the same sample
    assert cache.dense_rows(4096) == dense_row_budget(4096, over + heavy_large, **budget)
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROW_PAIRS_LARGE", 6)  # set after the refresh: none counted
    assert cache.dense_rows(4096) == dense_row_budget(4096, over, **budget)
    monkeypatch.setattr(hot_cold_dense_rows, "HEAVY_ROWS_MAX_TOKENS", 1024)  # not below it: not counted
    assert cache.dense_rows(1024) == dense_row_budget(1024, over, **budget) == off
    cache.clear()
    assert cache.heavy_row_fractions == {} and cache.overflow_fraction == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(PASS_VARIANTS))
@pytest.mark.parametrize("shape", [(2048, 5632), (768, 2048)])
def test_gpu_bf16_dense_first_tokens(shape, variant, monkeypatch):
    """Real shapes, bf16: a batch whose first tokens of each sequence fire ~15 % of units (as the 1.5B forward's
    first layers do); the dense rows against an fp32 reference and against the op without them, the pass in PyTorch
    ops, as its Triton kernels, or through the small-batch kernels at 64 rows (:func:`_set_pass`)."""
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    _set_pass(monkeypatch, variant)

    d, f = shape
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)
    p = synthetic_ffn_problem(8192, d, f, SparsityProfile(mean_l0=0.005 * f), generator=gen, device=dev)
    p = {k: p[k] for k in ("x", "w_gate", "w_up", "w_down")}
    heavy = torch.arange(0, 8192, 512, device=dev)
    p["x"][heavy, 1] += 2.0  # the generator's per-position shift channel: these rows fire far more units
    plan = ops.build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"],
                                   ops.choose_hot_units(ops.unit_frequency(p["x"], p["w_gate"])))
    want = ref.dense_gated_ffn(p["x"].float(), p["w_gate"].float(), p["w_up"].float(), p["w_down"].float(),
                               precision="fp32")
    base, counts = _run(p, plan, "triton")
    over = _overflowing_rows(counts, plan, 128, 16)
    assert len(over) >= 8
    for budget in (4, 64):
        out, c = _run(p, plan, "triton", dense_rows=budget)
        assert torch.equal(c, counts)
        assert rel_error(out, want) <= REL_TOL[torch.bfloat16]
        assert rel_error(out, base) <= REL_TOL[torch.bfloat16]
        assert not torch.isnan(out).any()


@pytest.mark.parametrize("rule", ["rows", "severe", "off"])
def test_module_passes_the_sample_budget(device, selections, monkeypatch, rule):
    """SparseGatedMLP's sparse call takes the budget its refresh sample gives: every row's worth where the 16-row
    minimum is lifted ("rows"), or by the shipped several-tiles rule alone ("severe": rows 1 and 6 overflow several
    cold tiles each); no pass with that rule off too ("off": 8 tokens never reach the 16-row minimum)."""
    from twell.nn import DispatchPolicy, SparseGatedMLP

    if rule == "rows":
        monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_MIN_EXPECTED", 0.0)
    if rule == "off":
        monkeypatch.setattr(hot_cold_cache, "DENSE_ROWS_SEVERE_TILES", 0)

    p = _problem_with_dense_rows(8, 32, 128, [1, 6], torch.float32, device)
    mlp = SparseGatedMLP.from_weights(p["w_gate"], p["w_up"], p["w_down"], backend="triton", tile=16, capacity=2,
                                      policy=DispatchPolicy.always_sparse()).eval()
    mlp._hot_cold = HotColdCache(min_frequency=0.3, max_cold_l0=None)  # 8 tokens: some units cold
    with torch.no_grad():
        out = mlp(p["x"])
    assert mlp._hot_cold.overflow_fraction > 0 and selections == ([] if rule == "off" else [8])
    dense = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], precision="match")
    assert rel_error(out, dense) <= REL_TOL[torch.float32]
