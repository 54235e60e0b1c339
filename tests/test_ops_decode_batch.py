"""The batch decode kernels (twell.ops.decode_batch_kernels): up kernel, split down kernel, partial sum.

decode_gated_ffn runs them from two tokens (test_ops_decode covers that entry point); here each launch
alone: the unit flags, counts and h^T rows against the reference, the down projection at every number of
unit ranges (one range writes the output directly), rows of units that do not fire never read, both Wd^T
layouts, bitwise reproducibility, and the token bounds.  Inputs come from test_ops_kernels.make_problem
(exact-grid values): which units fire is the reference's exactly.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_kernels import make_problem

from twell.ops import decode_batch_kernels as dbk
from twell.ops.decode_batch_kernels import (
    BATCH_MAX_TOKENS,
    down_split,
    launch_batch_down,
    launch_batch_ffn,
    launch_batch_up,
)
from twell.reference import inference as ref
from twell.tolerances import REL_TOL, rel_error

CASES = [
    # m, d, f, frac_pos
    (2, 32, 128, 0.05),  # two tokens, few units fire
    (7, 48, 200, 0.10),  # partial unit block, d not a power of two
    (16, 32, 96, 0.0),  # nothing fires: zero output, no Wu or Wd row read
    (33, 64, 160, 0.5),  # BM = 64, half the units fire
    (64, 32, 64, 1.0),  # the largest M, every unit fires
    (3, 32, 1000, 0.02),  # F not a multiple of the unit ranges' 64
]
IDS = [f"m{c[0]}-d{c[1]}-f{c[2]}-p{c[3]}" for c in CASES]


def _gate(p: dict) -> torch.Tensor:
    return torch.nn.functional.linear(p["x"], p["w_gate"])


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_up_kernel_flags_counts_and_hidden_rows(case, dtype, device):
    m, d, f, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=3 * m + f, dtype=dtype, device=device)
    g = _gate(p)
    ht, fires, counts = launch_batch_up(p["x"], g, p["w_up"], match=True)
    active = g.float() > 0
    assert ht.shape == (f, m) and ht.dtype == dtype
    assert torch.equal(fires.bool().cpu(), active.any(0).cpu())
    assert torch.equal(counts.sum(1).cpu(), active.sum(1).to(torch.int32).cpu())
    want_h = (torch.relu(g) * torch.nn.functional.linear(p["x"], p["w_up"])).t()  # rounded as the dense FFN
    rows = fires.bool()
    assert torch.equal(ht[rows].cpu(), want_h[rows].cpu())


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("splits", [None, 1, 2, 5])
@pytest.mark.parametrize("layout", ["unit_major", "transposed_view"])
def test_down_kernel_at_every_split_reads_only_firing_rows(case, splits, layout, device):
    m, d, f, frac = case
    dtype = torch.bfloat16
    p = make_problem(m, d, f, frac_pos=frac, seed=5 * m + f, dtype=dtype, device=device)
    ht, fires, _ = launch_batch_up(p["x"], _gate(p), p["w_up"], match=True)
    ht[~fires.bool()] = float("nan")  # rows of units that do not fire: never read
    wdt = p["w_down"].t().contiguous() if layout == "unit_major" else p["w_down"].t()
    out = launch_batch_down(ht, fires, wdt, dtype, splits=splits)
    want = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    assert out.shape == (m, d) and out.dtype == dtype
    assert not bool(torch.isnan(out).any())
    assert rel_error(out, want) <= REL_TOL[dtype]
    assert torch.equal(launch_batch_down(ht, fires, wdt, dtype, splits=splits), out)  # bitwise, run to run


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("match", [True, False])
def test_batch_ffn_matches_the_dense_reference(case, dtype, match, device):
    m, d, f, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=7 * m + f, dtype=dtype, device=device)
    args = (p["x"], p["w_gate"], p["w_up"], p["w_down"])
    out, counts = launch_batch_ffn(*args[:3], p["w_down"].t(), match=match)
    want = ref.dense_gated_ffn(*args, precision="match" if match else "fp32")
    assert out.dtype == dtype and out.shape == (m, d)
    assert rel_error(out, want) <= REL_TOL[dtype]
    assert counts.shape == (m, -(-f // 16))
    assert torch.equal(counts.sum(1).cpu(), (_gate(p).float() > 0).sum(1).to(torch.int32).cpu())


def test_nan_gate_fires_and_reaches_only_its_token(device):
    p = make_problem(3, 32, 64, frac_pos=0.2, seed=11, dtype=torch.float32, device=device)
    p["x"][1, 3] = float("nan")
    out = launch_batch_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"].t())[0]
    want = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    assert torch.equal(torch.isnan(out).cpu(), torch.isnan(want).cpu())
    assert bool(torch.isnan(out[1]).any()) and not bool(torch.isnan(out[0]).any())


@pytest.mark.parametrize("m", [0, BATCH_MAX_TOKENS + 1])
def test_token_bounds_are_refused(m, device):
    x = torch.zeros((m, 16), device=device)
    w = torch.zeros((32, 16), device=device)
    with pytest.raises(ValueError, match=f"1 to {BATCH_MAX_TOKENS} tokens, got {m}"):
        launch_batch_ffn(x, w, w, w)


@pytest.mark.parametrize(("m", "d", "f"), [(1, 2048, 5632), (8, 2048, 5632), (64, 2048, 5632), (16, 4096, 14336),
                                           (2, 64, 100), (64, 64, 64)])
def test_down_split_covers_every_unit_within_the_partial_budget(m, d, f):
    bd, s, r = down_split(m, d, f, 132)
    assert r % 64 == 0 and s * r >= f and (s - 1) * r < f  # every unit in exactly one range, no empty range
    assert bd & (bd - 1) == 0 and 16 <= bd <= dbk._DOWN_CONFIG[0]
    assert s == 1 or s * m * d * 4 <= dbk._MAX_PARTIAL_BYTES


@pytest.mark.gpu
@pytest.mark.parametrize("m", [2, 8, 16, 64])
def test_gpu_bf16_real_shape_poisoned_output(m):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    gen = torch.Generator(device="cuda").manual_seed(100 + m)
    p = synthetic_ffn_problem(m, 2048, 5632, SparsityProfile(mean_l0=28.0), generator=gen, device="cuda")
    poison = torch.full((64 * 2048 * 64,), float("nan"), device="cuda")
    del poison  # the caching allocator hands its NaN-filled block to the kernels' outputs and scratch
    args = (p["x"], p["w_gate"], p["w_up"], p["w_down"])
    out = launch_batch_ffn(*args[:3], p["w_down"].t())[0]
    want = ref.dense_gated_ffn(*(t.float() for t in args))
    assert not bool(torch.isnan(out).any())
    assert rel_error(out, want) <= REL_TOL[torch.bfloat16]
    assert torch.equal(launch_batch_ffn(*args[:3], p["w_down"].t())[0], out)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [33, 64])
def test_gpu_33_to_64_tokens_match_the_reference(m):
    """BM = 64 (one program of 64 rows a unit block, four warps) at d=2048, F=5632 within the tolerance of the fp32
    reference, NaN-free and bitwise the same run to run."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    gen = torch.Generator(device="cuda").manual_seed(200 + m)
    p = synthetic_ffn_problem(m, 2048, 5632, SparsityProfile(mean_l0=28.0), generator=gen, device="cuda")
    args = (p["x"], p["w_gate"], p["w_up"], p["w_down"].t())
    want = ref.dense_gated_ffn(p["x"].float(), p["w_gate"].float(), p["w_up"].float(), p["w_down"].float())
    out = launch_batch_ffn(*args)[0]
    assert not bool(torch.isnan(out).any()) and rel_error(out, want) <= REL_TOL[torch.bfloat16]
    assert torch.equal(launch_batch_ffn(*args)[0], out)
