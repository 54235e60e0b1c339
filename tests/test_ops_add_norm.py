"""twell.ops.add_norm_kernel: the residual add and the RMSNorm after it in one pass, against PyTorch's ops.

The kernel runs in Triton's interpreter on the CPU (natively on a GPU).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_bitwise_equal

from twell.ops.add_norm_kernel import MAX_D, add_rms_norm, add_rms_norm_supported
from twell.tolerances import BF16_ONE_ROUNDING_REL_TOL, REL_TOL, rel_error


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    r = (torch.randn(*shape, generator=gen) * 3).to(dtype=dtype, device=device)
    x = torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype=dtype, device=device)
    return r, x, w


@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 48), (1, 100), (4, 1)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_add_then_rms_norm(shape, dtype, device):
    r, x, w = _inputs(shape, dtype, device)
    h, y = add_rms_norm(r, x, w, 1e-6)
    assert_bitwise_equal(h, r + x)  # PyTorch's add, bit for bit
    want = F.rms_norm((r + x).float(), (shape[-1],), w.float(), 1e-6)
    assert y.dtype == dtype and y.shape == x.shape
    assert rel_error(y, want) <= REL_TOL[dtype]


def test_zero_rows_and_a_row_of_zeros(device):
    r, x, w = _inputs((0, 32), torch.float32, device)
    h, y = add_rms_norm(r, x, w, 1e-5)
    assert h.shape == y.shape == (0, 32)
    z = torch.zeros(2, 32, device=device)
    h, y = add_rms_norm(z, z, torch.ones(32, device=device), 1e-5)
    assert torch.equal(y, torch.zeros_like(y))  # 0 * rsqrt(eps): no NaN


def test_nan_propagates(device):
    r, x, w = _inputs((3, 16), torch.float32, device)
    x[1, 4] = float("nan")
    h, y = add_rms_norm(r, x, w, 1e-6)
    assert torch.isnan(h[1, 4]) and torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2]]).any()


def test_bad_inputs(device):
    r, x, w = _inputs((3, 16), torch.float32, device)
    assert add_rms_norm_supported(r, x, w)
    bad = {
        "shape": (r[:, :8].contiguous(), x, w),
        "dtype": (r.double(), x.double(), w.double()),
        "weight": (r, x, w[:8]),
        "layout": (r.t().contiguous().t(), x, w),
        "width": (torch.zeros(1, MAX_D * 2, device=device), torch.zeros(1, MAX_D * 2, device=device),
                  torch.zeros(MAX_D * 2, device=device)),
    }
    for what, args in bad.items():
        assert not add_rms_norm_supported(*args), what
        with pytest.raises(ValueError, match="add_rms_norm takes contiguous residual and x of one shape"):
            add_rms_norm(*args, 1e-6)
    for eps in (-1.0, None, True):
        with pytest.raises(ValueError, match="eps must be a float >= 0"):
            add_rms_norm(r, x, w, eps)


@pytest.mark.gpu
def test_gpu_bf16_real_shape():
    r, x, w = _inputs((16384, 2048), torch.bfloat16, "cuda", seed=4)
    h, y = add_rms_norm(r, x, w, 1e-6)
    assert_bitwise_equal(h, r + x)
    got = y.float()
    eager = F.rms_norm(r + x, (2048,), w, 1e-6)  # PyTorch's fused kernel, rounded once
    assert rel_error(got, F.rms_norm((r + x).float(), (2048,), w.float(), 1e-6)) <= REL_TOL[torch.bfloat16]
    # within a bf16 rounding of PyTorch's own kernel everywhere
    assert float(((got - eager.float()).abs() / eager.float().abs().clamp_min(1e-3)).max()) <= BF16_ONE_ROUNDING_REL_TOL
