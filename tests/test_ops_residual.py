"""The FFN's output with the decoder layer's residual added by the FFN itself (``residual=``): the hot/cold op's
TwELL gather adds it as it writes each row, every other path after; always the bits of ``residual + FFN(x)``.

Kernels run in Triton's interpreter on the CPU (natively on a GPU); inputs are exact-grid values from
test_ops_kernels.make_problem.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_bitwise_equal, row_kernel_args
from test_ops_hot_cold import CASES, _plan, _run
from test_ops_hot_cold_dense_rows import _problem_with_dense_rows
from test_ops_kernels import make_problem

import twell.ops as ops
from twell.ops import hot_cold
from twell.ops.twell_ffn_kernel import launch_twell_ffn


def _residual(m: int, d: int, dtype: torch.dtype, device, seed: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, d, generator=gen) * 4).to(dtype=dtype, device=device)


@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-t{c[3]}-h{c[6]}" for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_hot_cold_op_adds_the_residual_bit_for_bit(case, dtype, backend, device):
    """Overflowing cold tiles, no hot unit, every unit hot, partial tiles: the sum of the op without it."""
    m, d, f, tile, cap, frac, n_hot = case
    p = make_problem(m, d, f, frac_pos=frac, seed=11 + n_hot, dtype=dtype, device=device)
    plan = _plan(p, n_hot)
    res = _residual(m, d, dtype, device)
    base, counts = _run(p, plan, backend, tile=tile, capacity=cap)
    out, counts_r = _run(p, plan, backend, tile=tile, capacity=cap, residual=res)
    assert_bitwise_equal(out, res + base)
    assert torch.equal(counts_r, counts)


@pytest.mark.parametrize("budget", [0, 2, 64])
def test_residual_with_dense_rows(budget, device):
    """Rows taken by the dense-row pass get the residual too (and so do rows past the budget)."""
    m, d, f, tile, cap, n_hot = 9, 32, 128, 16, 2, 16
    p = _problem_with_dense_rows(m, d, f, [0, 4, 8], torch.bfloat16, device)
    plan = _plan(p, n_hot)
    res = _residual(m, d, torch.bfloat16, device)
    base, _ = _run(p, plan, "triton", tile=tile, capacity=cap, dense_rows=budget)
    out, _ = _run(p, plan, "triton", tile=tile, capacity=cap, dense_rows=budget, residual=res)
    assert_bitwise_equal(out, res + base)


def test_residual_with_the_bitmap_and_unfused(device, monkeypatch):
    """The bitmap cold format and FUSE_RESIDUAL off add it after the gather: same bits as the fused add."""
    m, d, f, tile, cap, frac, n_hot = 7, 32, 160, 32, 2, 0.45, 32
    p = make_problem(m, d, f, frac_pos=frac, seed=5, dtype=torch.bfloat16, device=device)
    plan = _plan(p, n_hot)
    res = _residual(m, d, torch.bfloat16, device)
    fused, _ = _run(p, plan, "triton", tile=tile, capacity=cap, residual=res)
    bitmap, _ = _run(p, plan, "triton", tile=tile, capacity=cap, residual=res, cold_format="bitmap")
    base, _ = _run(p, plan, "triton", tile=tile, capacity=cap, cold_format="bitmap")
    assert_bitwise_equal(bitmap, res + base)
    monkeypatch.setattr(hot_cold, "FUSE_RESIDUAL", False)
    after, _ = _run(p, plan, "triton", tile=tile, capacity=cap, residual=res)
    assert_bitwise_equal(after, fused)


def test_residual_zero_tokens(device):
    p = make_problem(3, 16, 64, frac_pos=0.2, seed=1, dtype=torch.float32, device=device)
    plan = _plan(p, 16)
    empty = {**p, "x": p["x"][:0]}
    out = ops.hot_cold_gated_ffn(empty["x"], p["w_gate"], p["w_up"], p["w_down"], plan, tile=16,
                                 residual=torch.zeros(0, 16, device=device))
    assert out.shape == (0, 16)


def test_residual_checked(device):
    p = make_problem(4, 16, 64, frac_pos=0.2, seed=3, dtype=torch.float32, device=device)
    plan = _plan(p, 16)
    with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
        _run(p, plan, "triton", tile=16, residual=[0.0])
    with pytest.raises(ValueError, match=r"residual has shape \(4, 8\) but x has \(4, 16\)"):
        _run(p, plan, "triton", tile=16, residual=torch.zeros(4, 8, device=device))
    with pytest.raises(ValueError, match=r"residual has shape \(16,\)"):
        _run(p, plan, "triton", tile=16, residual=torch.zeros(16, device=device))  # no broadcasting
    with pytest.raises(TypeError, match="residual has dtype float16 but x has float32"):
        _run(p, plan, "torch", tile=16, residual=torch.zeros(4, 16, dtype=torch.float16, device=device))
    if device.type == "cuda":
        with pytest.raises(ValueError, match="residual is on cpu"):
            _run(p, plan, "triton", tile=16, residual=torch.zeros(4, 16))


def test_row_kernel_residual_refusals(device):
    p = make_problem(4, 16, 32, frac_pos=0.3, seed=1, dtype=torch.float32, device=device)
    args = row_kernel_args(p, 16, 4)
    out = torch.empty(4, 16, device=device)
    kw = dict(n_cols=32, tile=16, round_hidden=True, out=out)
    res = torch.zeros(4, 16, device=device)
    with pytest.raises(ValueError, match="`residual` does not combine with `taken`"):
        launch_twell_ffn(*args, **kw, residual=res, taken=torch.zeros(4, dtype=torch.int8, device=device))
    with pytest.raises(ValueError, match="`residual` does not combine"):
        launch_twell_ffn(*args, **kw, residual=res, tensor_cores=True)
    with pytest.raises(ValueError, match=r"residual must be \[4, 16\] torch.float32"):
        launch_twell_ffn(*args, **kw, residual=torch.zeros(4, 16, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="unit stride along d"):
        launch_twell_ffn(*args, **kw, residual=torch.zeros(16, 4, device=device).t())


def test_row_kernel_residual_direct(device):
    """The plain TwELL op's row kernel with a residual: round(round(ffn) + residual), rows strided."""
    m, d, f = 6, 16, 64
    p = make_problem(m, d, f, frac_pos=0.2, seed=4, dtype=torch.bfloat16, device=device)
    args = row_kernel_args(p, 16, 4)
    kw = dict(n_cols=f, tile=16, round_hidden=True)
    base = launch_twell_ffn(*args, **kw, out=torch.empty(m, d, dtype=torch.bfloat16, device=device))
    wide = _residual(m, 2 * d, torch.bfloat16, device)
    res = wide[:, :d]  # a row stride of 2d
    out = launch_twell_ffn(*args, **kw, out=torch.empty(m, d, dtype=torch.bfloat16, device=device), residual=res)
    assert_bitwise_equal(out, res + base)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 777, 16384])
def test_gpu_bf16_residual_real_shape(m):
    """2048 x 5632 in bf16 at 0.5 % density with the fused gate: the residual fused into the gather gives the
    bits of ``residual + op(x)``."""
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(2)
    p = synthetic_ffn_problem(m, 2048, 5632, SparsityProfile(mean_l0=28.0), generator=gen, device=dev)
    p = {k: p[k] for k in ("x", "w_gate", "w_up", "w_down")}
    freq = ops.unit_frequency(p["x"], p["w_gate"])
    hot = torch.argsort(freq, descending=True, stable=True)[:256]
    plan = ops.build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"], hot, fused_tile=128)
    res = torch.randn(m, 2048, device=dev, dtype=torch.bfloat16)
    base = ops.hot_cold_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], plan, tile=128, dense_rows=64)
    out = ops.hot_cold_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], plan, tile=128, dense_rows=64,
                                 residual=res)
    assert_bitwise_equal(out, res + base)
