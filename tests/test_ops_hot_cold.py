"""The hot/cold split (twell.ops.hot_cold*): Triton path against the reference, plan building, bad inputs.

Inputs come from test_ops_kernels.make_problem (exact-grid values): gates are exact, so counts must
equal the reference's bit for bit and outputs agree within the dtype's tolerance.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_kernels import make_problem

import twell.ops as ops
from twell.ops.hot_cold_plan import HOT_MIN_FREQUENCY
from twell.reference import inference as ref
from twell.tolerances import REL_TOL, rel_error

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _plan(p: dict, n_hot: int) -> ops.HotColdPlan:
    freq = ops.unit_frequency(p["x"], p["w_gate"])
    hot = torch.argsort(freq, descending=True, stable=True)[:n_hot]
    return ops.build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"], hot)


def _run(p: dict, plan: ops.HotColdPlan, backend: str, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    return ops.hot_cold_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], plan, backend=backend,
                                  return_counts=True, **kw)


CASES = [
    # m, d, f, tile, capacity, frac_pos, n_hot
    (9, 32, 128, 32, 4, 0.08, 16),
    (5, 48, 200, 32, 4, 0.10, 24),  # partial tiles on both sides of the split, d not a multiple of 32
    (6, 32, 96, 16, 2, 0.40, 32),  # cold tiles overflow: dense recompute through the unit map
    (7, 32, 160, 32, 2, 0.45, 32),  # overflow of TwELL slots at tile 32; the bitmap has none
    (4, 16, 64, 16, 4, 0.20, 0),  # no hot unit: plain TwELL path with the identity map
    (3, 16, 64, 16, 4, 0.20, 64),  # every unit hot: no cold column at all
]


# the bitmap format takes tiles that are multiples of 32 (its refusal of others is tested below)
FORMAT_CASES = [(c, fmt) for c in CASES for fmt in ("bitmap", "twell") if fmt == "twell" or c[3] % 32 == 0]


@pytest.mark.parametrize(("case", "cold_format"), FORMAT_CASES,
                         ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-t{c[3]}-h{c[6]}-{fmt}" for c, fmt in FORMAT_CASES])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_reference(case, cold_format, dtype, device):
    m, d, f, tile, cap, frac, n_hot = case
    p = make_problem(m, d, f, frac_pos=frac, seed=11 + n_hot, dtype=dtype, device=device)
    plan = _plan(p, n_hot)
    out, counts = _run(p, plan, "triton", tile=tile, capacity=cap, cold_format=cold_format)
    ref_out, ref_counts = _run(p, plan, "torch", tile=tile, capacity=cap)
    assert torch.equal(counts.cpu(), ref_counts.cpu())
    g = p["x"].float() @ p["w_gate"].float().T
    assert torch.equal(counts.sum(1).cpu(), (g > 0).sum(1).to(torch.int32).cpu())
    assert rel_error(out, ref_out) <= REL_TOL[dtype]
    dense = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], precision="match")
    assert rel_error(out, dense) <= REL_TOL[dtype]


def test_empty_rows_zero_tokens_and_one_token(device):
    p = make_problem(6, 16, 64, frac_pos=0.2, seed=3, dtype=torch.float32, device=device)
    p["x"][2] = 0.0  # every gate 0 -> no active unit in row 2
    plan = _plan(p, 16)
    out, counts = _run(p, plan, "triton", tile=16)
    assert int(counts[2].sum()) == 0
    assert torch.equal(out[2].cpu(), torch.zeros(16))
    ref_out, _ = _run(p, plan, "torch", tile=16)
    assert rel_error(out, ref_out) <= REL_TOL[torch.float32]
    for m in (0, 1):
        q = {k: (v[:m] if k == "x" else v) for k, v in p.items()}
        o, c = _run(q, plan, "triton", tile=16)
        assert o.shape == (m, 16) and c.shape[0] == m
        assert torch.equal(c.cpu(), _run(q, plan, "torch", tile=16)[1].cpu())
    assert rel_error(o, _run(q, plan, "torch", tile=16)[0]) <= REL_TOL[torch.float32]  # the m=1 case


def test_nan_propagates_like_dense(device):
    p = make_problem(4, 16, 64, frac_pos=0.2, seed=4, dtype=torch.float32, device=device)
    plan = _plan(p, 16)
    p["x"][1, 3] = float("nan")
    out, _ = _run(p, plan, "triton", tile=16)
    assert torch.isnan(out[1]).all()
    assert not torch.isnan(out[[0, 2, 3]]).any()
    with pytest.raises(ValueError, match="NaN"):
        _run(p, plan, "triton", tile=16, nan_policy="raise")


def test_choose_hot_units_threshold_and_multiple():
    t = HOT_MIN_FREQUENCY  # the default threshold: a unit exactly at it is hot, one just below it is not
    freq = torch.tensor([0.5, t * 0.99, 2 * t, 1.1 * t, 0.3, 0.0, t, 0.9], dtype=torch.float64)  # t exact
    assert ops.choose_hot_units(freq, multiple=1).tolist() == [0, 2, 3, 4, 6, 7]
    assert ops.choose_hot_units(freq, min_frequency=t * 0.98, multiple=1).tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert ops.choose_hot_units(freq, multiple=4).tolist() == [0, 2, 4, 7]  # the 4 most frequent, in id order
    assert ops.choose_hot_units(freq, multiple=8).numel() == 0
    with pytest.raises(ValueError, match="multiple"):
        ops.choose_hot_units(freq, multiple=0)


def test_choose_hot_units_bounds_the_cold_pairs():
    freq = torch.tensor([0.3, 0.0, 0.9, 0.05, 0.5, 0.2, 0.0, 0.1], dtype=torch.float64)  # sum 2.05
    none_by_threshold = {"min_frequency": 1.0, "multiple": 1}
    assert ops.choose_hot_units(freq, **none_by_threshold, max_cold_l0=None).numel() == 0
    # cold pairs left after the 0, 1, 2, 3 most frequent units: 2.05, 1.15, 0.65, 0.35
    assert ops.choose_hot_units(freq, **none_by_threshold, max_cold_l0=0.4).tolist() == [0, 2, 4]
    assert ops.choose_hot_units(freq, **none_by_threshold, max_cold_l0=0.7).tolist() == [2, 4]
    assert ops.choose_hot_units(freq, **none_by_threshold, max_cold_l0=5.0).numel() == 0
    # the bound's count rounds up (it is a bound), the threshold's down; the larger one wins
    assert ops.choose_hot_units(freq, min_frequency=1.0, multiple=2, max_cold_l0=0.4).tolist() == [0, 2, 4, 5]
    assert ops.choose_hot_units(freq, min_frequency=0.1, multiple=1, max_cold_l0=0.4).tolist() == [0, 2, 4, 5, 7]
    # a bound of 0 makes every firing unit hot; rounding up stops at F
    assert ops.choose_hot_units(freq, **none_by_threshold, max_cold_l0=0.0).tolist() == [0, 2, 3, 4, 5, 7]
    assert ops.choose_hot_units(freq, min_frequency=1.0, multiple=4, max_cold_l0=0.0).numel() == 8
    assert ops.choose_hot_units(freq[:7], min_frequency=1.0, multiple=4, max_cold_l0=0.0).numel() == 4
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_cold_l0"):
            ops.choose_hot_units(freq, max_cold_l0=bad)


def test_unit_frequency_samples_evenly():
    x = torch.zeros(10000, 2)
    x[:, 0] = 1.0
    x[5000:, 1] = 1.0  # unit 1 fires on the second half only
    w = torch.tensor([[1.0, 0.0], [-0.5, 1.0]])
    freq = ops.unit_frequency(x, w, max_tokens=100)
    assert freq[0] == 1.0
    assert abs(float(freq[1]) - 0.5) <= 0.02
    assert ops.unit_frequency(x[:0], w).tolist() == [0.0, 0.0]


def test_plan_layout():
    p = make_problem(8, 16, 64, frac_pos=0.2, seed=6, dtype=torch.float32, device="cpu")
    hot = torch.tensor([40, 3, 17])
    plan = ops.build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"], hot)
    assert plan.hot.tolist() == [3, 17, 40] and plan.n_hot == 3 and plan.n_units == 64
    assert plan.cold.dtype == torch.int32 and plan.cold.numel() == 61 and 17 not in plan.cold.tolist()
    assert torch.equal(plan.w_gemm[:3], p["w_gate"][[3, 17, 40]])
    assert torch.equal(plan.w_gemm[3:64], p["w_gate"][plan.cold.long()])
    assert torch.equal(plan.w_gemm[64:], p["w_up"][[3, 17, 40]])
    assert torch.equal(plan.w_down_hot_t, p["w_down"][:, [3, 17, 40]].T)


def test_bad_inputs_are_refused(device):
    p = make_problem(4, 16, 64, frac_pos=0.2, seed=7, dtype=torch.float32, device=device)
    wg, wu, wd = p["w_gate"], p["w_up"], p["w_down"]
    with pytest.raises(ValueError, match="unique"):
        ops.build_hot_cold_plan(wg, wu, wd, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        ops.build_hot_cold_plan(wg, wu, wd, torch.tensor([64]))
    with pytest.raises(TypeError, match="hot"):
        ops.build_hot_cold_plan(wg, wu, wd, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="w_down"):
        ops.build_hot_cold_plan(wg, wu, wd.T, torch.tensor([1]))
    with pytest.raises(TypeError, match="HotColdPlan"):
        ops.hot_cold_gated_ffn(p["x"], wg, wu, wd, plan=None)
    other = make_problem(4, 16, 32, frac_pos=0.2, seed=7, dtype=torch.float32, device=device)
    small = ops.build_hot_cold_plan(other["w_gate"], other["w_up"], other["w_down"], torch.tensor([0]))
    with pytest.raises(ValueError, match="plan is for F=32"):
        ops.hot_cold_gated_ffn(p["x"], wg, wu, wd, small)
    plan = ops.build_hot_cold_plan(wg, wu, wd, torch.tensor([0]))
    with pytest.raises(ValueError, match="tile"):
        ops.hot_cold_gated_ffn(p["x"], wg, wu, wd, plan, tile=24, backend="triton")
    with pytest.raises(ValueError, match="multiple of 32"):
        ops.hot_cold_gated_ffn(p["x"], wg, wu, wd, plan, tile=16, backend="triton", cold_format="bitmap")
    with pytest.raises(ValueError, match="cold_format"):
        ops.hot_cold_gated_ffn(p["x"], wg, wu, wd, plan, backend="triton", cold_format="ell")
    with pytest.raises(TypeError, match="dtype|float"):
        ops.hot_cold_gated_ffn(p["x"].double(), wg.double(), wu.double(), wd.double(),
                               ops.build_hot_cold_plan(wg.double(), wu.double(), wd.double(), torch.tensor([0])),
                               backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("cold_format", ["bitmap", "twell"])
@pytest.mark.parametrize("shape", [(2048, 5632), (768, 2048), (4096, 14336)])
def test_gpu_bf16_realistic(shape, cold_format):
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    d, f = shape
    dev = torch.device("cuda")
    p = synthetic_ffn_problem(8192, d, f, SparsityProfile(mean_l0=0.005 * f), generator=torch.Generator(device=dev)
                              .manual_seed(0), device=dev)
    p = {"x": p["x"], "w_gate": p["w_gate"], "w_up": p["w_up"], "w_down": p["w_down"]}
    plan = ops.build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"],
                                   ops.choose_hot_units(ops.unit_frequency(p["x"], p["w_gate"])))
    assert plan.n_hot > 0
    out, counts = _run(p, plan, "triton", cold_format=cold_format)
    want = ref.dense_gated_ffn(p["x"].float(), p["w_gate"].float(), p["w_up"].float(), p["w_down"].float(),
                               precision="fp32")
    assert rel_error(out, want) <= REL_TOL[torch.bfloat16]
    g = torch.nn.functional.linear(p["x"], p["w_gate"])
    assert torch.equal(counts.sum(1), (g > 0).sum(1).to(torch.int32))
