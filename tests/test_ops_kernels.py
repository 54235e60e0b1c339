"""The Triton inference kernels against the pure-PyTorch reference.

On the CPU they run under TRITON_INTERPRET=1 (tiny shapes); on a GPU natively.  Inputs are drawn as
small multiples of 1/8 so that every product and partial sum of the gate GEMM is exact in fp32: the
kernel's gate values, counts and indices must then equal the reference's bit for bit, whatever the
accumulation order, and no gate value can flip sign through rounding.
"""

from __future__ import annotations

import pytest
import torch

import twell.ops as ops
from twell.format.twell import TwellTensor, pack_twell
from twell.reference import inference as ref
from twell.tolerances import REL_TOL, rel_error

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _grid_values(shape: tuple[int, ...], gen: torch.Generator, lo: int = -8, hi: int = 9) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=gen).to(torch.float32) / 8


def make_problem(m: int, d: int, f: int, *, frac_pos: float, seed: int, dtype: torch.dtype, device) -> dict:
    """Exact-grid x, weights; a bias channel (x[:, 0] = 1) sets roughly ``frac_pos`` of gates positive."""
    gen = torch.Generator().manual_seed(seed)
    x = _grid_values((m, d), gen)
    x[:, 0] = 1.0
    wg = _grid_values((f, d), gen, -2, 3) / 4
    # Shift each unit so about frac_pos of its gates are > 0: bias = -quantile of the rest.
    if m > 0:
        rest = x[:, 1:] @ wg[:, 1:].T
        q = torch.quantile(rest.float(), 1 - frac_pos, dim=0) if 0 < frac_pos < 1 else None
        if frac_pos <= 0:
            wg[:, 0] = -rest.max() - 1
        elif frac_pos >= 1:
            wg[:, 0] = -rest.min() + 1
        else:
            wg[:, 0] = -(torch.floor(q * 8) + 0.5) / 8  # half-grid offset: no gate is exactly 0
    wu = _grid_values((f, d), gen) / 4
    wd = _grid_values((d, f), gen) / 4
    return {k: v.to(dtype=dtype, device=device) for k, v in dict(x=x, w_gate=wg, w_up=wu, w_down=wd).items()}


def _assert_same_container(kern: TwellTensor, refc: TwellTensor) -> None:
    """Counts, and every live slot's value and index, equal bit for bit (padding is unspecified)."""
    assert torch.equal(kern.counts.cpu(), refc.counts.cpu())
    c = kern.capacity
    live = (torch.arange(c).view(1, 1, -1) < refc.counts.cpu().clamp(max=c).unsqueeze(-1))
    assert torch.equal(kern.values.cpu()[live], refc.values.cpu()[live])
    assert torch.equal(kern.indices.cpu()[live], refc.indices.cpu()[live])
    assert torch.equal(kern.to_dense().cpu(), refc.to_dense().cpu())


CASES = [
    # m, d, f, tile, capacity, frac_pos
    (7, 32, 128, 32, 4, 0.05),
    (1, 48, 200, 32, 4, 0.10),  # partial last tile (200 = 6 * 32 + 8), d not a multiple of 32
    (13, 24, 96, 16, 2, 0.30),  # many overflowing tiles -> recompute path
    (5, 16, 64, 64, 8, 0.0),  # nothing active
    (6, 16, 64, 32, 4, 1.0),  # fully dense: every tile overflows
]


@pytest.mark.parametrize("impl", ["fused", "gemm+pack"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_gate_kernel_matches_reference_bitwise(case, dtype, impl, device):
    m, d, f, tile, cap, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=hash(case) % 1000, dtype=dtype, device=device)
    kern = ops.gate_twell(p["x"], p["w_gate"], tile=tile, capacity=cap, backend="triton", impl=impl)
    refc = ref.gate_twell(p["x"].cpu(), p["w_gate"].cpu(), tile=tile, capacity=cap)
    kern.validate()
    _assert_same_container(kern, refc)


@pytest.mark.parametrize("method", ["row-gather", "block-union"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("precision", ["match", "fp32"])
def test_gated_ffn_kernel_matches_reference(case, dtype, precision, method, device):
    m, d, f, tile, cap, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=1 + hash(case) % 1000, dtype=dtype, device=device)
    out, counts = ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=tile, capacity=cap,
                                       precision=precision, backend="triton", method=method, return_counts=True)
    cpu = {k: v.cpu() for k, v in p.items()}
    expect = ref.dense_gated_ffn(cpu["x"], cpu["w_gate"], cpu["w_up"], cpu["w_down"], precision=precision)
    assert out.dtype == dtype and out.shape == (m, d)
    assert rel_error(out, expect) <= REL_TOL[dtype]
    gate = ref.gate_twell(cpu["x"], cpu["w_gate"], tile=tile, capacity=cap)
    assert torch.equal(counts.cpu(), gate.counts)
    if frac == 0.0:
        assert torch.count_nonzero(out) == 0


@pytest.mark.parametrize("method", ["row-gather", "block-union"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_ffn_kernel_matches_reference(dtype, method, device):
    p = make_problem(9, 32, 160, frac_pos=0.08, seed=5, dtype=dtype, device=device)
    out = ops.sparse_relu_ffn(p["x"], p["w_gate"], p["w_down"], tile=32, capacity=2,
                              backend="triton", method=method)
    cpu = {k: v.cpu() for k, v in p.items()}
    expect = ref.dense_relu_ffn(cpu["x"], cpu["w_gate"], cpu["w_down"])
    assert rel_error(out, expect) <= REL_TOL[dtype]


def test_kernel_reads_spill_area_of_packed_container(device):
    """A container from pack_twell (spill, no source) goes through the kernel's HAS_SPILL path."""
    dtype = torch.float32
    p = make_problem(11, 32, 128, frac_pos=0.4, seed=9, dtype=dtype, device=device)
    g = p["x"].cpu() @ p["w_gate"].cpu().T
    packed = pack_twell(g, tile=32, capacity=2)
    assert packed.n_overflow() > 0 and packed.spill_values is not None
    packed = TwellTensor(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                            for k, v in packed.__dict__.items()})
    out = ops.twell_gated_ffn(p["x"], packed, p["w_up"], p["w_down"], backend="triton")
    cpu = {k: v.cpu() for k, v in p.items()}
    expect = ref.dense_gated_ffn(cpu["x"], cpu["w_gate"], cpu["w_up"], cpu["w_down"])
    assert rel_error(out, expect) <= REL_TOL[dtype]


@pytest.mark.parametrize("method", ["row-gather", "block-union"])
def test_empty_rows_and_zero_tokens(method, device):
    p = make_problem(6, 16, 64, frac_pos=0.2, seed=3, dtype=torch.float32, device=device)
    p["x"][2] = 0.0  # an all-zero token: gate row exactly 0 -> empty row
    out = ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=32, backend="triton",
                               method=method)
    assert torch.count_nonzero(out[2]) == 0
    empty = ops.sparse_gated_ffn(p["x"][:0], p["w_gate"], p["w_up"], p["w_down"], tile=32, backend="triton",
                                 method=method)
    assert empty.shape == (0, 16)


@pytest.mark.parametrize("method", ["row-gather", "block-union"])
def test_nan_propagates_like_dense(method, device):
    p = make_problem(4, 16, 64, frac_pos=0.2, seed=4, dtype=torch.float32, device=device)
    p["x"][1, 3] = float("nan")
    out = ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=32, backend="triton",
                               method=method)
    cpu = {k: v.cpu() for k, v in p.items()}
    dense = ref.dense_gated_ffn(cpu["x"], cpu["w_gate"], cpu["w_up"], cpu["w_down"])
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(dense))
    assert bool(torch.isnan(out[1]).all()) and not bool(torch.isnan(out[0]).any())
    with pytest.raises(ValueError, match="NaN"):
        ops.gate_twell(p["x"], p["w_gate"], backend="triton", nan_policy="raise")


def test_bad_inputs_are_refused(device):
    p = make_problem(4, 16, 64, frac_pos=0.2, seed=4, dtype=torch.float32, device=device)
    with pytest.raises(TypeError, match="float64"):
        ops.gate_twell(p["x"].double(), p["w_gate"].double(), tile=32, backend="triton")
    with pytest.raises(ValueError, match="tile"):
        ops.gate_twell(p["x"], p["w_gate"], tile=48, backend="triton")
    with pytest.raises(ValueError, match=r"w_gate has shape"):
        ops.gate_twell(p["x"], p["w_gate"][:, :8], backend="triton")
    with pytest.raises(TypeError, match="dtype"):
        ops.gate_twell(p["x"], p["w_gate"].half(), backend="triton")
    with pytest.raises(ValueError, match="method"):
        ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], backend="triton", method="dense")
    with pytest.raises(ValueError, match="w_down"):
        ops.sparse_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"][:, :10], tile=32, backend="triton")
    with pytest.raises(ValueError, match="impl"):
        ops.gate_twell(p["x"], p["w_gate"], tile=32, backend="triton", impl="cublas")
    with pytest.raises(ValueError, match="backend"):
        ops.gate_twell(p["x"], p["w_gate"], backend="cuda")
    gate = ops.gate_twell(p["x"], p["w_gate"], tile=32, backend="triton")
    with pytest.raises(ValueError, match="w_down"):
        ops.twell_gated_ffn(p["x"], gate, p["w_up"], p["w_down"][:, :10], backend="triton")
    with pytest.raises(ValueError, match="shape"):
        ops.twell_gated_ffn(p["x"][:2], gate, p["w_up"], p["w_down"], backend="triton")
    with pytest.raises(ValueError, match="precision"):
        ops.twell_gated_ffn(p["x"], gate, p["w_up"], p["w_down"], precision="tf32", backend="triton")
    with pytest.raises(TypeError, match="TwellTensor"):
        ops.twell_gated_ffn(p["x"], torch.zeros(4, 64), p["w_up"], p["w_down"], backend="triton")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal of the Triton backend")
def test_triton_backend_on_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        ops.gate_twell(x, torch.randn(32, 16), tile=32, backend="triton")
