"""The fused small-batch kernel (cuBLAS gate, then up and down in one launch) against the dense reference.

Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU; inputs from
test_ops_kernels.make_problem (exact-grid values, a bias channel setting the density).
"""

from __future__ import annotations

import pytest
import torch
from test_ops_kernels import make_problem

from twell.ops import decode as decode_mod
from twell.ops.decode import decode_gated_ffn, launch_decode_ffn
from twell.ops.decode_fused_kernel import FUSED_MAX_TOKENS, launch_decode_fused
from twell.ops.decode_kernels import decode_blocks, launch_decode_hidden
from twell.reference import inference as ref
from twell.tolerances import REL_TOL, rel_error

CASES = [
    # m, d, f, frac_pos
    (1, 32, 128, 0.05),  # one token, a few firing units
    (7, 48, 200, 0.10),  # F not a multiple of the unit steps, d not a power of two
    (16, 32, 96, 0.0),  # nothing fires: zero output
    (16, 64, 160, 1.0),  # the largest M, every unit fires (several BU steps)
    (2, 32, 5000, 0.02),  # F over one compaction chunk (BC = 4096)
]


@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-p{c[3]}" for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("precision", ["match", "fp32"])
def test_matches_dense_reference_and_the_two_kernel_counts(case, dtype, precision, device):
    m, d, f, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=3 * m + f, dtype=dtype, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    out, counts = launch_decode_fused(x, wg, wu, wd.t(), match=precision == "match")
    want = ref.dense_gated_ffn(x, wg, wu, wd, precision=precision)
    assert out.dtype == dtype and out.shape == (m, d)
    if bool((want != 0).any()):
        assert rel_error(out, want) <= REL_TOL[dtype]
    else:
        assert torch.count_nonzero(out) == 0
    # per-token active units per block of 16 units: the two-kernel path's l0 statistics, exactly
    assert counts.shape == (m, decode_blocks(f))
    want_counts = launch_decode_hidden(x, wg, wu, match=True, gate_by_gemm=True)[2]
    assert torch.equal(counts, want_counts)
    again = launch_decode_fused(x, wg, wu, wd.t(), match=precision == "match")
    assert torch.equal(again[0], out) and torch.equal(again[1], counts)  # bitwise reproducible


def test_unit_major_copy_of_wd_gives_the_same_bits(device):
    p = make_problem(3, 32, 300, frac_pos=0.1, seed=9, dtype=torch.bfloat16, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    view = launch_decode_fused(x, wg, wu, wd.t(), match=True)[0]
    copy = launch_decode_fused(x, wg, wu, wd.t().contiguous(), match=True)[0]
    assert torch.equal(view, copy)


def test_nan_gate_reaches_the_output_like_the_dense_ffn(device):
    p = make_problem(2, 32, 64, frac_pos=0.2, seed=5, dtype=torch.float32, device=device)
    p["x"][1, 3] = float("nan")
    out = launch_decode_fused(p["x"], p["w_gate"], p["w_up"], p["w_down"].t(), match=True)[0]
    want = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    assert torch.equal(torch.isnan(out).cpu(), torch.isnan(want).cpu())


def test_switch_routes_small_calls_through_the_fused_kernel(device, monkeypatch):
    p = make_problem(4, 32, 128, frac_pos=0.1, seed=2, dtype=torch.bfloat16, device=device)
    args = (p["x"], p["w_gate"], p["w_up"], p["w_down"])
    two_kernels = launch_decode_ffn(*args[:3], args[3].t())
    monkeypatch.setattr(decode_mod, "FUSED_UPDOWN", True)
    fused = launch_decode_ffn(*args[:3], args[3].t())
    assert torch.equal(fused[0], launch_decode_fused(*args[:3], args[3].t(), match=True)[0])
    assert torch.equal(fused[1], two_kernels[1])  # same counts: same l0 for SparseGatedMLP
    assert rel_error(decode_gated_ffn(*args, backend="triton"), ref.dense_gated_ffn(*args)) <= REL_TOL[torch.bfloat16]
    big = make_problem(FUSED_MAX_TOKENS + 1, 32, 64, frac_pos=0.1, seed=4, dtype=torch.bfloat16, device=device)
    out = launch_decode_ffn(big["x"], big["w_gate"], big["w_up"], big["w_down"].t())[0]  # two kernels above 16
    assert rel_error(out, ref.dense_gated_ffn(big["x"], big["w_gate"], big["w_up"], big["w_down"])) <= \
        REL_TOL[torch.bfloat16]


def test_token_count_outside_the_kernel_is_refused(device):
    p = make_problem(FUSED_MAX_TOKENS + 1, 32, 64, frac_pos=0.1, seed=1, dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match=f"1 to {FUSED_MAX_TOKENS} tokens"):
        launch_decode_fused(p["x"], p["w_gate"], p["w_up"], p["w_down"].t(), match=True)
