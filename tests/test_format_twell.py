"""Tests of the TwELL container: exact round trips, entries, validation, recompute variant, inputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _helpers import assert_bitwise_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from twell.format import TwellTensor, default_capacity, pack_twell, unpack_twell

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


# ---------------------------------------------------------------------------- helpers
def make_act(m: int, f: int, density: float, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Gate pre-activation whose relu has non-zeros exactly where a Bernoulli(density) mask is set.

    Positive entries are bounded away from zero, negative ones never produce -0.0 (relu(-0.0) is -0.0,
    which a sparse format reads back as +0.0; that case has its own test).
    """
    gen = torch.Generator().manual_seed(seed)
    mag = torch.rand((m, f), generator=gen, dtype=torch.float64) + 0.25
    mask = torch.rand((m, f), generator=gen, dtype=torch.float64) < density
    return torch.where(mask, mag, -mag).to(dtype)


def dense_entries(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r, c = (dense != 0).nonzero(as_tuple=True)
    return r, c, dense[r, c]


def check_round_trip(act: torch.Tensor, **kw: object) -> TwellTensor:
    t = pack_twell(act, **kw).validate()
    ref = torch.relu(act) if kw.get("apply_relu", True) else act
    assert_bitwise_equal(t.to_dense(), ref)
    assert_bitwise_equal(unpack_twell(t), ref)
    assert t.shape == tuple(act.shape)
    return t


# ---------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("density", [0.0, 0.005, 0.05, 0.5, 1.0])
def test_round_trip_densities(density: float, dtype: torch.dtype) -> None:
    act = make_act(37, 300, density, dtype, seed=int(density * 1000))
    t = check_round_trip(act, tile=64, capacity=8)
    assert t.n_tiles == 5  # 300 = 4 * 64 + 44: last tile partial
    ref = torch.relu(act)
    assert torch.equal(t.row_nnz(), (ref != 0).sum(dim=1))
    assert t.l0() == pytest.approx(float((ref != 0).sum()) / 37)
    if density == 0.0:
        assert t.n_overflow() == 0 and int(t.counts.sum()) == 0
    if density == 1.0:
        assert t.n_overflow() == 37 * 5  # every row-tile holds more than 8 non-zeros


def test_all_zero_rows_mixed_with_dense_rows() -> None:
    act = make_act(10, 100, 0.3, torch.float32, seed=1)
    act[::2] = -1.0
    t = check_round_trip(act, tile=32, capacity=4)
    assert torch.equal(t.counts[::2], torch.zeros_like(t.counts[::2]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_tile_overflows(dtype: torch.dtype) -> None:
    act = make_act(9, 130, 1.0, dtype, seed=2)
    t = check_round_trip(act, tile=16, capacity=1)
    assert bool(t.overflow_mask().all())
    assert t.spill_values is not None and t.spill_values.shape == (9 * 9, 16)
    assert torch.equal(t.overflow_tiles(), t.overflow_mask().nonzero())
    # The first `capacity` non-zeros are still in the ELL slots.
    assert torch.equal(t.indices[..., 0], torch.zeros_like(t.indices[..., 0]))


@pytest.mark.parametrize("f,tile", [(300, 64), (1, 64), (63, 64), (65, 64), (7, 3), (300, 300)])
def test_tile_not_dividing_f(f: int, tile: int) -> None:
    act = make_act(5, f, 0.4, torch.float32, seed=f)
    t = check_round_trip(act, tile=tile, capacity=max(1, tile // 4))
    assert t.n_tiles == -(-f // tile)


def test_capacity_equal_to_tile_never_overflows() -> None:
    act = make_act(6, 200, 1.0, torch.bfloat16, seed=3)
    t = check_round_trip(act, tile=32, capacity=32)
    assert t.n_overflow() == 0
    assert t.spill_values is not None and t.spill_values.shape[0] == 0


@pytest.mark.parametrize("m", [0, 1])
def test_tiny_row_counts(m: int) -> None:
    act = make_act(m, 50, 0.5, torch.float16, seed=4)
    t = check_round_trip(act, tile=16, capacity=2)
    assert t.n_rows == m
    rows, cols, vals = t.entries()
    assert rows.numel() == int((torch.relu(act) != 0).sum())


def test_default_tile_and_capacity() -> None:
    act = make_act(4, 500, 0.05, torch.float32, seed=5)
    t = check_round_trip(act)
    assert t.tile == 128 and t.capacity == default_capacity(128) == 16
    assert default_capacity(4) == 1


def test_apply_relu_false_keeps_negative_values() -> None:
    gen = torch.Generator().manual_seed(6)
    act = torch.randn((8, 90), generator=gen)
    act[act.abs() < 0.8] = 0.0
    t = check_round_trip(act, tile=32, capacity=4, apply_relu=False)
    assert bool((t.to_dense() < 0).any())


def test_negative_zero_reads_back_as_positive_zero() -> None:
    """Zeros are not stored, so relu(-0.0) = -0.0 comes back as +0.0 (equal, not bit-identical)."""
    act = torch.tensor([[-0.0, 1.0, -2.0, 0.0]])
    out = pack_twell(act, tile=4, capacity=2).to_dense()
    assert torch.equal(out, torch.relu(act))
    assert not bool(torch.signbit(out).any())


@settings(deadline=None, max_examples=40)
@given(
    m=st.integers(0, 12),
    f=st.integers(0, 70),
    tile=st.integers(1, 80),
    cap_frac=st.floats(0.0, 1.0),
    density=st.sampled_from([0.0, 0.01, 0.1, 0.3, 0.7, 1.0]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_round_trip_hypothesis(
    m: int, f: int, tile: int, cap_frac: float, density: float, dtype: torch.dtype, seed: int
) -> None:
    capacity = max(1, min(tile, round(cap_frac * tile)))
    act = make_act(m, f, density, dtype, seed)
    t = check_round_trip(act, tile=tile, capacity=capacity)
    r, c, v = t.entries()
    rr, cc, vv = dense_entries(torch.relu(act))
    assert torch.equal(r, rr) and torch.equal(c, cc)
    assert_bitwise_equal(v, vv)


# ---------------------------------------------------------------------------- entries
@pytest.mark.parametrize("density", [0.0, 0.05, 0.5, 1.0])
def test_entries_match_dense_nonzeros(density: float) -> None:
    act = make_act(13, 150, density, torch.float32, seed=7)
    t = pack_twell(act, tile=32, capacity=4)
    rows, cols, vals = t.entries()
    assert rows.dtype == torch.int64 and cols.dtype == torch.int64 and vals.dtype == act.dtype
    rr, cc, vv = dense_entries(torch.relu(act))
    assert torch.equal(rows, rr) and torch.equal(cols, cc)
    assert_bitwise_equal(vals, vv)


# ---------------------------------------------------------------------------- NaN policy
def test_nan_propagates_as_non_zero() -> None:
    act = make_act(4, 40, 0.1, torch.float32, seed=8)
    act[1, 5] = float("nan")
    act[2, 7] = float("inf")
    act[3, 9] = float("-inf")
    t = check_round_trip(act, tile=16, capacity=2)
    out = t.to_dense()
    assert bool(torch.isnan(out[1, 5])) and out[2, 7] == float("inf") and out[3, 9] == 0
    rows, cols, vals = t.entries()
    hit = (rows == 1) & (cols == 5)
    assert int(hit.sum()) == 1 and bool(torch.isnan(vals[hit]).all())


def test_nan_in_overflowing_tile_is_kept() -> None:
    act = make_act(2, 32, 1.0, torch.bfloat16, seed=9)
    act[0, 20] = float("nan")
    t = check_round_trip(act, tile=32, capacity=1)
    assert t.n_overflow() == 2


def test_nan_policy_raise() -> None:
    act = make_act(3, 20, 0.5, torch.float32)
    act[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        pack_twell(act, tile=8, capacity=2, nan_policy="raise")
    finite = make_act(3, 20, 0.5, torch.float32)
    check_round_trip(finite, tile=8, capacity=2, nan_policy="raise")


def test_bad_nan_policy() -> None:
    with pytest.raises(ValueError, match="nan_policy"):
        pack_twell(make_act(2, 8, 0.5, torch.float32), tile=8, capacity=2, nan_policy="ignore")


# ---------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "act,kw,exc,needle",
    [
        ([[1.0, 2.0]], {}, TypeError, "act"),
        (torch.ones(5), {}, ValueError, "act"),
        (torch.ones(2, 3, 4), {}, ValueError, "act"),
        (torch.ones(2, 3, dtype=torch.int64), {}, TypeError, "act"),
        (torch.ones(2, 3, dtype=torch.bool), {}, TypeError, "act"),
        (torch.ones(2, 3), {"tile": 0}, ValueError, "tile"),
        (torch.ones(2, 3), {"tile": -4}, ValueError, "tile"),
        (torch.ones(2, 3), {"tile": 32769}, ValueError, "tile"),
        (torch.ones(2, 3), {"tile": 8.0}, TypeError, "tile"),
        (torch.ones(2, 3), {"tile": True}, TypeError, "tile"),
        (torch.ones(2, 3), {"tile": 8, "capacity": 9}, ValueError, "capacity"),
        (torch.ones(2, 3), {"tile": 8, "capacity": 0}, ValueError, "capacity"),
        (torch.ones(2, 3), {"tile": 8, "capacity": 2.5}, TypeError, "capacity"),
    ],
)
def test_bad_inputs(act: object, kw: dict, exc: type[Exception], needle: str) -> None:
    with pytest.raises(exc, match=needle):
        pack_twell(act, **kw)  # type: ignore[arg-type]


def test_max_tile_accepted() -> None:
    act = make_act(2, 40000, 0.01, torch.float16, seed=10)
    t = check_round_trip(act, tile=32768, capacity=64)
    assert t.n_tiles == 2


def test_unpack_rejects_non_container() -> None:
    with pytest.raises(TypeError, match="TwellTensor"):
        unpack_twell(torch.zeros(2, 2))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- validate
@pytest.fixture
def packed() -> TwellTensor:
    """A container with live slots, padded slots and overflowing row-tiles."""
    act = make_act(6, 100, 0.3, torch.float32, seed=11)
    act[0, :32] = 1.0  # row 0, tile 0 overflows
    t = pack_twell(act, tile=32, capacity=4).validate()
    assert t.n_overflow() > 0 and bool((t.counts < 4).any())
    return t


def _live_slot(t: TwellTensor) -> tuple[int, int, int]:
    live = (torch.arange(t.capacity).view(1, 1, -1) < t.counts.unsqueeze(-1)).nonzero()
    r, tt, s = live[0].tolist()
    return r, tt, s


def _corrupt(t: TwellTensor, field: str, fn) -> TwellTensor:  # noqa: ANN001
    value = getattr(t, field).clone()
    fn(value)
    return dataclasses.replace(t, **{field: value})


def test_validate_index_out_of_range(packed: TwellTensor) -> None:
    r, tt, s = _live_slot(packed)
    bad = _corrupt(packed, "indices", lambda x: x.__setitem__((r, tt, s), packed.tile))
    with pytest.raises(ValueError, match="indices"):
        bad.validate()
    bad = _corrupt(packed, "indices", lambda x: x.__setitem__((r, tt, s), -1))
    with pytest.raises(ValueError, match="indices"):
        bad.validate()


def test_validate_wrong_dtypes(packed: TwellTensor) -> None:
    with pytest.raises(TypeError, match="indices"):
        dataclasses.replace(packed, indices=packed.indices.to(torch.int32)).validate()
    with pytest.raises(TypeError, match="counts"):
        dataclasses.replace(packed, counts=packed.counts.long()).validate()
    with pytest.raises(TypeError, match="values"):
        dataclasses.replace(packed, values=packed.values.to(torch.int32)).validate()
    assert packed.spill_values is not None
    with pytest.raises(TypeError, match="spill_values"):
        dataclasses.replace(packed, spill_values=packed.spill_values.double()).validate()
    with pytest.raises(TypeError, match="spill_slot"):
        dataclasses.replace(packed, spill_slot=packed.spill_slot.long()).validate()


def test_validate_wrong_shapes(packed: TwellTensor) -> None:
    with pytest.raises(ValueError, match="indices"):
        dataclasses.replace(packed, indices=packed.indices[:, :, :2].contiguous()).validate()
    with pytest.raises(ValueError, match="counts"):
        dataclasses.replace(packed, counts=packed.counts[:-1]).validate()
    with pytest.raises(ValueError, match="spill_slot"):
        dataclasses.replace(packed, spill_slot=packed.spill_slot[:, :1]).validate()
    assert packed.spill_values is not None
    with pytest.raises(ValueError, match="spill_values"):
        dataclasses.replace(packed, spill_values=packed.spill_values[:, :5]).validate()
    with pytest.raises(ValueError, match="values"):
        dataclasses.replace(packed, values=packed.values[0]).validate()
    with pytest.raises(ValueError, match="tiles"):
        dataclasses.replace(packed, n_cols=200).validate()
    with pytest.raises(ValueError, match="tile"):
        dataclasses.replace(packed, tile=40000).validate()


def test_validate_counts_out_of_range(packed: TwellTensor) -> None:
    with pytest.raises(ValueError, match="counts"):
        _corrupt(packed, "counts", lambda x: x.__setitem__((1, 1), -1)).validate()
    with pytest.raises(ValueError, match="counts"):
        _corrupt(packed, "counts", lambda x: x.__setitem__((1, 1), packed.tile + 1)).validate()


def test_validate_overflow_without_spill_or_source(packed: TwellTensor) -> None:
    bad = dataclasses.replace(packed, spill_values=None)
    with pytest.raises(ValueError, match="neither"):
        bad.validate()
    with pytest.raises(ValueError, match="neither"):
        bad.to_dense()
    with pytest.raises(ValueError, match="neither"):
        bad.entries()


def test_validate_spill_slot_out_of_range(packed: TwellTensor) -> None:
    """A -1 slot on an overflowing row-tile would silently read the last spilled row."""
    r, tt = packed.overflow_tiles()[0].tolist()
    with pytest.raises(ValueError, match="spill_slot"):
        _corrupt(packed, "spill_slot", lambda x: x.__setitem__((r, tt), -1)).validate()
    assert packed.spill_values is not None
    n_spill = packed.spill_values.shape[0]
    with pytest.raises(ValueError, match="spill_slot"):
        _corrupt(packed, "spill_slot", lambda x: x.__setitem__((r, tt), n_spill)).validate()


def test_validate_accepts_garbage_in_padded_slots(packed: TwellTensor) -> None:
    """Readers mask by count, so padded slots may hold anything (the gate kernel leaves them unwritten)."""
    live = torch.arange(packed.capacity).view(1, 1, -1) < packed.counts.unsqueeze(-1)
    vals = torch.where(live, packed.values, torch.full_like(packed.values, 7.0))
    idx = torch.where(live, packed.indices, torch.full_like(packed.indices, 31))
    t = dataclasses.replace(packed, values=vals, indices=idx).validate()
    assert torch.equal(t.to_dense(), packed.to_dense())
    for a, b in zip(t.entries(), packed.entries(), strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------- recompute variant
@pytest.mark.parametrize("dtype", DTYPES)
def test_recompute_variant(dtype: torch.dtype) -> None:
    """Overflowing row-tiles recomputed from (x, w_gate) instead of read from a spill area.

    Small integer inputs make every float32 dot product exact, so the recomputation (einsum in
    float32, one rounding to ``dtype``) is bit-identical to the dense reference whatever the
    summation order.
    """
    gen = torch.Generator().manual_seed(12)
    m, f, d = 9, 150, 16
    x = torch.randint(-2, 3, (m, d), generator=gen).to(dtype)
    w_gate = torch.randint(-2, 3, (f, d), generator=gen).to(dtype)
    ref = torch.relu(x.float() @ w_gate.float().T).to(dtype)
    spilled = pack_twell(ref, tile=32, capacity=4)
    assert spilled.n_overflow() > 0
    t = dataclasses.replace(spilled, spill_values=None, spill_slot=None, source=(x, w_gate)).validate()
    assert_bitwise_equal(t.to_dense(), ref)
    rows, cols, vals = t.entries()
    rr, cc, vv = dense_entries(ref)
    assert torch.equal(rows, rr) and torch.equal(cols, cc)
    assert_bitwise_equal(vals, vv)
