"""The small-batch (decode) FFN (twell.ops.decode): Triton kernels against the dense reference, bad inputs.

Inputs come from test_ops_kernels.make_problem (exact-grid values, a bias channel setting the density):
the gates are exact, so which units fire is the reference's exactly and the outputs agree within the
dtype's tolerance.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_kernels import make_problem

from twell.ops.decode import DECODE_MAX_TOKENS, decode_gated_ffn
from twell.ops.decode_kernels import _DOWN_BC, launch_decode_down, launch_decode_hidden
from twell.reference import inference as ref
from twell.tolerances import REL_TOL, rel_error

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

CASES = [
    # m, d, f, frac_pos
    (1, 32, 128, 0.05),  # one token: most unit blocks stay idle
    (7, 48, 200, 0.10),  # partial unit block and partial K chunk, d not a power of two
    (16, 32, 96, 0.0),  # nothing fires: zero output, no Wu or Wd row read
    (33, 64, 160, 0.5),  # BM = 64, half the units fire
    (64, 32, 64, 1.0),  # the largest M, every unit fires
    (1, 32, 1000, 0.02),  # F not a multiple of the down kernel's chunks (BC, BU)
]


@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-p{c[3]}" for c in CASES])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("precision", ["match", "fp32"])
def test_matches_dense_reference(case, dtype, precision, device):
    m, d, f, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=m + f, dtype=dtype, device=device)
    args = (p["x"], p["w_gate"], p["w_up"], p["w_down"])
    out = decode_gated_ffn(*args, precision=precision, backend="triton")
    want = ref.dense_gated_ffn(*args, precision=precision)
    assert out.dtype == dtype and out.shape == (m, d)
    assert rel_error(out, want) <= REL_TOL[dtype]
    assert torch.equal(decode_gated_ffn(*args, precision=precision, backend="triton"), out)  # deterministic
    assert torch.equal(decode_gated_ffn(*args, precision=precision, backend="torch"), want)


def test_unit_flags_and_hidden_tile_are_exact(device):
    """The hidden kernel's per-unit flags are "fires for some token", its h the dense h with zeros, its
    counts sum to each token's l0."""
    p = make_problem(5, 32, 128, frac_pos=0.08, seed=3, dtype=torch.float32, device=device)
    h, fires, counts = launch_decode_hidden(p["x"], p["w_gate"], p["w_up"], match=True)
    g = p["x"] @ p["w_gate"].T
    assert torch.equal(fires.cpu() != 0, (g > 0).any(0).cpu())
    want = torch.relu(g) * (p["x"] @ p["w_up"].T)
    assert torch.equal((h != 0).cpu(), (want != 0).cpu())
    assert rel_error(h, want) <= REL_TOL[torch.float32]
    assert torch.equal(counts.sum(1).cpu(), (g > 0).sum(1).to(torch.int32).cpu())  # per-token l0


DOWN_CASES = [
    # m, d, f, fraction of units that fire
    (1, 32, 96, 0.05),  # one token, a few units: one K step
    (64, 48, 1000, 0.3),  # the largest M; F < BC, not a power of two; d not a multiple of BD
    (3, 40, 2 * _DOWN_BC + 452, 0.02),  # several compaction chunks, the last one partial
    (8, 32, 1000, 1.0),  # every unit fires (the dense case): 32 K steps
    (16, 32, 96, 0.0),  # no unit fires: no K step at all
]


def _down_problem(m, d, f, frac, dtype, h_dtype, layout, device):  # noqa: ANN001, ANN202
    """h, flags and Wd^T where the h columns and Wd^T rows of non-firing units are NaN: any read of
    them would reach the output.  ``layout``: a contiguous unit-major Wd^T, or the ``.t()`` view of an
    nn.Linear weight [d, F]."""
    gen = torch.Generator().manual_seed(m * 1000 + f)
    fires = torch.rand(f, generator=gen) < frac
    h = torch.randn(m, f, generator=gen).to(h_dtype)
    wdt = torch.randn(f, d, generator=gen).to(dtype)
    h[:, ~fires] = float("nan")
    wdt[~fires] = float("nan")
    want = h.double()[:, fires] @ wdt.double()[fires]
    if layout == "transposed_view":
        wdt = wdt.t().contiguous().t()
        assert wdt.stride() == (1, f)
    return h.to(device), fires.to(torch.int8).to(device), wdt.to(device), want, int(fires.sum())


@pytest.mark.parametrize("case", DOWN_CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-p{c[3]}" for c in DOWN_CASES])
@pytest.mark.parametrize("layout", ["unit_major", "transposed_view"])
@pytest.mark.parametrize(("dtype", "h_dtype"), [(torch.float32, torch.float32), (torch.float16, torch.float16),
                                                (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)],
                         ids=["fp32", "fp16", "bf16", "bf16-h_fp32"])
def test_down_kernel_reads_only_firing_units_and_is_reproducible(case, layout, dtype, h_dtype, device):
    m, d, f, frac = case
    h, fires, wdt, want, n_fire = _down_problem(m, d, f, frac, dtype, h_dtype, layout, device)
    assert (n_fire == f) == (frac == 1.0) and (n_fire == 0) == (frac == 0.0)
    out = launch_decode_down(h, fires, wdt, dtype)
    assert out.dtype == dtype and out.shape == (m, d)
    if n_fire == 0:
        assert torch.equal(out.cpu(), torch.zeros((m, d), dtype=dtype))  # exact zeros, no NaN read
    else:
        assert rel_error(out, want) <= REL_TOL[dtype]
    assert torch.equal(launch_decode_down(h, fires, wdt, dtype), out)  # bitwise, run to run


@pytest.mark.parametrize("case", [(1, 32, 200, 0.05), (33, 64, 160, 0.5)], ids=["m1", "m33"])
def test_fused_up_variant_is_bitwise_the_two_pass_kernel(case, device, monkeypatch):
    """The hidden kernel's "fused up" configuration (every Wu row read in the gate's K loop) computes
    each firing unit's up projection over the same K steps: same bits as the second masked pass."""
    from twell.ops import decode_kernels

    m, d, f, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=5 + m, dtype=torch.bfloat16, device=device)
    args = (p["x"], p["w_gate"], p["w_up"], p["w_down"])
    two_pass = decode_gated_ffn(*args, backend="triton")
    hidden_two_pass = launch_decode_hidden(p["x"], p["w_gate"], p["w_up"], match=True)
    for attr in ("_HIDDEN_SMALL_M", "_HIDDEN_LARGE_M"):
        monkeypatch.setattr(decode_kernels, attr, (*getattr(decode_kernels, attr)[:3], True))
    decode_kernels._meta.cache_clear()
    try:
        fused = decode_gated_ffn(*args, backend="triton")
        hidden_fused = launch_decode_hidden(p["x"], p["w_gate"], p["w_up"], match=True)
    finally:
        monkeypatch.undo()
        decode_kernels._meta.cache_clear()
    assert torch.equal(fused, two_pass)
    for got, want in zip(hidden_fused, hidden_two_pass, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("case", [(1, 32, 200, 0.05), (33, 64, 160, 0.5), (7, 48, 96, 0.0)], ids=["m1", "m33", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gate_by_gemm_variant_matches_the_reference(case, dtype, device):
    """The gate through F.linear, the kernel reading g (GATE_BY_GEMM): the dense FFN's result within the
    tolerance, g bitwise the dense path's gate (h's zeros exactly where relu(F.linear(x, Wg)) is 0),
    reproducible, and the same firing flags and counts as the fused-gate kernel wherever both round g
    alike (asserted through the flags of units whose gate is clearly non-zero)."""
    m, d, f, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=11 + m, dtype=dtype, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    h, fires, counts = launch_decode_hidden(x, wg, wu, match=True, gate_by_gemm=True)
    gate = torch.relu(torch.nn.functional.linear(x, wg))
    assert torch.equal(h != 0, (gate != 0) & (h != 0))  # h is zero wherever the dense gate is
    assert torch.equal(fires.bool(), (gate != 0).any(dim=0))
    assert torch.equal(counts.sum(dim=1), (gate != 0).sum(dim=1).to(counts.dtype))
    out = launch_decode_down(h, fires, wd.t(), dtype)
    want = ref.dense_gated_ffn(x, wg, wu, wd)
    if frac == 0.0 and not bool((gate != 0).any()):
        assert torch.count_nonzero(out) == 0
    else:
        assert rel_error(out, want) <= REL_TOL[dtype]
    again = launch_decode_hidden(x, wg, wu, match=True, gate_by_gemm=True)
    for got, first in zip(again, (h, fires, counts), strict=True):
        assert torch.equal(got, first)


def test_gate_by_gemm_is_chosen_by_the_gate_weight_size(device, monkeypatch):
    from twell.ops import decode_kernels

    p = make_problem(1, 32, 64, frac_pos=0.2, seed=3, dtype=torch.float32, device=device)
    calls: list[tuple] = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: calls.append(a[1].shape) or linear(*a))
    launch_decode_hidden(p["x"], p["w_gate"], p["w_up"], match=True)
    assert calls == []  # 32 x 64 is below GATE_BY_GEMM_MIN_ELEMENTS: the gate in the kernel
    monkeypatch.setattr(decode_kernels, "GATE_BY_GEMM_MIN_ELEMENTS", 32 * 64)
    h = launch_decode_hidden(p["x"], p["w_gate"], p["w_up"], match=True)[0]
    assert calls == [p["w_gate"].shape]
    monkeypatch.setattr(decode_kernels, "GATE_BY_GEMM", False)  # forced off whatever the size
    assert torch.equal(launch_decode_hidden(p["x"], p["w_gate"], p["w_up"], match=True, gate_by_gemm=True)[0], h)
    launch_decode_hidden(p["x"], p["w_gate"], p["w_up"], match=True)
    assert len(calls) == 2


def test_nan_propagates_like_the_dense_ffn(device):
    p = make_problem(3, 32, 64, frac_pos=0.2, seed=5, dtype=torch.float32, device=device)
    p["x"][1, 3] = float("nan")
    out = decode_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], backend="triton")
    want = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    assert torch.equal(torch.isnan(out).cpu(), torch.isnan(want).cpu())
    assert bool(torch.isnan(out[1]).any()) and not bool(torch.isnan(out[0]).any())
    with pytest.raises(ValueError, match="NaN"):
        decode_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], backend="triton", nan_policy="raise")


def test_empty_inputs(device):
    p = make_problem(2, 16, 32, frac_pos=0.3, seed=1, dtype=torch.float32, device=device)
    out = decode_gated_ffn(p["x"][:0], p["w_gate"], p["w_up"], p["w_down"], backend="triton")
    assert out.shape == (0, 16)


def test_bad_inputs_are_refused(device):
    p = make_problem(2, 16, 32, frac_pos=0.3, seed=1, dtype=torch.float32, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    big = torch.zeros((DECODE_MAX_TOKENS + 1, 16), device=device)
    with pytest.raises(ValueError, match=f"at most {DECODE_MAX_TOKENS} tokens"):
        decode_gated_ffn(big, wg, wu, wd)
    with pytest.raises(ValueError, match="w_down has shape"):
        decode_gated_ffn(x, wg, wu, wd.T)
    with pytest.raises(ValueError, match="w_up has shape"):
        decode_gated_ffn(x, wg, wu[:16], wd)
    with pytest.raises(TypeError, match="dtype"):
        decode_gated_ffn(x, wg, wu.half(), wd)
    with pytest.raises(TypeError, match="float64"):
        decode_gated_ffn(x.double(), wg.double(), wu.double(), wd.double(), backend="triton")
    with pytest.raises(ValueError, match="precision"):
        decode_gated_ffn(x, wg, wu, wd, precision="fp16")
    with pytest.raises(ValueError, match="x has shape|w_gate has shape"):
        decode_gated_ffn(x[:, :8], wg, wu, wd)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 64])
def test_gpu_bf16_real_shape(m):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    gen = torch.Generator(device="cuda").manual_seed(m)
    p = synthetic_ffn_problem(m, 2048, 5632, SparsityProfile(mean_l0=28.0), generator=gen, device="cuda")
    args = (p["x"], p["w_gate"], p["w_up"], p["w_down"])
    out = decode_gated_ffn(*args)
    want = ref.dense_gated_ffn(*(t.float() for t in args)).to(torch.bfloat16)
    assert not bool(torch.isnan(out).any())
    assert rel_error(out, want) <= REL_TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4])  # the one-pass kernel (one token) and the two kernels
def test_gpu_runs_on_the_current_stream_and_in_a_cuda_graph(m):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    gen = torch.Generator(device="cuda").manual_seed(7)
    p = synthetic_ffn_problem(m, 2048, 5632, SparsityProfile(mean_l0=28.0), generator=gen, device="cuda")
    args = (p["x"], p["w_gate"], p["w_up"], p["w_down"])
    expect = decode_gated_ffn(*args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = decode_gated_ffn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = decode_gated_ffn(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect) and torch.equal(captured, expect)
