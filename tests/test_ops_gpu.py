"""GPU tests of the inference kernels: bf16, real shapes, synthetic sparse data, poisoned outputs."""

from __future__ import annotations

import pytest
import torch

import twell.ops as ops
from twell.reference.inference import dense_gated_ffn
from twell.synthetic import SparsityProfile, synthetic_ffn_problem
from twell.tolerances import GATE_COUNT_MISMATCH_FRACTION, REL_TOL, rel_error

pytestmark = pytest.mark.gpu


def _poison_allocator(nbytes: int = 1 << 30) -> None:
    """Fill soon-to-be-reused cached blocks with NaN so an unwritten output element shows up."""
    junk = torch.full((nbytes // 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del junk


def _problem(m: int, d: int, f: int, density_pct: float, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=density_pct / 100 * f), generator=gen,
                                 dtype=torch.bfloat16, device="cuda")


SHAPES = [(768, 2048), (2048, 5632), (2048, 8192), (4096, 14336)]


@pytest.mark.parametrize("d,f", SHAPES)
@pytest.mark.parametrize("m", [1, 7, 256])
@pytest.mark.parametrize("density", [0.5, 10.0])
def test_gated_ffn_bf16_real_shapes(d, f, m, density):
    p = _problem(m, d, f, density, seed=m + d)
    _poison_allocator()
    out = ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    ref = dense_gated_ffn(*(p[k].float() for k in ("x", "w_gate", "w_up", "w_down")), precision="fp32")
    assert not bool(torch.isnan(out).any())
    assert rel_error(out, ref) <= REL_TOL[torch.bfloat16]


@pytest.mark.parametrize("m", [131072, 524288])
def test_large_token_counts(m):
    p = _problem(m, 2048, 5632, 0.5, seed=1)
    _poison_allocator()
    out = ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    idx = torch.randint(0, m, (4096,), device="cuda")
    idx[0], idx[1] = 0, m - 1  # first and last token: int64 addressing at the far end
    sub = {k: p[k] for k in ("w_gate", "w_up", "w_down")}
    ref = dense_gated_ffn(p["x"][idx].float(), *(sub[k].float() for k in ("w_gate", "w_up", "w_down")),
                          precision="fp32")
    assert not bool(torch.isnan(out).any())
    assert rel_error(out[idx], ref) <= REL_TOL[torch.bfloat16]


def test_gate_counts_match_dense_gate():
    p = _problem(4096, 2048, 5632, 2.0, seed=3)
    gate = ops.gate_twell(p["x"], p["w_gate"])
    dense = torch.relu(torch.nn.functional.linear(p["x"], p["w_gate"]))
    # Tensor-core accumulation order may differ from cuBLAS's; count mismatches come only from values
    # that round to exactly 0 one way and not the other, which are vanishingly rare on random data.
    ref_counts = (dense != 0).view(4096, -1, 128).sum(-1)
    assert (gate.counts != ref_counts).float().mean().item() < GATE_COUNT_MISMATCH_FRACTION
    assert rel_error(gate.to_dense(), dense) <= REL_TOL[torch.bfloat16]


def test_runs_on_current_stream_and_in_cuda_graph():
    p = _problem(1024, 2048, 5632, 1.0, seed=4)
    expect = ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    s.synchronize()
    assert torch.equal(out, expect)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graph_out = ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, expect)
