"""The Triton training op (twell.ops.training) against the dense autograd oracle.

On the CPU the kernels run under TRITON_INTERPRET=1 at tiny shapes; on a GPU natively.  The
interpreter problems use exact-grid inputs (small multiples of 1/8): every gate is exact in fp32 and
at least 1/16 away from 0 (half-grid bias), so the kernels and the reference agree on the active
pattern and l0 must match exactly.  The reference is :func:`dense_gated_ffn_l1` evaluated in float64
on the same input values, and the kernels' float32 results must be within the float32 tolerances of it.
"""

from __future__ import annotations

import math

import pytest
import torch

from twell.ops.training import TwellGatedFFNL1, default_token_splits, twell_gated_ffn_l1
from twell.reference.training import dense_gated_ffn_l1
from twell.tolerances import L0_REL_TOL_GATE_FLIPS, REL_TOL, REL_TOL_GRAD, rel_error

F32, F64 = torch.float32, torch.float64


def _grid(shape: tuple[int, ...], gen: torch.Generator, lo: int = -8, hi: int = 9) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=gen).to(F64) / 8


def make_problem(m: int, d: int, f: int, frac_pos: float, seed: int) -> list[torch.Tensor]:
    """Exact-grid (x, w_gate, w_up, w_down) in float64; x[:, 0] = 1 makes w_gate[:, 0] a bias that
    sets about ``frac_pos`` of each unit's gates positive, at a half-grid offset (no gate is 0)."""
    gen = torch.Generator().manual_seed(seed)
    x = _grid((m, d), gen)
    x[:, 0] = 1.0
    wg = _grid((f, d), gen, -2, 3) / 4
    rest = x[:, 1:] @ wg[:, 1:].T
    if m == 0:
        pass
    elif frac_pos <= 0:
        wg[:, 0] = -rest.max() - 1
    elif frac_pos >= 1:
        wg[:, 0] = -rest.min() + 1
    else:
        q = torch.quantile(rest, 1 - frac_pos, dim=0)
        wg[:, 0] = -(torch.floor(q * 8) + 0.5) / 8
    wu = _grid((f, d), gen) / 4
    wd = _grid((d, f), gen) / 4
    return [x, wg, wu, wd]


def run(fn, inputs, *, dtype=F32, device="cpu", seed=0, out_weight=1.0, l1_weight=0.37, **kw):
    """Forward ``fn`` on leaf copies of ``inputs`` in ``dtype``; backward ``out_weight * <out, r> + l1_weight
    * l1`` (r random, rounded to dtype so both sides see the same grad_out).  Returns (out, l1, l0, grads)."""
    leaves = [t.to(dtype=dtype, device=device).requires_grad_() for t in inputs]
    out, l1, l0 = fn(*leaves, **kw)
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    r = r.to(dtype).to(device=device, dtype=l1.dtype)
    loss = out_weight * (out.to(l1.dtype) * r).sum() + l1_weight * l1
    loss.backward()
    return out.detach(), l1.detach(), l0, [t.grad for t in leaves]


def assert_same_run(a, b):
    """Two results of :func:`run` are bitwise identical: out, l1, l0 and every gradient."""
    for p, q in zip([*a[:3], *a[3]], [*b[:3], *b[3]], strict=True):
        assert torch.equal(p, q)


def reference(inputs, dtype=F32, **kw):
    """The oracle in float64 on the values of ``inputs`` rounded to ``dtype`` (on the CPU)."""
    vals = [t.to(dtype).to(F64).cpu() for t in inputs]
    return run(dense_gated_ffn_l1, vals, dtype=F64, **kw)


def check_close(got, want, dtype=F32, l0_exact=True):
    out, l1, l0, grads = got
    r_out, r_l1, r_l0, r_grads = want
    assert out.dtype == dtype and l1.dtype == F32 and l0.dtype == F32
    assert rel_error(out, r_out) <= REL_TOL[dtype]
    assert rel_error(l1, r_l1) <= REL_TOL[dtype]
    if l0_exact:
        assert float(l0) == float(r_l0)
    else:
        assert abs(float(l0) - float(r_l0)) <= L0_REL_TOL_GATE_FLIPS * max(1.0, float(r_l0))
    for name, g, rg in zip(("x", "w_gate", "w_up", "w_down"), grads, r_grads, strict=True):
        assert g is not None and g.dtype == dtype and g.shape == rg.shape, name
        assert rel_error(g, rg) <= REL_TOL_GRAD[dtype], name


def n_overflowing(inputs, width: int) -> int:
    x, wg = inputs[0], inputs[1]
    return int(((x @ wg.T) > 0).sum(1).gt(width).sum())


CASES = [
    # m, d, f, width, frac_pos, token_splits
    (16, 32, 128, None, 0.0, None),  # nothing active
    (37, 32, 128, None, 0.05, 1),  # odd M, ELL only
    (37, 32, 128, 4, 0.05, 3),  # some rows overflow W = 4
    (24, 24, 96, 16, 0.3, 2),  # d not a power of two, ~30 %, many overflowing rows
    (12, 16, 64, None, 1.0, 3),  # 100 %, W = F: every pair in the ELL, hot units split in 3
    (12, 16, 64, 8, 1.0, 2),  # 100 %, every row overflows
    (1, 32, 128, 4, 0.3, 1),  # M = 1, overflowing
]


@pytest.mark.parametrize("case", CASES)
def test_matches_dense_reference_fp32(case, device):
    m, d, f, width, frac, splits = case
    inputs = make_problem(m, d, f, frac, seed=11 + m + f)
    if width is not None and 0 < frac:
        assert n_overflowing(inputs, width) > 0  # the dense fallback is exercised
    got = run(twell_gated_ffn_l1, inputs, device=device, width=width, token_splits=splits)
    check_close(got, reference(inputs))
    if frac == 0.0:
        assert torch.count_nonzero(got[0]) == 0 and float(got[1]) == 0.0


def test_bfloat16_small(device):
    inputs = make_problem(20, 32, 128, 0.1, seed=5)
    got = run(twell_gated_ffn_l1, inputs, dtype=torch.bfloat16, device=device, width=8, token_splits=2)
    check_close(got, reference(inputs, dtype=torch.bfloat16), dtype=torch.bfloat16)


@pytest.mark.parametrize("weights", [(1.0, 0.0), (0.0, 2.0)])
def test_loss_through_one_output_only(weights, device):
    """grad_l1 = 0 (l1 unused) and grad_out = 0 (only the penalty): autograd materialises zeros."""
    inputs = make_problem(9, 16, 64, 0.2, seed=7)
    ow, lw = weights
    got = run(twell_gated_ffn_l1, inputs, device=device, width=8, out_weight=ow, l1_weight=lw)
    check_close(got, reference(inputs, out_weight=ow, l1_weight=lw))


def test_empty_rows_and_zero_tokens(device):
    inputs = make_problem(6, 16, 64, 0.2, seed=3)
    inputs[0][2] = 0.0  # all-zero token: every gate is exactly 0 -> an empty row
    got = run(twell_gated_ffn_l1, inputs, device=device, width=4)
    check_close(got, reference(inputs))
    assert torch.count_nonzero(got[0][2]) == 0 and torch.count_nonzero(got[3][0][2]) == 0

    leaves = [t.to(F32).to(device).requires_grad_() for t in make_problem(0, 16, 64, 0.2, seed=3)]
    out, l1, l0 = twell_gated_ffn_l1(*leaves)
    assert out.shape == (0, 16) and float(l1.detach()) == 0.0 and float(l0) == 0.0
    (out.sum() + l1).backward()
    assert all(t.grad is not None and t.grad.shape == t.shape and not t.grad.any() for t in leaves)


def test_deterministic_bitwise(device):
    inputs = make_problem(21, 32, 96, 0.3, seed=13)
    a = run(twell_gated_ffn_l1, inputs, device=device, width=8, token_splits=3)
    b = run(twell_gated_ffn_l1, inputs, device=device, width=8, token_splits=3)
    assert_same_run(a, b)


def test_saves_no_dense_gate_and_partial_grads(device):
    m, f = 10, 64
    inputs = make_problem(m, 16, f, 0.2, seed=17)
    x, wg, wu, wd = (t.to(F32).to(device) for t in inputs)
    wg.requires_grad_()
    wd.requires_grad_()
    out, l1, l0 = twell_gated_ffn_l1(x, wg, wu, wd, width=8)
    assert l0.requires_grad is False
    saved = out.grad_fn.saved_tensors
    assert not any(t.shape == (m, f) for t in saved)
    (out.sum() + l1).backward()
    assert wu.grad is None and x.grad is None
    assert wg.grad.shape == wg.shape and wd.grad.shape == wd.shape and wd.grad.is_contiguous()


def test_defaults():
    assert default_token_splits(0) == 1 and default_token_splits(8192) == 1
    assert default_token_splits(8193) == 2 and default_token_splits(10**6) == 4
    assert issubclass(TwellGatedFFNL1, torch.autograd.Function)


def test_bad_inputs_are_refused(device):
    x, wg, wu, wd = (t.to(F32).to(device) for t in make_problem(4, 16, 64, 0.2, seed=4))
    with pytest.raises(TypeError, match="float64"):
        twell_gated_ffn_l1(x.double(), wg.double(), wu.double(), wd.double())
    with pytest.raises(ValueError, match="w_gate"):
        twell_gated_ffn_l1(x, wg[:, :8], wu, wd)
    with pytest.raises(ValueError, match="w_down"):
        twell_gated_ffn_l1(x, wg, wu, wd[:, :10])
    with pytest.raises(TypeError, match="dtype"):
        twell_gated_ffn_l1(x, wg.half(), wu, wd)
    with pytest.raises(ValueError, match="width"):
        twell_gated_ffn_l1(x, wg, wu, wd, width=0)
    with pytest.raises(TypeError, match="width"):
        twell_gated_ffn_l1(x, wg, wu, wd, width=True)
    with pytest.raises(ValueError, match="token_splits"):
        twell_gated_ffn_l1(x, wg, wu, wd, token_splits=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal without the interpreter")
def test_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, wg, wu, wd = make_problem(2, 16, 32, 0.2, seed=1)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        twell_gated_ffn_l1(x.float(), wg.float(), wu.float(), wd.float())


# ------------------------------------------------------------------------------------------ GPU
def make_random_problem(m: int, d: int, f: int, density: float, seed: int) -> list[torch.Tensor]:
    """Gaussian float64 problem with about ``density`` of the gates positive (bias on x[:, 0] = 1)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=gen, dtype=F64)
    x[:, 0] = 1.0
    wg = torch.randn(f, d, generator=gen, dtype=F64) / math.sqrt(d)
    wu = torch.randn(f, d, generator=gen, dtype=F64) / math.sqrt(d)
    wd = torch.randn(d, f, generator=gen, dtype=F64) / math.sqrt(f)
    wg[:, 0] = 0.0
    thr = torch.quantile((x[:4096] @ wg.T).flatten()[: 2**24].float(), 1 - density).item()
    wg[:, 0] = -thr
    return [x, wg, wu, wd]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("width", [None, 32])  # 32 < ~51 active units on average: many rows overflow
def test_gpu_realistic_size(dtype, width):
    inputs = make_random_problem(4096, 256, 1024, 0.05, seed=21)
    if width is not None:
        assert n_overflowing([t.to(dtype).to(F64) for t in inputs], width) > 0
    got = run(twell_gated_ffn_l1, inputs, dtype=dtype, device="cuda", width=width)
    want = reference([t.cuda() for t in inputs], dtype=dtype)
    # Gates within fp32 accumulation noise of 0 may fall on different sides of the ReLU: l0 up to 0.1 %.
    check_close(got, want, dtype=dtype, l0_exact=False)


@pytest.mark.gpu
def test_gpu_deterministic_bitwise_with_hot_units():
    inputs = make_random_problem(4096, 256, 1024, 0.05, seed=22)
    inputs[1][:8, 0] = 10.0  # 8 units active for every token: segments of M pairs, split in 4
    a = run(twell_gated_ffn_l1, inputs, dtype=torch.bfloat16, device="cuda", width=64, token_splits=4)
    b = run(twell_gated_ffn_l1, inputs, dtype=torch.bfloat16, device="cuda", width=64, token_splits=4)
    assert_same_run(a, b)
    want = reference([t.cuda() for t in inputs], dtype=torch.bfloat16)
    check_close(a, want, dtype=torch.bfloat16, l0_exact=False)
