"""mean_active_per_token (the dense paths' l0) against count_nonzero: Triton kernel (interpreter) and torch."""

from __future__ import annotations

import pytest
import torch

from twell.ops import active_count
from twell.ops.active_count import mean_active_per_token
from twell.tolerances import FP32_ROUNDING_TOL


def _expected(a: torch.Tensor) -> float:
    tokens = max(1, a.numel() // max(1, a.shape[-1]))
    return torch.count_nonzero(a).item() / tokens


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (3, 5, 96), (2, 8193), (5, 16391), (0, 64), (64,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_count_nonzero(shape, dtype, monkeypatch):
    gen = torch.Generator().manual_seed(sum(shape))
    a = torch.relu(torch.randn(shape, generator=gen)).to(dtype)
    if a.numel() > 3:
        flat = a.view(-1)
        flat[0], flat[1], flat[2] = float("nan"), -0.0, float("inf")  # NaN and inf active, -0.0 not
    want = _expected(a)
    got = mean_active_per_token(a)
    assert got.dtype == torch.float32 and got.dim() == 0
    assert got.item() == pytest.approx(want, rel=FP32_ROUNDING_TOL)
    monkeypatch.setattr(active_count, "_use_kernel", lambda t: False)  # the torch expression
    assert mean_active_per_token(a).item() == pytest.approx(want, rel=FP32_ROUNDING_TOL)


def test_kernel_runs_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    a = torch.zeros(5, 17)
    assert active_count._use_kernel(a) == active_count.triton_available()
    a[2, 3] = 1.0
    a[4, 16] = float("nan")
    assert mean_active_per_token(a).item() == pytest.approx(2 / 5)
    assert mean_active_per_token(torch.ones(4, 3)).item() == 3.0  # fully dense


def test_grid_stride_programs_each_count_several_blocks(monkeypatch):
    # 41,955 elements = 6 blocks on the interpreter's 4 programs: programs 0 and 1 loop twice, and the
    # last ticket (whichever program takes it) writes the total of all of them.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if not active_count.triton_available():
        pytest.skip("needs triton")
    gen = torch.Generator().manual_seed(11)
    a = torch.relu(torch.randn(5, 8391, generator=gen) - 1.0)
    assert active_count._use_kernel(a)
    assert a.numel() > active_count._DEFAULT_PROGRAMS * active_count._BLOCK
    got = mean_active_per_token(a)
    assert got.item() == pytest.approx(_expected(a), rel=FP32_ROUNDING_TOL)
    assert torch.equal(got, mean_active_per_token(a))


def test_non_contiguous_input_uses_torch():
    a = torch.relu(torch.randn(6, 10)).t()
    assert not active_count._use_kernel(a)
    assert mean_active_per_token(a).item() == pytest.approx(_expected(a))


def test_bad_input():
    with pytest.raises(TypeError, match="at least one dimension"):
        mean_active_per_token(torch.tensor(1.0))
    with pytest.raises(TypeError, match="list"):
        mean_active_per_token([1.0, 0.0])


@pytest.mark.gpu
def test_gpu_counts_a_large_activation_exactly():
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.relu(torch.randn(16384 + 3, 5632, device="cuda", generator=gen) - 2.5).to(torch.bfloat16)
    a[5, :] = float("nan")  # a NaN row: all active
    assert active_count._use_kernel(a)
    want = torch.count_nonzero(a).item() / a.shape[0]
    assert mean_active_per_token(a).item() == pytest.approx(want, rel=FP32_ROUNDING_TOL)
    assert torch.equal(mean_active_per_token(a), mean_active_per_token(a))
