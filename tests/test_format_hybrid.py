"""Tests of the hybrid ELL + dense-tail container and its unit-major transpose."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _helpers import assert_bitwise_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from twell.format import HybridTensor, UnitMajor, pack_hybrid
from twell.format.hybrid import INDEX_LIMIT, check_hybrid_bounds

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


# ---------------------------------------------------------------------------- helpers
def make_act(m: int, f: int, density: float, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Pre-activation whose relu is non-zero exactly on a Bernoulli(density) mask (never -0.0)."""
    gen = torch.Generator().manual_seed(seed)
    mag = torch.rand((m, f), generator=gen, dtype=torch.float64) + 0.25
    mask = torch.rand((m, f), generator=gen, dtype=torch.float64) < density
    return torch.where(mask, mag, -mag).to(dtype)


def act_with_row_counts(counts: list[int], f: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Pre-activation whose row i has exactly counts[i] positive entries at random columns."""
    gen = torch.Generator().manual_seed(seed)
    act = -(torch.rand((len(counts), f), generator=gen, dtype=torch.float64) + 0.25)
    for i, k in enumerate(counts):
        cols = torch.randperm(f, generator=gen)[:k]
        act[i, cols] = -act[i, cols]
    return act.to(dtype)


def dense_entries(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r, c = (dense != 0).nonzero(as_tuple=True)
    return r, c, dense[r, c]


def check_hybrid(act: torch.Tensor, width: int, **kw: object) -> HybridTensor:
    """Pack, validate, and check round trip, entries, statistics and the transpose."""
    h = pack_hybrid(act, width=width, **kw).validate()
    ref = torch.relu(act) if kw.get("apply_relu", True) else act
    assert h.shape == tuple(act.shape) and h.width == width and h.dtype == act.dtype
    assert h.device == act.device
    assert_bitwise_equal(h.to_dense(), ref)
    nnz = (ref != 0).sum(dim=1)
    assert torch.equal(h.row_nnz.long(), nnz)
    assert torch.equal(h.tail_rows, (nnz > width).nonzero().squeeze(1))
    assert h.n_tail() == int((nnz > width).sum())
    assert h.l0() == pytest.approx(float(nnz.sum()) / max(1, act.shape[0]))
    r, c, v = h.entries()
    rr, cc, vv = dense_entries(ref)
    assert r.dtype == torch.int64 and c.dtype == torch.int64
    assert torch.equal(r, rr) and torch.equal(c, cc)
    assert_bitwise_equal(v, vv)
    check_unit_major(h, ref)
    return h


def check_unit_major(h: HybridTensor, ref: torch.Tensor) -> UnitMajor:
    """The transpose covers exactly the ELL rows, in CSC order, with working back-pointers."""
    u = h.to_unit_major()
    m, f = h.shape
    ell_ref = ref.clone()
    ell_ref[h.tail_rows] = 0
    assert u.shape == (m, f)
    assert u.unit_ptr.dtype == torch.int64 and u.unit_ptr.shape == (f + 1,)
    assert u.rows.dtype == torch.int32 and u.src_pos.dtype == torch.int64 and u.values.dtype == h.dtype
    assert int(u.unit_ptr[0]) == 0 and int(u.unit_ptr[-1]) == u.nnz
    assert bool((u.unit_ptr[1:] >= u.unit_ptr[:-1]).all())
    assert torch.equal(u.unit_ptr[1:] - u.unit_ptr[:-1], (ell_ref != 0).sum(dim=0))
    # Dense transpose of the ELL part.
    assert_bitwise_equal(u.to_dense(), ell_ref)
    t_rows, t_cols = (ell_ref.T != 0).nonzero(as_tuple=True)  # unit-major order, tokens ascending
    assert torch.equal(u.unit_ids(), t_rows)
    assert torch.equal(u.rows.long(), t_cols)
    # Rows ascending within each unit (strictly: a token appears once per unit).
    units = u.unit_ids()
    same_unit = units[1:] == units[:-1]
    assert bool((u.rows[1:][same_unit] > u.rows[:-1][same_unit]).all())
    # src_pos points back into the row-major ELL arrays.
    if u.nnz > 0:
        assert_bitwise_equal(h.values.reshape(-1)[u.src_pos], u.values)
        assert torch.equal(h.cols.reshape(-1)[u.src_pos].long(), units)
        assert torch.equal(u.src_pos // h.width, u.rows.long())
    assert torch.equal(torch.unique(u.src_pos), u.src_pos.sort().values)  # no position used twice
    return u


# ---------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("density", [0.0, 0.005, 0.05, 0.5, 1.0])
def test_round_trip_densities(density: float, dtype: torch.dtype) -> None:
    act = make_act(41, 257, density, dtype, seed=int(density * 1000) + 1)
    h = check_hybrid(act, width=16)
    if density == 0.0:
        assert h.n_tail() == 0 and h.l0() == 0.0
    if density == 1.0:
        assert h.n_tail() == 41
        assert h.to_unit_major().nnz == 0


def test_rows_exactly_at_width_stay_in_ell() -> None:
    act = act_with_row_counts([4, 4, 3, 5, 0, 4], f=30, seed=1)
    h = check_hybrid(act, width=4)
    assert h.tail_rows.tolist() == [3]
    assert torch.equal(h.values[0] != 0, torch.ones(4, dtype=torch.bool))
    assert bool((h.cols[0, 1:] > h.cols[0, :-1]).all())  # ascending columns


def test_tail_rows_have_zero_ell_slots() -> None:
    act = act_with_row_counts([10, 1, 7, 2, 30], f=30, seed=2)
    h = check_hybrid(act, width=3)
    assert h.tail_rows.tolist() == [0, 2, 4]
    assert h.tail_values.shape == (3, 30)
    assert bool((h.values[h.tail_rows] == 0).all()) and bool((h.cols[h.tail_rows] == 0).all())
    assert_bitwise_equal(h.tail_values, torch.relu(act)[h.tail_rows])
    assert h.row_nnz.tolist() == [10, 1, 7, 2, 30]


def test_all_rows_in_tail() -> None:
    act = act_with_row_counts([5, 6, 9], f=12, seed=3)
    h = check_hybrid(act, width=2)
    assert h.n_tail() == 3
    u = h.to_unit_major()
    assert u.nnz == 0 and torch.equal(u.unit_ptr, torch.zeros(13, dtype=torch.int64))


def test_empty_rows_and_padding() -> None:
    act = act_with_row_counts([0, 2, 0, 0, 1], f=20, seed=4)
    h = check_hybrid(act, width=3)
    assert h.n_tail() == 0
    live = h.ell_live_mask()
    assert live.sum(dim=1).tolist() == [0, 2, 0, 0, 1]
    assert bool((h.values[~live] == 0).all()) and bool((h.cols[~live] == 0).all())


def test_width_larger_than_f() -> None:
    h = check_hybrid(make_act(5, 6, 1.0, torch.float32, seed=5), width=10)
    assert h.n_tail() == 0 and h.width == 10


@pytest.mark.parametrize("m", [0, 1])
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_tiny_row_counts(m: int, density: float) -> None:
    h = check_hybrid(make_act(m, 33, density, torch.bfloat16, seed=6), width=8)
    assert h.n_rows == m


def test_zero_columns() -> None:
    h = check_hybrid(torch.zeros(4, 0), width=2)
    assert h.to_unit_major().unit_ptr.tolist() == [0]


def test_apply_relu_false_keeps_negative_values() -> None:
    gen = torch.Generator().manual_seed(7)
    act = torch.randn((10, 40), generator=gen)
    act[act.abs() < 1.0] = 0.0
    h = check_hybrid(act, width=8, apply_relu=False)
    assert bool((h.to_dense() < 0).any())


def test_negative_zero_reads_back_as_positive_zero() -> None:
    act = torch.tensor([[-0.0, 2.0, -1.0], [0.0, -0.0, 3.0]])
    out = pack_hybrid(act, width=1).to_dense()
    assert torch.equal(out, torch.relu(act))
    assert not bool(torch.signbit(out).any())


@settings(deadline=None, max_examples=50)
@given(
    m=st.integers(0, 14),
    f=st.integers(0, 60),
    width=st.integers(1, 20),
    density=st.sampled_from([0.0, 0.02, 0.1, 0.3, 0.6, 1.0]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_round_trip_hypothesis(m: int, f: int, width: int, density: float, dtype: torch.dtype, seed: int) -> None:
    check_hybrid(make_act(m, f, density, dtype, seed), width=width)


# ---------------------------------------------------------------------------- transpose
def test_unit_major_small_example() -> None:
    act = torch.tensor(
        [
            [0.0, 1.0, 0.0, 2.0],
            [3.0, 0.0, 0.0, 4.0],
            [5.0, 6.0, 7.0, 8.0],  # tail row with width 2
            [0.0, 0.0, 9.0, 0.0],
        ]
    )
    h = pack_hybrid(act, width=2).validate()
    u = h.to_unit_major()
    assert u.unit_ptr.tolist() == [0, 1, 2, 3, 5]
    assert u.rows.tolist() == [1, 0, 3, 0, 1]
    assert u.values.tolist() == [3.0, 1.0, 9.0, 2.0, 4.0]
    assert u.src_pos.tolist() == [2, 0, 6, 1, 3]


def test_unit_major_is_deterministic() -> None:
    act = make_act(64, 200, 0.05, torch.bfloat16, seed=8)
    h1 = pack_hybrid(act, width=16)
    h2 = pack_hybrid(act.clone(), width=16)
    for a, b in zip(dataclasses.astuple(h1), dataclasses.astuple(h2), strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    u1, u2 = h1.to_unit_major(), h2.to_unit_major()
    for name in ("unit_ptr", "rows", "src_pos"):
        assert torch.equal(getattr(u1, name), getattr(u2, name))
    assert_bitwise_equal(u1.values, u2.values)


def test_unit_major_gradient_scatter_back() -> None:
    """A per-entry quantity computed in unit-major order lands on the right ELL slot via src_pos."""
    act = make_act(20, 50, 0.1, torch.float32, seed=9)
    h = pack_hybrid(act, width=8)
    u = h.to_unit_major()
    per_entry = u.values * 10.0 + u.unit_ids().float()  # some function of (value, unit)
    back = torch.zeros(h.values.numel())
    back[u.src_pos] = per_entry
    back = back.view_as(h.values)
    live = h.ell_live_mask()
    assert torch.equal(back[live], (h.values * 10.0 + h.cols.float())[live])
    assert bool((back[~live] == 0).all())


# ---------------------------------------------------------------------------- NaN policy
def test_nan_propagates_as_non_zero() -> None:
    act = act_with_row_counts([2, 9, 0], f=12, seed=10)
    c0, c1 = int((act[0] < 0).nonzero()[-1]), int((act[1] < 0).nonzero()[0])  # zeros of relu(act)
    act[0, c0] = float("nan")  # ELL row
    act[1, c1] = float("nan")  # tail row
    act[2, 3] = float("inf")
    h = check_hybrid(act, width=4)
    out = h.to_dense()
    assert bool(torch.isnan(out[0, c0])) and bool(torch.isnan(out[1, c1])) and out[2, 3] == float("inf")
    assert h.row_nnz.tolist() == [3, 10, 1]


def test_nan_policy_raise() -> None:
    act = make_act(3, 10, 0.5, torch.float32)
    act[1, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        pack_hybrid(act, width=4, nan_policy="raise")
    check_hybrid(make_act(3, 10, 0.5, torch.float32), width=4, nan_policy="raise")


def test_bad_nan_policy() -> None:
    with pytest.raises(ValueError, match="nan_policy"):
        pack_hybrid(torch.ones(2, 2), width=1, nan_policy="zero")


# ---------------------------------------------------------------------------- bad inputs and bounds
@pytest.mark.parametrize(
    "act,width,exc,needle",
    [
        ([[1.0]], 2, TypeError, "act"),
        (torch.ones(4), 2, ValueError, "act"),
        (torch.ones(2, 2, 2), 2, ValueError, "act"),
        (torch.ones(2, 3, dtype=torch.int32), 2, TypeError, "act"),
        (torch.ones(2, 3), 0, ValueError, "width"),
        (torch.ones(2, 3), -1, ValueError, "width"),
        (torch.ones(2, 3), 2.0, TypeError, "width"),
        (torch.ones(2, 3), None, TypeError, "width"),
    ],
)
def test_bad_inputs(act: object, width: object, exc: type[Exception], needle: str) -> None:
    with pytest.raises(exc, match=needle):
        pack_hybrid(act, width=width)  # type: ignore[arg-type]


def test_bounds_check() -> None:
    check_hybrid_bounds(0, 0, 1)
    check_hybrid_bounds(INDEX_LIMIT, INDEX_LIMIT, 1)
    check_hybrid_bounds(2**16, 2**20, 2**15 - 1)
    with pytest.raises(ValueError, match="F"):
        check_hybrid_bounds(10, 2**31, 4)
    with pytest.raises(ValueError, match="M"):
        check_hybrid_bounds(2**31, 10, 1)
    with pytest.raises(ValueError, match="width"):
        check_hybrid_bounds(2**16, 1000, 2**15)  # 2**31 ELL slots
    with pytest.raises(ValueError, match="non-negative"):
        check_hybrid_bounds(-1, 10, 4)
    with pytest.raises(TypeError, match="width"):
        check_hybrid_bounds(1, 10, 4.0)  # type: ignore[arg-type]


def test_pack_runs_bounds_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """pack_hybrid refuses sizes past the limit (limit lowered so no huge tensor is needed)."""
    import twell.format.hybrid as hybrid

    monkeypatch.setattr(hybrid, "INDEX_LIMIT", 63)
    with pytest.raises(ValueError, match="M \\* width"):
        pack_hybrid(torch.ones(8, 4), width=8)
    with pytest.raises(ValueError, match="F"):
        pack_hybrid(torch.ones(1, 64), width=1)
    pack_hybrid(torch.ones(7, 9), width=9).validate()


# ---------------------------------------------------------------------------- validate
@pytest.fixture
def packed() -> HybridTensor:
    """ELL rows with padding, an empty row and two tail rows."""
    act = act_with_row_counts([3, 8, 0, 1, 4, 10], f=16, seed=11)
    h = pack_hybrid(act, width=4).validate()
    assert h.tail_rows.tolist() == [1, 5]
    return h


def _corrupt(h: HybridTensor, field: str, fn) -> HybridTensor:  # noqa: ANN001
    value = getattr(h, field).clone()
    fn(value)
    return dataclasses.replace(h, **{field: value})


def test_validate_dtypes(packed: HybridTensor) -> None:
    with pytest.raises(TypeError, match="cols"):
        dataclasses.replace(packed, cols=packed.cols.long()).validate()
    with pytest.raises(TypeError, match="row_nnz"):
        dataclasses.replace(packed, row_nnz=packed.row_nnz.long()).validate()
    with pytest.raises(TypeError, match="tail_rows"):
        dataclasses.replace(packed, tail_rows=packed.tail_rows.int()).validate()
    with pytest.raises(TypeError, match="tail_values"):
        dataclasses.replace(packed, tail_values=packed.tail_values.double()).validate()
    with pytest.raises(TypeError, match="values"):
        dataclasses.replace(packed, values=packed.values.long()).validate()


def test_validate_shapes(packed: HybridTensor) -> None:
    with pytest.raises(ValueError, match="cols"):
        dataclasses.replace(packed, cols=packed.cols[:, :2]).validate()
    with pytest.raises(ValueError, match="row_nnz"):
        dataclasses.replace(packed, row_nnz=packed.row_nnz[:-1]).validate()
    with pytest.raises(ValueError, match="tail_values"):
        dataclasses.replace(packed, tail_values=packed.tail_values[:, :-1]).validate()
    with pytest.raises(ValueError, match="tail_values"):
        dataclasses.replace(packed, tail_values=packed.tail_values[:1]).validate()
    with pytest.raises(ValueError, match="values"):
        dataclasses.replace(packed, values=packed.values[0]).validate()
    with pytest.raises(ValueError, match="n_cols"):
        dataclasses.replace(packed, n_cols=-1).validate()


def test_validate_index_range(packed: HybridTensor) -> None:
    with pytest.raises(ValueError, match="cols"):
        _corrupt(packed, "cols", lambda x: x.__setitem__((0, 2), 16)).validate()
    with pytest.raises(ValueError, match="cols"):
        _corrupt(packed, "cols", lambda x: x.__setitem__((0, 0), -1)).validate()
    with pytest.raises(ValueError, match="ascending"):
        _corrupt(packed, "cols", lambda x: x.__setitem__((0, 1), x[0, 0])).validate()


def test_validate_row_nnz_and_tail(packed: HybridTensor) -> None:
    with pytest.raises(ValueError, match="row_nnz"):
        _corrupt(packed, "row_nnz", lambda x: x.__setitem__(0, -1)).validate()
    with pytest.raises(ValueError, match="row_nnz"):
        _corrupt(packed, "row_nnz", lambda x: x.__setitem__(1, 17)).validate()
    with pytest.raises(ValueError, match="tail_rows"):  # row 0 claims 5 > width but is not in the tail
        _corrupt(packed, "row_nnz", lambda x: x.__setitem__(0, 5)).validate()
    with pytest.raises(ValueError, match="ascending"):
        dataclasses.replace(packed, tail_rows=packed.tail_rows.flip(0)).validate()
    with pytest.raises(ValueError, match="row_nnz"):  # tail row count disagrees with its dense values
        _corrupt(packed, "row_nnz", lambda x: x.__setitem__(5, 9)).validate()


def test_validate_padding_and_tail_slots(packed: HybridTensor) -> None:
    with pytest.raises(ValueError, match="padded"):  # value in a padded slot of row 0 (3 live slots)
        _corrupt(packed, "values", lambda x: x.__setitem__((0, 3), 1.0)).validate()
    with pytest.raises(ValueError, match="padded"):  # column in a padded slot
        _corrupt(packed, "cols", lambda x: x.__setitem__((2, 0), 3)).validate()
    with pytest.raises(ValueError, match="tail"):  # tail row with ELL content would double count
        _corrupt(packed, "values", lambda x: x.__setitem__((1, 0), 1.0)).validate()
    with pytest.raises(ValueError, match="zero"):  # explicit zero in a live slot
        _corrupt(packed, "values", lambda x: x.__setitem__((3, 0), 0.0)).validate()


def test_validate_empty_container() -> None:
    h = pack_hybrid(torch.zeros(0, 5), width=3).validate()
    bad = dataclasses.replace(h, tail_rows=torch.zeros(1, dtype=torch.int64), tail_values=torch.zeros(1, 5))
    with pytest.raises(ValueError, match="tail"):
        bad.validate()
