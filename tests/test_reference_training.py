"""Sparse training reference (twell.reference.training) against dense autograd."""

from __future__ import annotations

import pytest
import torch
from _helpers import F64
from _helpers import make_inputs as make_ffn_inputs

from twell.reference import GatedFFNL1, dense_gated_ffn_l1, gated_ffn_l1
from twell.tolerances import GRADCHECK, REL_TOL, REL_TOL_GRAD, rel_error

DENSITIES = [0.0, 0.005, 0.05, 0.5, 1.0]


def make_inputs(m: int, d: int, f: int, density: float, seed: int, dtype: torch.dtype = F64) -> list[torch.Tensor]:
    """The shared exact-density problem (``_helpers.make_inputs``) as leaf tensors requiring grad."""
    return [t.requires_grad_() for t in make_ffn_inputs(m, d, f, density, seed, dtype)]


def run(fn, inputs, seed=0, l1_weight=0.37):
    """Forward ``fn``, backward a random linear loss on out plus ``l1_weight * l1``; return values and grads."""
    for t in inputs:
        t.grad = None
    out, l1, l0 = fn(*inputs)
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(out.shape, generator=gen, dtype=F64).to(out.dtype)
    loss = (out.to(l1.dtype) * r.to(l1.dtype)).sum() + l1_weight * l1
    loss.backward()
    return out.detach(), l1.detach(), l0, [t.grad for t in inputs]


@pytest.mark.parametrize("density", [0.3, 0.7])
def test_gradcheck(density):
    # Resample until every gate is at least 1e-2 from the ReLU kink, far beyond the finite-difference step.
    for seed in range(100):
        inputs = make_inputs(3, 4, 6, density, seed=seed)
        with torch.no_grad():
            g = inputs[0] @ inputs[1].T
        if float(g.abs().min()) > 1e-2:
            break
    else:
        pytest.fail("no input set with gates away from 0")
    assert torch.autograd.gradcheck(GatedFFNL1.apply, tuple(inputs), **GRADCHECK)
    assert torch.autograd.gradcheck(lambda *a: GatedFFNL1.apply(*a)[1], tuple(inputs),
                                    eps=GRADCHECK["eps"], atol=GRADCHECK["atol"])  # rtol: gradcheck's default


@pytest.mark.parametrize("density", DENSITIES)
def test_matches_dense_autograd_float64(density):
    inputs = make_inputs(32, 16, 128, density, seed=1)
    out, l1, l0, grads = run(gated_ffn_l1, inputs)
    d_out, d_l1, d_l0, d_grads = run(dense_gated_ffn_l1, inputs)
    assert int(round(float(l0) * 32)) == round(density * 32 * 128)
    assert float(l0) == float(d_l0)
    assert rel_error(out, d_out) < REL_TOL[F64]
    assert rel_error(l1, d_l1) < REL_TOL[F64]
    for name, g, dg in zip(("x", "w_gate", "w_up", "w_down"), grads, d_grads, strict=True):
        assert g.dtype == F64 and g.shape == dg.shape, name
        assert rel_error(g, dg) < REL_TOL_GRAD[F64], name
    if density == 0.0:
        assert torch.equal(out, torch.zeros_like(out)) and float(l1) == 0.0
        for g in grads:
            assert torch.equal(g, torch.zeros_like(g))


def test_matches_plain_pytorch_ffn():
    x, wg, wu, wd = make_inputs(8, 16, 64, 0.4, seed=2)
    out, l1, l0 = gated_ffn_l1(x, wg, wu, wd)
    h = torch.relu(x @ wg.T) * (x @ wu.T)
    assert rel_error(out, h @ wd.T) < REL_TOL[F64]
    assert rel_error(l1, h.abs().sum(dim=1).mean()) < REL_TOL[F64]
    assert float(l0) == float((h != 0).sum(dim=1).double().mean())
    assert not l0.requires_grad and l1.requires_grad and out.requires_grad


@pytest.mark.parametrize("m", [0, 1, 7])
def test_small_and_empty_batches(m):
    inputs = make_inputs(m, 8, 40, 0.3, seed=3)
    out, l1, l0, grads = run(gated_ffn_l1, inputs)
    d_out, d_l1, _, d_grads = run(dense_gated_ffn_l1, inputs)
    assert out.shape == (m, 8)
    if m == 0:
        assert float(l1) == 0.0 and float(l0) == 0.0
    assert rel_error(out, d_out) < REL_TOL[F64] and rel_error(l1, d_l1) < REL_TOL[F64]
    for g, dg in zip(grads, d_grads, strict=True):
        assert rel_error(g, dg) < REL_TOL_GRAD[F64]


@pytest.mark.parametrize("l1_weight", [0.0, 5.0])
def test_each_loss_term_alone(l1_weight):
    inputs = make_inputs(16, 8, 64, 0.2, seed=4)
    for t in inputs:
        t.grad = None
    # l1 only: grad_out is zero (materialised by autograd).
    _, l1, _ = gated_ffn_l1(*inputs)
    (l1 * (l1_weight + 1.0)).backward()
    sparse = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    _, d_l1, _ = dense_gated_ffn_l1(*inputs)
    (d_l1 * (l1_weight + 1.0)).backward()
    assert inputs[3].grad is None  # l1 does not depend on w_down; the sparse backward returns zeros for it
    for g, t in zip(sparse, inputs, strict=True):
        dg = t.grad if t.grad is not None else torch.zeros_like(t)
        assert rel_error(g, dg) < REL_TOL_GRAD[F64]
    # out plus l1 with another random cotangent (out only when l1_weight == 0).
    a = run(gated_ffn_l1, inputs, seed=9, l1_weight=l1_weight)
    b = run(dense_gated_ffn_l1, inputs, seed=9, l1_weight=l1_weight)
    for g, dg in zip(a[3], b[3], strict=True):
        assert rel_error(g, dg) < REL_TOL_GRAD[F64]


def test_partial_requires_grad():
    x, wg, wu, wd = (t.detach() for t in make_inputs(8, 8, 32, 0.3, seed=5))
    x.requires_grad_()
    out, l1, _ = gated_ffn_l1(x, wg, wu, wd)
    (out.sum() + l1).backward()
    xd = x.detach().clone().requires_grad_()
    d_out, d_l1, _ = dense_gated_ffn_l1(xd, wg, wu, wd)
    (d_out.sum() + d_l1).backward()
    assert rel_error(x.grad, xd.grad) < REL_TOL_GRAD[F64]
    assert wg.grad is None and wd.grad is None


def test_deterministic():
    inputs = make_inputs(48, 16, 200, 0.3, seed=6, dtype=torch.float32)
    a = run(gated_ffn_l1, inputs)
    b = run(gated_ffn_l1, inputs)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for ga, gb in zip(a[3], b[3], strict=True):
        assert torch.equal(ga, gb)


def test_saves_only_sparse_state():
    m, f = 24, 96
    out, _, _ = gated_ffn_l1(*make_inputs(m, 16, f, 0.1, seed=7))
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 8
    assert not any(tuple(t.shape) == (m, f) for t in saved)
    assert all(t.dim() == 1 and t.numel() == round(0.1 * m * f) for t in saved[4:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_gradients_vs_float64(dtype):
    low = make_inputs(64, 32, 256, 0.2, seed=8, dtype=dtype)
    ref = [t.detach().to(F64).requires_grad_() for t in low]
    out, l1, _, grads = run(gated_ffn_l1, low)
    r_out, r_l1, _, r_grads = run(dense_gated_ffn_l1, ref)
    assert out.dtype == dtype and l1.dtype == torch.float32
    assert rel_error(out, r_out) < REL_TOL[dtype]
    assert rel_error(l1, r_l1) < REL_TOL[dtype]
    for name, g, rg in zip(("x", "w_gate", "w_up", "w_down"), grads, r_grads, strict=True):
        assert g.dtype == dtype, name
        assert rel_error(g, rg) < REL_TOL_GRAD[dtype], name
    # The dense baseline in the same dtype agrees as well.
    d_out, _, _, d_grads = run(dense_gated_ffn_l1, low)
    assert rel_error(out, d_out) < REL_TOL[dtype]
    for g, dg in zip(grads, d_grads, strict=True):
        assert rel_error(g, dg) < REL_TOL_GRAD[dtype]


# ------------------------------------------------------------------------------------------- bad inputs
def _good():
    return [t.detach() for t in make_inputs(4, 8, 16, 0.5, seed=10)]


@pytest.mark.parametrize("fn", [gated_ffn_l1, dense_gated_ffn_l1, GatedFFNL1.apply])
def test_bad_inputs(fn):
    x, wg, wu, wd = _good()
    with pytest.raises(ValueError, match=r"x must have 2 dimensions.*\(4, 1, 8\)"):
        fn(x.unsqueeze(1), wg, wu, wd)
    with pytest.raises(ValueError, match=r"w_gate has shape \(16, 6\) but x has shape \(4, 8\)"):
        fn(x, wg[:, :6], wu, wd)
    with pytest.raises(ValueError, match=r"w_up has shape \(12, 8\) but w_gate has shape \(16, 8\)"):
        fn(x, wg, wu[:12], wd)
    with pytest.raises(ValueError, match=r"w_down has shape \(8, 12\) but x has shape \(4, 8\)"):
        fn(x, wg, wu, wd[:, :12])
    with pytest.raises(TypeError, match="x has dtype int64"):
        fn(x.long(), wg, wu, wd)
    with pytest.raises(TypeError, match="w_down has dtype float32 but x has float64"):
        fn(x, wg, wu, wd.float())
    with pytest.raises(TypeError, match="w_gate must be a torch.Tensor"):
        fn(x, None, wu, wd)


def test_bad_stats_sink():
    with pytest.raises(TypeError, match="stats must be a dict"):
        GatedFFNL1.apply(*_good(), [])
