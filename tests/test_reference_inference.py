"""Reference inference ops (twell.reference.inference / .stats) against dense masked math."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _helpers import F64, make_inputs

import twell.format.twell as twell_format
from twell.format.twell import TwellTensor, pack_twell
from twell.reference import (
    PRECISIONS,
    check_precision,
    dead_units,
    dense_gated_ffn,
    dense_relu_ffn,
    gate_twell,
    l0,
    l1,
    row_l0,
    twell_gated_ffn,
    twell_relu_ffn,
    unit_frequency,
)
from twell.reference import inference as inference_mod
from twell.tolerances import (
    ABS_TOL_FP64_STAT,
    FP32_ROUNDING_TOL,
    FP32_UNIT_ABS_TOL,
    REL_TOL,
    REL_TOL_FP64_CHUNKED,
    rel_error,
)

DENSITIES = [0.0, 0.005, 0.05, 0.5, 1.0]




def masked_truth(x, w_gate, w_up, w_down):
    """Dense float64 ``(relu(x Wg^T) * (x Wu^T)) Wd^T`` and the gate activation."""
    x, w_gate, w_up, w_down = (t.to(F64) for t in (x, w_gate, w_up, w_down))
    a = torch.relu(x @ w_gate.T)
    return (a * (x @ w_up.T)) @ w_down.T, a


# ------------------------------------------------------------------------------------------- float64 exactness
@pytest.mark.parametrize("density", DENSITIES)
def test_gated_float64_matches_masked_math(density):
    x, wg, wu, wd = make_inputs(64, 32, 256, density, seed=1)
    ref, a = masked_truth(x, wg, wu, wd)
    gate = gate_twell(x, wg, tile=64)
    assert int(gate.row_nnz().sum()) == int((a != 0).sum())
    assert int((a != 0).sum()) == round(density * 64 * 256)
    for precision in PRECISIONS:
        out = twell_gated_ffn(x, gate, wu, wd, precision=precision)
        assert out.dtype == F64 and out.shape == (64, 32)
        assert rel_error(out, ref) < REL_TOL[F64]
        assert rel_error(dense_gated_ffn(x, wg, wu, wd, precision=precision), ref) < REL_TOL[F64]
    if density == 0.0:
        assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("density", DENSITIES)
def test_relu_float64_matches_masked_math(density):
    x, wu, _, wd = make_inputs(32, 24, 300, density, seed=2)
    ref = torch.relu(x @ wu.T) @ wd.T
    act = gate_twell(x, wu, tile=64)
    for precision in PRECISIONS:
        out = twell_relu_ffn(x, act, wd, precision=precision)
        assert rel_error(out, ref) < REL_TOL[F64]
        assert rel_error(dense_relu_ffn(x, wu, wd, precision=precision), ref) < REL_TOL[F64]
    if density == 0.0:
        assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("m", [0, 1, 7])
def test_small_and_empty_batches(m):
    x, wg, wu, wd = make_inputs(m, 16, 100, 0.3, seed=3)
    ref, _ = masked_truth(x, wg, wu, wd)
    gate = gate_twell(x, wg, tile=32)
    assert gate.shape == (m, 100)
    out = twell_gated_ffn(x, gate, wu, wd)
    assert out.shape == (m, 16)
    assert rel_error(out, ref) < REL_TOL[F64]
    assert twell_relu_ffn(x, gate_twell(x, wu, tile=32), wd).shape == (m, 16)


@pytest.mark.parametrize("capacity", [1, 2, 8])
def test_overflow_tiles(capacity):
    x, wg, wu, wd = make_inputs(16, 24, 300, 0.5, seed=4)
    gate = gate_twell(x, wg, tile=64, capacity=capacity)
    assert gate.n_overflow() > 0
    ref, _ = masked_truth(x, wg, wu, wd)
    assert rel_error(twell_gated_ffn(x, gate, wu, wd), ref) < REL_TOL[F64]
    assert rel_error(twell_relu_ffn(x, gate, wd), torch.relu(x @ wg.T) @ wd.T) < REL_TOL[F64]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_recompute_container(dtype):
    """Overflowing row-tiles kept by recomputation (what the fused gate kernel writes), not by spill."""
    x, wg, wu, wd = make_inputs(16, 24, 300, 0.5, seed=15, dtype=dtype)
    spilled = gate_twell(x, wg, tile=64, capacity=2)
    recomputed = dataclasses.replace(spilled, spill_values=None, source=(x, wg))
    assert recomputed.n_overflow() > 0
    # The recomputed gate sums in another order (einsum vs matmul), so agreement is to rounding, not bitwise.
    assert rel_error(twell_gated_ffn(x, recomputed, wu, wd), twell_gated_ffn(x, spilled, wu, wd)) < REL_TOL[dtype]


def test_empty_rows():
    empty = (0, 3, 9)
    x, wg, wu, wd = make_inputs(12, 16, 128, 0.05, seed=5, empty_rows=empty)
    gate = gate_twell(x, wg, tile=64)
    nnz = gate.row_nnz()
    assert all(int(nnz[r]) == 0 for r in empty)
    assert int(nnz.sum()) > 0
    out = twell_gated_ffn(x, gate, wu, wd)
    ref, _ = masked_truth(x, wg, wu, wd)
    assert rel_error(out, ref) < REL_TOL[F64]
    for r in empty:
        assert torch.equal(out[r], torch.zeros(16, dtype=F64))


@pytest.mark.parametrize("tile", [64, 128, 512])
def test_awkward_sizes(tile):
    x, wg, wu, wd = make_inputs(9, 24, 300, 0.2, seed=6)
    gate = gate_twell(x, wg, tile=tile)
    assert gate.n_tiles == -(-300 // tile)
    ref, _ = masked_truth(x, wg, wu, wd)
    assert rel_error(twell_gated_ffn(x, gate, wu, wd), ref) < REL_TOL[F64]


def test_chunking_does_not_change_the_result(monkeypatch):
    x, wg, wu, wd = make_inputs(32, 24, 200, 0.3, seed=7)
    gate = gate_twell(x, wg, tile=64)
    whole = twell_gated_ffn(x, gate, wu, wd)
    monkeypatch.setattr(inference_mod, "_MAX_CHUNK_ELEMENTS", 100)  # ~4 pairs per chunk
    chunked = twell_gated_ffn(x, gate, wu, wd)
    assert rel_error(chunked, whole) < REL_TOL_FP64_CHUNKED


def test_sparse_ops_never_densify(monkeypatch):
    x, wg, wu, wd = make_inputs(16, 16, 128, 0.5, seed=8)
    gate = gate_twell(x, wg, tile=32, capacity=2)
    ref = twell_gated_ffn(x, gate, wu, wd)

    def boom(*args, **kwargs):
        raise AssertionError("densified the activation")

    monkeypatch.setattr(TwellTensor, "to_dense", boom)
    monkeypatch.setattr(twell_format, "unpack_twell", boom)
    assert torch.equal(twell_gated_ffn(x, gate, wu, wd), ref)
    twell_relu_ffn(x, gate, wd)


# ------------------------------------------------------------------------------------------- low precision
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_low_precision_twell_matches_dense(dtype, precision):
    x, wg, wu, wd = make_inputs(48, 32, 256, 0.1, seed=9, dtype=dtype)
    gate = gate_twell(x, wg, tile=64)
    out = twell_gated_ffn(x, gate, wu, wd, precision=precision)
    dense = dense_gated_ffn(x, wg, wu, wd, precision=precision)
    assert out.dtype == dtype and dense.dtype == dtype
    assert rel_error(out, dense) < REL_TOL[dtype]
    truth, _ = masked_truth(x, wg, wu, wd)
    assert rel_error(out, truth) < REL_TOL[dtype]
    act = gate_twell(x, wu, tile=64)
    assert rel_error(twell_relu_ffn(x, act, wd, precision=precision), dense_relu_ffn(x, wu, wd)) < REL_TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gate_is_rounded_dense_gate(dtype):
    x, wg, _, _ = make_inputs(20, 32, 200, 0.2, seed=10, dtype=dtype)
    gate = gate_twell(x, wg, tile=64, capacity=4)
    expected = torch.relu((x.float() @ wg.float().T).to(dtype))
    assert torch.equal(gate.to_dense(), expected)


def test_float32_match_is_plain_pytorch():
    x, wg, wu, wd = make_inputs(16, 32, 128, 0.3, seed=11, dtype=torch.float32)
    plain = (torch.relu(x @ wg.T) * (x @ wu.T)) @ wd.T
    assert rel_error(dense_gated_ffn(x, wg, wu, wd), plain) < FP32_ROUNDING_TOL
    assert rel_error(twell_gated_ffn(x, gate_twell(x, wg), wu, wd), plain) < FP32_ROUNDING_TOL


def test_fp32_precision_is_more_accurate_for_bf16():
    err = {p: [] for p in PRECISIONS}
    for seed in range(8):
        x, wg, wu, wd = make_inputs(64, 64, 256, 0.2, seed=100 + seed, dtype=torch.bfloat16)
        truth, _ = masked_truth(x, wg, wu, wd)
        gate = gate_twell(x, wg, tile=64)
        for p in PRECISIONS:
            err[p].append(rel_error(twell_gated_ffn(x, gate, wu, wd, precision=p), truth))
    assert sum(err["fp32"]) < sum(err["match"])


# ------------------------------------------------------------------------------------------- NaN policy
def test_nan_policy():
    x, wg, wu, wd = make_inputs(4, 8, 16, 0.5, seed=12)
    x[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        gate_twell(x, wg, nan_policy="raise")
    with pytest.raises(ValueError, match="nan_policy"):
        gate_twell(x, wg, nan_policy="ignore")
    out = twell_gated_ffn(x, gate_twell(x, wg), wu, wd)
    assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2, 3]]).any()


# ------------------------------------------------------------------------------------------- stats
def test_stats_dense_and_twell_agree():
    x, wg, _, _ = make_inputs(40, 16, 300, 0.05, seed=13)
    gate = gate_twell(x, wg, tile=64, capacity=2)
    dense = gate.to_dense()
    counts = (dense != 0).sum(dim=1)
    for act in (dense, gate):
        assert torch.equal(row_l0(act), counts.to(torch.int64))
        assert row_l0(act).dtype == torch.int64
        assert abs(float(l0(act)) - float(counts.double().mean())) < FP32_ROUNDING_TOL
        freq = unit_frequency(act)
        assert freq.shape == (300,)
        assert torch.allclose(freq.double(), (dense != 0).double().mean(dim=0), atol=FP32_UNIT_ABS_TOL)
        assert torch.equal(dead_units(act), (dense != 0).sum(dim=0) == 0)
        assert abs(float(l1(act)) - float(dense.abs().sum(dim=1).mean())) < ABS_TOL_FP64_STAT
    assert bool(dead_units(gate).any())  # 5 % density over 40 rows leaves some units silent


def test_stats_empty_batch():
    act = torch.zeros(0, 10)
    assert row_l0(act).shape == (0,)
    assert float(l0(act)) == 0.0 and float(l1(act)) == 0.0
    assert torch.equal(unit_frequency(act), torch.zeros(10))
    assert bool(dead_units(act).all())
    packed = pack_twell(act, tile=4)
    assert float(l0(packed)) == 0.0 and float(l1(packed)) == 0.0


def test_l1_is_differentiable_and_normalised():
    h = torch.tensor([[1.0, -2.0, 0.0], [0.0, 0.0, 3.0]], dtype=F64, requires_grad=True)
    loss = l1(h)
    assert float(loss.detach()) == 3.0  # (3 + 3) / 2 rows
    loss.backward()
    assert torch.equal(h.grad, torch.tensor([[0.5, -0.5, 0.0], [0.0, 0.0, 0.5]], dtype=F64))


def test_stats_bad_input():
    with pytest.raises(ValueError, match="dimensions"):
        row_l0(torch.zeros(3))
    with pytest.raises(TypeError, match="torch.Tensor"):
        l0([[1.0]])
    with pytest.raises(TypeError, match="dtype"):
        l1(torch.zeros(2, 2, dtype=torch.int32))


# ------------------------------------------------------------------------------------------- bad inputs
def _good():
    x, wg, wu, wd = make_inputs(4, 8, 16, 0.5, seed=14)
    return x, wg, wu, wd, gate_twell(x, wg, tile=8)


def test_bad_precision():
    x, wg, wu, wd, gate = _good()
    with pytest.raises(ValueError, match="precision"):
        twell_gated_ffn(x, gate, wu, wd, precision="bf16")
    with pytest.raises(ValueError, match="precision"):
        dense_gated_ffn(x, wg, wu, wd, precision="exact")
    with pytest.raises(ValueError, match="precision"):
        dense_relu_ffn(x, wu, wd, precision="")
    with pytest.raises(ValueError, match="precision"):
        twell_relu_ffn(x, gate, wd, precision="FP32")
    with pytest.raises(TypeError, match="precision"):
        check_precision(None)
    assert check_precision("fp32") == "fp32"


def test_wrong_rank():
    x, wg, wu, wd, gate = _good()
    with pytest.raises(ValueError, match=r"x must have 2 dimensions.*\(1, 4, 8\)"):
        dense_gated_ffn(x.unsqueeze(0), wg, wu, wd)
    with pytest.raises(ValueError, match="x must have 2 dimensions"):
        gate_twell(x[0], wg)
    with pytest.raises(ValueError, match="w_down must have 2 dimensions"):
        twell_gated_ffn(x, gate, wu, wd.flatten())


def test_mismatched_d_names_both_shapes():
    x, wg, wu, wd, gate = _good()
    with pytest.raises(ValueError, match=r"w_gate has shape \(16, 7\) but x has shape \(4, 8\)"):
        gate_twell(x, wg[:, :7])
    with pytest.raises(ValueError, match=r"w_up has shape \(16, 7\) but x has shape \(4, 8\)"):
        twell_gated_ffn(x, gate, wu[:, :7], wd)
    with pytest.raises(ValueError, match=r"w_down has shape \(7, 16\) but x has shape \(4, 8\)"):
        dense_gated_ffn(x, wg, wu, wd[:7])
    with pytest.raises(ValueError, match=r"w_down has shape \(7, 16\) but x has shape \(4, 8\)"):
        twell_relu_ffn(x, gate, wd[:7])


def test_mismatched_f_names_both_shapes():
    x, wg, wu, wd, gate = _good()
    with pytest.raises(ValueError, match=r"w_up has shape \(15, 8\) but w_gate has shape \(16, 8\)"):
        dense_gated_ffn(x, wg, wu[:15], wd)
    with pytest.raises(ValueError, match=r"w_down has shape \(8, 15\).*w_gate has shape \(16, 8\)"):
        dense_gated_ffn(x, wg, wu, wd[:, :15])
    with pytest.raises(ValueError, match=r"w_down has shape \(8, 15\).*w_up has shape \(16, 8\)"):
        dense_relu_ffn(x, wu, wd[:, :15])
    with pytest.raises(ValueError, match=r"gate has shape \(4, 16\).*w_up has shape \(15, 8\)"):
        twell_gated_ffn(x, gate, wu[:15], wd[:, :15])


def test_gate_container_of_wrong_shape_or_type():
    x, wg, wu, wd, gate = _good()
    with pytest.raises(ValueError, match=r"gate has shape \(3, 16\) but x has shape \(4, 8\)"):
        twell_gated_ffn(x, gate_twell(x[:3], wg, tile=8), wu, wd)
    with pytest.raises(ValueError, match=r"act has shape \(3, 16\) but x has shape \(4, 8\)"):
        twell_relu_ffn(x, gate_twell(x[:3], wg, tile=8), wd)
    with pytest.raises(TypeError, match="gate must be a TwellTensor"):
        twell_gated_ffn(x, gate.to_dense(), wu, wd)
    with pytest.raises(TypeError, match="act must be a TwellTensor"):
        twell_relu_ffn(x, torch.relu(x @ wg.T), wd)


def test_int_and_mixed_dtypes():
    x, wg, wu, wd, gate = _good()
    with pytest.raises(TypeError, match="x has dtype int64"):
        dense_gated_ffn(x.long(), wg, wu, wd)
    with pytest.raises(TypeError, match="w_gate has dtype int32"):
        gate_twell(x, wg.int())
    with pytest.raises(TypeError, match="w_up has dtype float32 but x has float64"):
        dense_gated_ffn(x, wg, wu.float(), wd)
    with pytest.raises(TypeError, match="w_down has dtype bfloat16 but x has float64"):
        twell_gated_ffn(x, gate, wu, wd.bfloat16())
    with pytest.raises(TypeError, match="gate.values has dtype float32 but x has float64"):
        twell_gated_ffn(x, gate_twell(x.float(), wg.float(), tile=8), wu, wd)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        dense_relu_ffn(x.tolist(), wu, wd)
