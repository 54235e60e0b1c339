"""Tests of the synthetic sparse-activation generators (twell.synthetic).

Sizes are CPU-friendly (M = 4096 tokens, F = 1024..5632 units) and every random draw is seeded, so
the statistical tolerances below are several standard errors wide but the tests are deterministic.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twell.synthetic import (
    SparsityProfile,
    layer_profiles,
    measure_sparsity,
    position_scale,
    synthetic_ffn_problem,
    synthetic_gate_logits,
    unit_frequencies,
)
from twell.tolerances import (
    ABS_TOL_WATER_FILL_CAP_ANY_PROFILE,
    FP32_ELEMENT_TOL,
    FP64_CLOSED_FORM_TOL,
    REL_TOL_FP64_SCALED_SUM,
    REL_TOL_SAMPLED_STD,
    REL_TOL_UNION64_SAMPLE,
    REL_TOL_WATER_FILL_ANY_PROFILE,
)

M = 4096


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ffn_gate(problem: dict[str, torch.Tensor]) -> torch.Tensor:
    """The real gate activation, computed in float32 from the (possibly bf16) tensors."""
    return torch.relu(problem["x"].float() @ problem["w_gate"].float().T)


# --------------------------------------------------------------------------- unit frequencies


@pytest.mark.parametrize(("mean_l0", "n_units"), [(5.0, 1024), (29.0, 5632), (100.0, 1024)])
def test_unit_frequencies_sum_dead_cap(mean_l0: float, n_units: int) -> None:
    prof = SparsityProfile(mean_l0)
    p = unit_frequencies(n_units, prof, generator=gen())
    assert p.shape == (n_units,) and p.dtype == torch.float64
    assert math.isclose(float(p.sum()), mean_l0, rel_tol=REL_TOL_FP64_SCALED_SUM)
    assert int((p == 0).sum()) == round(0.3 * n_units)
    assert float(p.max()) <= prof.max_probability + FP64_CLOSED_FORM_TOL
    assert float(p.min()) >= 0.0


def test_unit_frequencies_water_fill_when_cap_binds() -> None:
    # 70 live units, cap 0.9 -> at most 63; asking 60 clips most of them but the sum must still hold
    prof = SparsityProfile(60.0, tail_exponent=2.0, early_boost=1.0)
    p = unit_frequencies(100, prof, generator=gen())
    assert math.isclose(float(p.sum()), 60.0, rel_tol=REL_TOL_FP64_SCALED_SUM)
    assert float(p.max()) <= 0.9 + FP64_CLOSED_FORM_TOL
    assert int((p >= 0.9 - FP64_CLOSED_FORM_TOL).sum()) > 10


def test_unit_frequencies_heavy_tail_ordering() -> None:
    p = unit_frequencies(2000, SparsityProfile(20.0), generator=gen())
    s = torch.sort(p, descending=True).values
    assert float(s[:200].sum()) / 20.0 > 0.5  # Zipf(1): top 10 % of units carry most of the mass
    assert torch.all(s[:-1] >= s[1:])


@settings(max_examples=30, deadline=None)
@given(
    n_units=st.integers(10, 3000),
    frac=st.floats(0.001, 0.8),
    dead=st.floats(0.0, 0.9),
    tail=st.floats(0.0, 3.0),
)
def test_unit_frequencies_property(n_units: int, frac: float, dead: float, tail: float) -> None:
    n_alive = n_units - round(dead * n_units)
    mean_l0 = frac * 0.9 * n_alive
    if mean_l0 <= 0:
        return
    p = unit_frequencies(n_units, SparsityProfile(mean_l0, dead_fraction=dead, tail_exponent=tail, early_boost=1.0))
    assert math.isclose(float(p.sum()), mean_l0, rel_tol=REL_TOL_WATER_FILL_ANY_PROFILE)
    assert float(p.max()) <= 0.9 + ABS_TOL_WATER_FILL_CAP_ANY_PROFILE
    assert int((p == 0).sum()) == n_units - n_alive


def test_unit_frequencies_unreachable() -> None:
    with pytest.raises(ValueError, match="mean_l0.*unreachable"):
        unit_frequencies(100, SparsityProfile(64.0))  # 70 alive * 0.9 = 63 < 64


# --------------------------------------------------------------------------- position scale


def test_position_scale_mean_and_shape() -> None:
    prof = SparsityProfile(29.0, seq_len=2048, early_boost=4.0, early_decay=32.0)
    s = position_scale(2 * 2048, prof)
    assert s.shape == (4096,)
    assert math.isclose(float(s[:2048].mean()), 1.0, rel_tol=FP64_CLOSED_FORM_TOL)
    assert math.isclose(float(s[0]), 4.0, rel_tol=FP64_CLOSED_FORM_TOL)
    assert torch.equal(s[:2048], s[2048:])
    assert torch.all(s[:2047] >= s[1:2048])
    assert float(s[2047]) > 0.9  # the floor only drops a little to pay for the boosted head
    assert torch.equal(position_scale(10, SparsityProfile(5.0, early_boost=1.0)), torch.ones(10, dtype=torch.float64))


# --------------------------------------------------------------------------- gate logits


@pytest.mark.parametrize(("mean_l0", "n_units"), [(5.0, 1024), (28.0, 5632), (100.0, 1024)])
def test_gate_logits_profile(mean_l0: float, n_units: int) -> None:
    z = synthetic_gate_logits(M, n_units, SparsityProfile(mean_l0), generator=gen(1))
    assert z.shape == (M, n_units) and z.dtype == torch.float32
    stats = measure_sparsity(torch.relu(z), seq_len=2048)
    assert abs(stats["l0_mean"] / mean_l0 - 1) < 0.10
    assert 0.28 <= stats["dead_fraction"] <= 0.33
    assert stats["top10_share"] > 0.30
    assert stats["l0_max_over_mean"] > 3.0


def test_gate_logits_early_positions_denser() -> None:
    # 16 sequences of 256 -> 128 "first 8" tokens; no token correlation so per-token noise is small
    prof = SparsityProfile(20.0, seq_len=256, early_boost=4.0, early_decay=8.0, token_correlation=0.0)
    stats = measure_sparsity(torch.relu(synthetic_gate_logits(M, 1024, prof, generator=gen(2))), seq_len=256)
    # expected ratio: mean of s over positions 0..7 (~2.7) / mean over the rest (~0.93) ~ 2.9
    assert stats["early_ratio"] > 2.0
    assert abs(stats["l0_mean"] / 20.0 - 1) < 0.05


def test_gate_logits_values() -> None:
    z = synthetic_gate_logits(512, 256, SparsityProfile(10.0), generator=gen(3), dtype=torch.bfloat16)
    assert z.dtype == torch.bfloat16
    assert bool(torch.isfinite(z).all())
    pos = z[z > 0].float()
    neg = z[z <= 0].float()
    assert pos.numel() > 0
    assert 0.5 < float(pos.mean()) < 1.1  # |N(0,1)| has mean 0.80
    assert 0.5 < float(-neg.mean()) < 1.1


def test_token_correlation_spreads_token_l0() -> None:
    def max_over_mean(rho: float) -> float:
        prof = SparsityProfile(10.0, seq_len=M, early_boost=1.0, token_correlation=rho)
        return measure_sparsity(torch.relu(synthetic_gate_logits(M, 2048, prof, generator=gen(4))))["l0_max_over_mean"]

    assert max_over_mean(0.3) > 2 * max_over_mean(0.0)


# --------------------------------------------------------------------------- FFN problem


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("mean_l0", "n_units"), [(5.0, 1024), (28.0, 2048), (100.0, 1024)])
def test_ffn_problem_real_gate_has_profile(dtype: torch.dtype, mean_l0: float, n_units: int) -> None:
    d = 128
    prob = synthetic_ffn_problem(M, d, n_units, SparsityProfile(mean_l0), generator=gen(5), dtype=dtype)
    assert prob["x"].shape == (M, d) and prob["w_gate"].shape == (n_units, d)
    assert prob["w_up"].shape == (n_units, d) and prob["w_down"].shape == (d, n_units)
    assert all(t.dtype == dtype for t in prob.values())
    stats = measure_sparsity(ffn_gate(prob), seq_len=2048)
    assert abs(stats["l0_mean"] / mean_l0 - 1) < 0.15
    assert 0.28 <= stats["dead_fraction"] <= 0.33
    assert stats["top10_share"] > 0.30


def test_ffn_problem_early_positions_denser() -> None:
    prof = SparsityProfile(20.0, seq_len=256, early_boost=4.0, early_decay=8.0, token_correlation=0.0)
    prob = synthetic_ffn_problem(M, 256, 1024, prof, generator=gen(6), dtype=torch.float32)
    stats = measure_sparsity(ffn_gate(prob), seq_len=256)
    assert stats["early_ratio"] > 2.0


@pytest.mark.parametrize("d_model", [2, 3])
def test_ffn_problem_tiny_d_model(d_model: int) -> None:
    # one random feature only: units are fully correlated, so per-token l0 is all-or-nothing-ish and
    # the sample mean is noisy; use twice the tokens and a looser bound
    prob = synthetic_ffn_problem(2 * M, d_model, 1024, SparsityProfile(20.0), generator=gen(7), dtype=torch.float32)
    stats = measure_sparsity(ffn_gate(prob))
    assert abs(stats["l0_mean"] / 20.0 - 1) < 0.25
    assert stats["dead_fraction"] >= 0.299


def test_ffn_problem_weight_scales() -> None:
    d, f = 256, 1024
    prob = synthetic_ffn_problem(256, d, f, SparsityProfile(10.0), generator=gen(8), dtype=torch.float32)
    assert math.isclose(float(prob["w_up"].std()), 1 / math.sqrt(d), rel_tol=REL_TOL_SAMPLED_STD)
    assert math.isclose(float(prob["w_down"].std()), 1 / math.sqrt(f), rel_tol=REL_TOL_SAMPLED_STD)
    row_norm = prob["w_gate"][:, 2:].norm(dim=1)
    assert torch.allclose(row_norm, torch.ones_like(row_norm), atol=FP32_ELEMENT_TOL)


# --------------------------------------------------------------------------- reproducibility


def test_reproducible_with_seeded_generator() -> None:
    prof = SparsityProfile(12.0)
    assert torch.equal(unit_frequencies(777, prof, generator=gen(9)), unit_frequencies(777, prof, generator=gen(9)))
    a = synthetic_gate_logits(300, 500, prof, generator=gen(9))
    b = synthetic_gate_logits(300, 500, prof, generator=gen(9))
    c = synthetic_gate_logits(300, 500, prof, generator=gen(10))
    assert torch.equal(a, b) and not torch.equal(a, c)
    p1 = synthetic_ffn_problem(300, 64, 500, prof, generator=gen(9))
    p2 = synthetic_ffn_problem(300, 64, 500, prof, generator=gen(9))
    p3 = synthetic_ffn_problem(300, 64, 500, prof, generator=gen(10))
    assert all(torch.equal(p1[k], p2[k]) for k in p1)
    assert not torch.equal(p1["w_gate"], p3["w_gate"])


# --------------------------------------------------------------------------- layer profiles


def test_layer_profiles_mean_and_peak() -> None:
    profs = layer_profiles(24, 29.0, dead_fraction=0.35, seq_len=1024)
    l0 = torch.tensor([p.mean_l0 for p in profs], dtype=torch.float64)  # the profiles hold Python floats
    assert len(profs) == 24
    assert math.isclose(float(l0.mean()), 29.0, rel_tol=REL_TOL_FP64_SCALED_SUM)
    peak = int(l0.argmax())
    assert 5 <= peak <= 10  # around 1/3 of the depth
    assert float(l0[peak]) > 1.5 * float(l0[0]) and float(l0[peak]) > 2 * float(l0[-1])
    assert all(p.dead_fraction == 0.35 and p.seq_len == 1024 for p in profs)
    assert layer_profiles(1, 7.0)[0].mean_l0 == pytest.approx(7.0)


def test_layer_profiles_bad_inputs() -> None:
    with pytest.raises(ValueError, match="n_layers"):
        layer_profiles(0, 10.0)
    with pytest.raises(ValueError, match="mean_l0"):
        layer_profiles(4, -1.0)
    with pytest.raises(ValueError, match="peak_depth"):
        layer_profiles(4, 10.0, peak_depth=1.5)
    with pytest.raises(TypeError, match="unexpected keyword"):
        layer_profiles(4, 10.0, not_a_field=1)


# --------------------------------------------------------------------------- measure_sparsity


def test_measure_sparsity_known_values() -> None:
    act = torch.zeros(20, 10)
    act[:, 0] = 1.0  # unit 0 fires on every token
    act[0, 1:5] = 2.0  # token 0 has 5 active units
    act[10, 1] = float("nan")  # NaN counts as active
    stats = measure_sparsity(act, seq_len=10)
    assert stats["l0_mean"] == pytest.approx((20 + 4 + 1) / 20)
    assert stats["l0_max"] == 5.0
    assert stats["dead_fraction"] == pytest.approx(0.5)
    assert stats["top10_share"] == pytest.approx(20 / 25)  # top ceil(1) unit
    assert stats["l0_first8"] == pytest.approx((5 + 2 + 14) / 16)
    assert stats["l0_rest"] == pytest.approx(1.0)
    assert "early_ratio" not in measure_sparsity(act)


def test_measure_sparsity_bad_inputs() -> None:
    with pytest.raises(TypeError, match="act"):
        measure_sparsity([[1.0]])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="act"):
        measure_sparsity(torch.ones(5))
    with pytest.raises(ValueError, match="seq_len"):
        measure_sparsity(torch.ones(4, 4), seq_len=0)


# --------------------------------------------------------------------------- input validation


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        (dict(mean_l0=-1.0), ValueError, "mean_l0"),
        (dict(mean_l0=0.0), ValueError, "mean_l0"),
        (dict(mean_l0="5"), TypeError, "mean_l0"),
        (dict(mean_l0=float("nan")), ValueError, "mean_l0"),
        (dict(mean_l0=5.0, dead_fraction=1.0), ValueError, "dead_fraction"),
        (dict(mean_l0=5.0, dead_fraction=-0.1), ValueError, "dead_fraction"),
        (dict(mean_l0=5.0, tail_exponent=-0.5), ValueError, "tail_exponent"),
        (dict(mean_l0=5.0, seq_len=0), ValueError, "seq_len"),
        (dict(mean_l0=5.0, seq_len=2.5), TypeError, "seq_len"),
        (dict(mean_l0=5.0, early_boost=0.5), ValueError, "early_boost"),
        (dict(mean_l0=5.0, early_decay=0.0), ValueError, "early_decay"),
        (dict(mean_l0=5.0, seq_len=64, early_boost=4.0, early_decay=32.0), ValueError, "early_boost"),
        (dict(mean_l0=5.0, max_probability=0.0), ValueError, "max_probability"),
        (dict(mean_l0=5.0, max_probability=1.5), ValueError, "max_probability"),
        (dict(mean_l0=5.0, token_correlation=1.0), ValueError, "token_correlation"),
    ],
)
def test_profile_validation(kwargs: dict, exc: type[Exception], name: str) -> None:
    with pytest.raises(exc, match=name):
        SparsityProfile(**kwargs)


def test_function_validation() -> None:
    prof = SparsityProfile(5.0)
    with pytest.raises(ValueError, match="n_tokens"):
        synthetic_gate_logits(0, 100, prof)
    with pytest.raises(ValueError, match="n_units"):
        synthetic_gate_logits(10, -3, prof)
    with pytest.raises(TypeError, match="n_units"):
        unit_frequencies(10.0, prof)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dtype"):
        synthetic_gate_logits(10, 100, prof, dtype=torch.int32)
    with pytest.raises(TypeError, match="profile"):
        synthetic_gate_logits(10, 100, 5.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="generator"):
        synthetic_gate_logits(10, 100, prof, generator=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="d_model"):
        synthetic_ffn_problem(10, 1, 100, prof)
    with pytest.raises(ValueError, match="n_tokens"):
        position_scale(0, prof)
    # the boosted first position would need more units than are alive
    with pytest.raises(ValueError, match="early_boost"):
        synthetic_gate_logits(10, 100, SparsityProfile(20.0))
    with pytest.raises(ValueError, match="mean_l0.*unreachable"):
        synthetic_ffn_problem(10, 8, 100, SparsityProfile(64.0))


def test_measure_sparsity_token_overlap() -> None:
    """``union64``: blocks whose tokens repeat one active set union to that set's size; independent tokens
    union to about what the unit frequencies predict (ratio ~1); short sequences report no union."""
    n_seq, seq_len, n_units = 4, 128, 512
    g = gen(7)
    rows = (torch.rand(n_seq * seq_len // 64, 1, n_units, generator=g) < 0.02).float()
    shared = rows.expand(-1, 64, -1).reshape(n_seq * seq_len, n_units)  # every block repeats one row
    stats = measure_sparsity(shared, seq_len=seq_len)
    assert stats["union64"] == pytest.approx(stats["l0_mean"])
    assert stats["union64_vs_independent"] < 0.5
    independent = (torch.rand(n_seq * seq_len * 8, n_units, generator=g) < 0.02).float()
    stats = measure_sparsity(independent, seq_len=seq_len)
    assert stats["union64_vs_independent"] == pytest.approx(1.0, abs=REL_TOL_UNION64_SAMPLE)
    assert stats["union64_independent"] == pytest.approx(n_units * (1 - 0.98 ** 64), rel=REL_TOL_UNION64_SAMPLE)
    assert "union64" not in measure_sparsity(independent, seq_len=32)
