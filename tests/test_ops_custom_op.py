"""torch.ops.twell.sparse_gated_ffn: same result as the Python op, and capturable by torch.compile."""

from __future__ import annotations

import torch

import twell.ops as ops
from twell.ops.custom_ops import sparse_gated_ffn_op  # noqa: F401 - registers torch.ops.twell.*
from twell.tolerances import REL_TOL, rel_error


def _problem(device, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 32, generator=gen)
    wg = torch.randn(96, 32, generator=gen) / 6 - 0.15
    wu = torch.randn(96, 32, generator=gen) / 6
    wd = torch.randn(32, 96, generator=gen) / 10
    return [t.to(device=device, dtype=dtype) for t in (x, wg, wu, wd)]


def test_custom_op_matches_python_op(device):
    x, wg, wu, wd = _problem(device)
    out, counts = torch.ops.twell.sparse_gated_ffn(x, wg, wu, wd, 32, 0, "match", "auto", "auto")
    ref, ref_counts = ops.sparse_gated_ffn(x, wg, wu, wd, tile=32, return_counts=True)
    assert torch.equal(out, ref) and torch.equal(counts, ref_counts)
    assert counts.dtype == torch.int32 and counts.shape == (12, 3)


def test_custom_op_passes_opcheck(device):
    x, wg, wu, wd = _problem(device)
    torch.library.opcheck(torch.ops.twell.sparse_gated_ffn.default, (x, wg, wu, wd, 32, 0, "match", "auto", "auto"),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_captures_the_op_without_graph_breaks(device):
    x, wg, wu, wd = _problem(device)

    def ffn(x):
        out, counts = torch.ops.twell.sparse_gated_ffn(x, wg, wu, wd, 32, 0, "match", "auto", "auto")
        return out * 2, counts.sum()

    compiled = torch.compile(ffn, backend="aot_eager", fullgraph=True)
    out, nnz = compiled(x)
    ref, ref_counts = ops.sparse_gated_ffn(x, wg, wu, wd, tile=32, return_counts=True)
    assert rel_error(out, ref * 2) <= REL_TOL[torch.float32]
    assert int(nnz) == int(ref_counts.sum())


def _hot_cold_args(device):
    x, wg, wu, wd = _problem(device)
    plan = ops.build_hot_cold_plan(wg, wu, wd, torch.tensor([3, 10, 50, 95]))
    return (x, wg, wu, wd, plan.hot, plan.cold, plan.w_gemm, plan.w_down_hot_t, 32, 0, "auto"), plan


def test_hot_cold_custom_op_matches_python_op_and_passes_opcheck(device):
    args, plan = _hot_cold_args(device)
    out, counts = torch.ops.twell.hot_cold_gated_ffn(*args)
    x, wg, wu, wd = args[:4]
    ref, ref_counts = ops.hot_cold_gated_ffn(x, wg, wu, wd, plan, tile=32, return_counts=True)
    assert torch.equal(out, ref) and torch.equal(counts, ref_counts)
    assert counts.shape == (12, 3 + 1)  # 92 cold columns -> 3 tiles of 32, 4 hot units -> 1 tile
    assert rel_error(out, ops.sparse_gated_ffn(x, wg, wu, wd, tile=32)) <= REL_TOL[torch.float32]
    torch.library.opcheck(torch.ops.twell.hot_cold_gated_ffn.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_decode_custom_op_matches_python_op_passes_opcheck_and_compiles(device):
    x, wg, wu, wd = _problem(device)
    wdt = wd.t().contiguous()
    backend = "triton" if device.type == "cuda" else "torch"
    out, counts = torch.ops.twell.decode_gated_ffn_unchecked(x, wg, wu, wdt, "match", backend)
    assert torch.equal(out, ops.decode_gated_ffn(x, wg, wu, wd, backend=backend))
    assert counts.shape == (12, 6) and counts.dtype == torch.int32  # 96 units in blocks of 16
    assert torch.equal(counts.sum(1).cpu(), ((x @ wg.T) > 0).sum(1).to(torch.int32).cpu())
    torch.library.opcheck(torch.ops.twell.decode_gated_ffn_unchecked.default, (x, wg, wu, wdt, "match", backend),
                          test_utils=("test_schema", "test_faketensor"))

    def ffn(x):
        out, counts = torch.ops.twell.decode_gated_ffn_unchecked(x, wg, wu, wdt, "match", backend)
        return out * 2, counts.sum()

    got, nnz = torch.compile(ffn, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(got, out * 2) and int(nnz) == int(counts.sum())
