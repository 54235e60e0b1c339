"""The hot/cold split's hot down GEMM in Triton (``twell.ops.hot_down_kernel``, ``hot_cold.HOT_DOWN_TRITON``).

Operands on the exact grid (small multiples of 1/8: every product and fp32 partial sum exact) make the
kernel's fp32 output equal to a float64 matmul bit for bit, whatever its summation order; the op with the
kernel on equals the op with it off.  Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_hot_cold import CASES as HOT_COLD_CASES
from test_ops_hot_cold import _plan, _run
from test_ops_kernels import _grid_values, make_problem

from twell.ops import hot_cold
from twell.ops._runtime import interpreting
from twell.ops.hot_cold_plan import build_hot_cold_plan
from twell.ops.hot_down_kernel import _INTERPRET_CONFIG, hot_down_supported, launch_hot_down
from twell.tolerances import REL_TOL, rel_error


def _operands(m: int, n_hot: int, d: int, dtype: torch.dtype, device, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    h = _grid_values((m, n_hot), gen).clamp_min(0)  # ReLU-gated hidden values: many zeros
    w = _grid_values((n_hot, d), gen)
    return h.to(dtype=dtype, device=device), w.to(dtype=dtype, device=device)


def _exact(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (h.double() @ w.double()).float()


# both epilogues: the tile through shared memory by TMA, and straight from registers
STORES = [pytest.param(True, id="tma-store"), pytest.param(False, id="pointer-store")]
SIZES = [
    # m, H, d: edges on every side of the interpreter's 16 x 32 x 16 tiles
    (1, 8, 8),
    (7, 16, 24),
    (37, 72, 64),  # H not a multiple of BK: TMA's zero padding ends the last K step
    (40, 24, 200),  # d not a multiple of BN: the last column tile clipped
]


@pytest.mark.parametrize("tma_store", STORES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("m", "n_hot", "d"), SIZES, ids=[f"m{m}-h{h}-d{d}" for m, h, d in SIZES])
def test_equals_the_exact_product(m, n_hot, d, dtype, tma_store, device):
    h, w = _operands(m, n_hot, d, dtype, device, seed=m + n_hot)
    assert hot_down_supported(h, w)
    config = (*_INTERPRET_CONFIG[:5], tma_store) if interpreting() else None
    out = launch_hot_down(h, w, config)
    if not interpreting():  # the GPU's own configuration, then the other store as well
        other = launch_hot_down(h, w, (128, 128, 64, 2, 4, tma_store))
        assert torch.equal(other, out)
    assert out.dtype == torch.float32 and out.shape == (m, d)
    assert torch.equal(out, _exact(h, w))


def test_no_token_and_no_hot_unit(device):
    h, w = _operands(0, 16, 32, torch.bfloat16, device)
    assert launch_hot_down(h, w).shape == (0, 32)
    h, w = _operands(5, 0, 32, torch.bfloat16, device)
    out = launch_hot_down(h, w)
    assert out.shape == (5, 32) and not bool(out.any())


@pytest.mark.parametrize(("dtype", "n_hot", "d", "transposed"),
                         [(torch.float32, 16, 32, False), (torch.bfloat16, 4, 32, False),
                          (torch.bfloat16, 16, 12, False), (torch.bfloat16, 16, 32, True)],
                         ids=["fp32", "hot-rows-of-8-bytes", "d-rows-of-24-bytes", "non-contiguous"])
def test_operands_it_cannot_take(dtype, n_hot, d, transposed, device):
    """fp32 (no tensor-core dtype), rows TMA cannot read (not a multiple of 16 bytes), a transposed view:
    not supported, so the split keeps cuBLAS for them."""
    h, w = _operands(5, n_hot, d, dtype, device)
    if transposed:
        w = w.t().contiguous().t()
    assert not hot_down_supported(h, w)


def test_not_supported_off_the_interpreter_on_the_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    h, w = _operands(5, 16, 32, torch.bfloat16, torch.device("cpu"))
    assert not hot_down_supported(h, w)


# two of the hot/cold op's cases (the second overflows its cold tiles) and an every-unit-cold one
CASES = [HOT_COLD_CASES[0], HOT_COLD_CASES[2], HOT_COLD_CASES[4]]


@pytest.mark.parametrize("fused", [False, True], ids=["unfused-gate", "fused-gate"])
@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-h{c[6]}" for c in CASES])
def test_op_same_bits_with_the_triton_hot_down(case, fused, device, monkeypatch):
    m, d, f, tile, cap, frac, n_hot = case
    p = make_problem(m, d, f, frac_pos=frac, seed=3 + n_hot, dtype=torch.bfloat16, device=device)
    plan = _plan(p, n_hot)
    if fused:
        plan = build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"], plan.hot, fused_tile=tile)
    calls = []
    real = hot_cold.launch_hot_down
    monkeypatch.setattr(hot_cold, "launch_hot_down", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(hot_cold, "HOT_DOWN_TRITON", False)
    out_off, counts_off = _run(p, plan, "triton", tile=tile, capacity=cap)
    assert not calls
    monkeypatch.setattr(hot_cold, "HOT_DOWN_TRITON", True)
    out_on, counts_on = _run(p, plan, "triton", tile=tile, capacity=cap)
    assert len(calls) == int(n_hot > 0)
    assert torch.equal(out_on, out_off) and torch.equal(counts_on, counts_off)


@pytest.mark.gpu
def test_gpu_real_shape(monkeypatch):
    """d=2048, F=5632, 8192 synthetic tokens at ~0.5 % density, hot units as the module picks them: the op
    with the Triton hot down GEMM within the bf16 tolerance of cuBLAS's (fp32 sums grouped differently) and
    of an fp32 dense FFN; the GEMM alone at 16,387 tokens equal to the exact product on grid operands."""
    from twell import ops
    from twell.reference import inference as ref
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    dev = torch.device("cuda")
    h, w = _operands(16387, 256, 2048, torch.bfloat16, dev, seed=4)
    assert torch.equal(launch_hot_down(h, w), _exact(h, w))
    q = synthetic_ffn_problem(8192, 2048, 5632, SparsityProfile(mean_l0=28.0),
                              generator=torch.Generator(device=dev).manual_seed(1), device=dev)
    hot = ops.choose_hot_units(ops.unit_frequency(q["x"], q["w_gate"]))
    plan = build_hot_cold_plan(q["w_gate"], q["w_up"], q["w_down"], hot, fused_tile=128)
    wdt = q["w_down"].t().contiguous()
    outs = {}
    for on in (False, True):
        monkeypatch.setattr(hot_cold, "HOT_DOWN_TRITON", on)
        outs[on] = hot_cold.launch_hot_cold_ffn(q["x"], plan, q["w_gate"], q["w_up"], wdt, tile=128, capacity=16)[0]
    assert rel_error(outs[True], outs[False]) <= REL_TOL[torch.bfloat16]
    want = ref.dense_gated_ffn(q["x"].float(), q["w_gate"].float(), q["w_up"].float(), q["w_down"].float(),
                               precision="fp32")
    assert rel_error(outs[True], want) <= REL_TOL[torch.bfloat16]
