"""The hot/cold split's tail with the cold pairs in the hot down GEMM's epilogue (``twell.ops.cold_down_kernel``,
``hot_cold.COLD_IN_DOWN_GEMM``) against the shipped tail (fp32 hot partial, then the row-gather kernel).

On exact-grid inputs (test_ops_kernels.make_problem: every product and sum exact, so no summation order
shows) both tails give the same bits, on every path: tokens listed, tokens left to the row kernel (an
overflowing tile, more than ``LIST`` cold pairs), fused and unfused gate plans, column indices and unit ids.
Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_hot_cold import CASES as HOT_COLD_CASES
from test_ops_hot_cold import _plan, _run
from test_ops_kernels import make_problem

from twell import ops
from twell.ops import cold_down_kernel, hot_cold
from twell.ops.cold_down_kernel import down_cold_supported, launch_down_cold
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.hot_cold_plan import build_hot_cold_plan
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.tolerances import REL_TOL, rel_error


def _both(monkeypatch, fn) -> tuple:
    """``fn()`` with the shipped tail, then with the cold pairs in the down GEMM, and how often the new
    tail ran."""
    calls = []
    real = hot_cold.launch_down_cold

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(hot_cold, "launch_down_cold", spy)
    monkeypatch.setattr(hot_cold, "COLD_IN_DOWN_GEMM", False)
    off = fn()
    assert not calls
    monkeypatch.setattr(hot_cold, "COLD_IN_DOWN_GEMM", True)
    return off, fn(), len(calls)


# the hot/cold op's cases (overflowing cold tiles among them) plus two row blocks of the interpreter's BM
CASES = [*HOT_COLD_CASES, (40, 32, 256, 32, 4, 0.06, 32)]


@pytest.mark.parametrize("fused", [False, True], ids=["unfused-gate", "fused-gate"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-t{c[3]}-c{c[4]}-h{c[6]}" for c in CASES])
def test_same_bits_as_the_shipped_tail(case, dtype, fused, device, monkeypatch):
    m, d, f, tile, cap, frac, n_hot = case
    p = make_problem(m, d, f, frac_pos=frac, seed=11 + n_hot, dtype=dtype, device=device)
    plan = _plan(p, n_hot)
    if fused:
        plan = build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"], plan.hot, fused_tile=tile)
    (out_off, counts_off), (out_on, counts_on), calls = _both(
        monkeypatch, lambda: _run(p, plan, "triton", tile=tile, capacity=cap))
    assert torch.equal(out_on, out_off) and torch.equal(counts_on, counts_off)
    assert calls == int(0 < n_hot < f)  # every call with hot and cold units takes the new tail here


def _container(m: int, d: int, f: int, n_hot: int, tile: int, cap: int, frac: float, device, seed: int = 5):
    p = make_problem(m, d, f, frac_pos=frac, seed=seed, dtype=torch.bfloat16, device=device)
    plan = _plan(p, n_hot)
    gu = torch.nn.functional.linear(p["x"], plan.w_gemm)
    h_hot, _ = hot_cold.launch_hot_hidden(gu, n_hot, f, tile)
    cold = launch_pack_twell(gu[:, n_hot:f], tile, cap, unit_map=plan.cold)
    return p, plan, h_hot, cold


def test_listed_tokens_written_the_rest_left_with_their_hot_partial(device, monkeypatch):
    """Alone, the two kernels write ``out`` for exactly the tokens they flag (no overflowing tile, at most
    LIST cold pairs), equal to the shipped tail there, and the exact fp32 hot partial to ``init`` for the
    others, whose ``out`` rows they leave as they were (poisoned with NaN here)."""
    monkeypatch.setattr(cold_down_kernel, "LIST", 4)
    m, d, f, n_hot, tile, cap = 37, 32, 256, 32, 32, 4
    p, plan, h_hot, (v, i, c) = _container(m, d, f, n_hot, tile, cap, 0.01, device)
    c = c.clone()
    c[5, 1] = cap + 1  # an overflowing tile (the row kernel recomputes it)
    listed = ((c <= cap).all(1) & (c.sum(1) <= 4)).cpu()
    assert 0 < int(listed.sum()) < m and not bool(listed[5])
    wdt = p["w_down"].t().contiguous()
    out = torch.full((m, d), float("nan"), dtype=torch.bfloat16, device=device)
    init, taken = launch_down_cold(p["x"], h_hot, plan.w_down_hot_t, v, i, c, p["w_up"], wdt, tile=tile,
                                   unit_map=plan.cold, idx_is_unit=True, out=out)
    assert taken.dtype == torch.int8 and torch.equal(taken.bool().cpu(), listed)
    hot_partial = h_hot.float() @ plan.w_down_hot_t.float()
    assert torch.equal(init[~listed].cpu(), hot_partial[~listed].cpu())
    want = launch_twell_ffn(p["x"], v, i, c, None, None, p["w_gate"], p["w_up"], wdt, n_cols=f - n_hot, tile=tile,
                            round_hidden=True, out=torch.empty_like(out), unit_map=plan.cold, init=hot_partial,
                            idx_is_unit=True)
    assert torch.equal(out[listed], want[listed]) and bool(torch.isnan(out[~listed]).all())
    launch_twell_ffn(p["x"], v, i, c, None, None, p["w_gate"], p["w_up"], wdt, n_cols=f - n_hot, tile=tile,
                     round_hidden=True, out=out, unit_map=plan.cold, init=init, idx_is_unit=True, taken=taken)
    assert torch.equal(out, want)  # the row kernel fills in exactly the rest


def test_empty_rows_and_nan(device, monkeypatch):
    """A token with no cold pair gets its hot partial alone; a NaN gate reaches the output as in the
    shipped tail."""
    m, d, f, n_hot, tile, cap = 6, 32, 128, 32, 32, 32
    p = make_problem(m, d, f, frac_pos=0.1, seed=9, dtype=torch.bfloat16, device=device)
    p["x"][1] = 0.0
    p["x"][3, 2] = float("nan")
    plan = _plan(p, n_hot)
    (off, _), (on, _), calls = _both(monkeypatch, lambda: _run(p, plan, "triton", tile=tile, capacity=cap))
    assert calls == 1 and torch.equal(on[1].cpu(), torch.zeros(d, dtype=on.dtype))
    assert bool(torch.isnan(on[3]).all()) and not bool(torch.isnan(on[[0, 1, 2, 4, 5]]).any())
    assert torch.equal(on[[0, 1, 2, 4, 5]], off[[0, 1, 2, 4, 5]])


@pytest.mark.parametrize(("dtype", "n_hot", "d"), [(torch.float32, 32, 32), (torch.bfloat16, 4, 32),
                                                   (torch.bfloat16, 0, 32), (torch.bfloat16, 32, 12)],
                         ids=["fp32", "hot-rows-of-8-bytes", "no-hot-unit", "d-rows-of-24-bytes"])
def test_calls_it_cannot_take_keep_the_shipped_tail(dtype, n_hot, d, device, monkeypatch):
    """fp32 (no tensor-core dtype), h_hot or Wd^T rows that TMA cannot read (not a multiple of 16 bytes),
    no hot unit: the shipped tail, same results."""
    p = make_problem(7, d, 128, frac_pos=0.1, seed=2, dtype=dtype, device=device)
    plan = _plan(p, n_hot)
    assert not down_cold_supported(p["x"], n_hot)
    (off, _), (on, _), calls = _both(monkeypatch, lambda: _run(p, plan, "triton", tile=32, capacity=4))
    assert calls == 0 and torch.equal(on, off)
    assert rel_error(on, _run(p, plan, "torch", tile=32, capacity=4)[0]) <= REL_TOL[dtype]


def test_taken_and_tensor_cores_are_exclusive(device):
    p, plan, h_hot, (v, i, c) = _container(4, 32, 128, 32, 32, 4, 0.1, device)
    taken = torch.zeros(4, dtype=torch.int8, device=device)
    with pytest.raises(ValueError, match="taken"):
        launch_twell_ffn(p["x"], v, i, c, None, None, p["w_gate"], p["w_up"], p["w_down"].t().contiguous(),
                         n_cols=96, tile=32, round_hidden=True, out=torch.empty_like(p["x"]), unit_map=plan.cold,
                         idx_is_unit=True, taken=taken, tensor_cores=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["unfused-gate", "fused-gate"])
def test_gpu_real_shape(fused, monkeypatch):
    """d=2048, F=5632, 8192 synthetic tokens at ~0.5 % density, hot units as the module picks them: within
    the bf16 tolerance of the shipped tail (the fp32 sums are grouped differently) and of an fp32 dense FFN."""
    from twell.reference import inference as ref
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    dev = torch.device("cuda")
    q = synthetic_ffn_problem(8192, 2048, 5632, SparsityProfile(mean_l0=28.0),
                              generator=torch.Generator(device=dev).manual_seed(1), device=dev)
    hot = ops.choose_hot_units(ops.unit_frequency(q["x"], q["w_gate"]))
    plan = build_hot_cold_plan(q["w_gate"], q["w_up"], q["w_down"], hot, fused_tile=128 if fused else 0)
    wdt = q["w_down"].t().contiguous()
    (off, _), (on, _), calls = _both(monkeypatch, lambda: hot_cold.launch_hot_cold_ffn(
        q["x"], plan, q["w_gate"], q["w_up"], wdt, tile=128, capacity=16))
    assert calls == 1
    assert rel_error(on, off) <= REL_TOL[torch.bfloat16]
    want = ref.dense_gated_ffn(q["x"].float(), q["w_gate"].float(), q["w_up"].float(), q["w_down"].float(),
                               precision="fp32")
    assert rel_error(on, want) <= REL_TOL[torch.bfloat16]
