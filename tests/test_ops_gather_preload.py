"""The row-gather kernel with the row's TwELL container preloaded (``launch_twell_ffn(preload=True)``,
``twell_ffn_kernel.GATHER_PRELOAD``), with the next step's weight rows prefetched as well
(``prefetch``, ``GATHER_PREFETCH``), and with each step's Wu and Wd rows requested together
(``rows_together``, ``GATHER_ROWS_TOGETHER``), and walking each row's entries as a flat list written by a pass
before it (``listed``, ``GATHER_LISTED``, :mod:`twell.ops.twell_list_kernel`) against the per-step slot loads:
the same bits on every path the kernel has (gated / non-gated, overflow recompute, spill area, unit map, unit
ids, fp32 init rows, NaN, empty rows), and slots past a tile's count never read into the result.

Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_cold_unit_ids import used_slots
from test_ops_hot_cold import CASES as HOT_COLD_CASES
from test_ops_hot_cold import _plan, _run
from test_ops_kernels import CASES, make_problem

from twell import ops
from twell.format.twell import TwellTensor, pack_twell
from twell.ops import hot_cold, twell_ffn_kernel
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.tolerances import REL_TOL, rel_error

#: the preloaded container, the prefetch, the step's Wu and Wd rows requested together (GATHER_ROWS_TOGETHER), the
#: flat per-row lists (GATHER_LISTED)
MODES = ["preload", "prefetch", "rows-together", "listed"]


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


def _both(monkeypatch, fn, mode: str) -> tuple:
    """``fn()`` with the per-step slot loads, then in ``mode`` (the module defaults switched, so every launch
    inside takes it).  The prefetch's default SB is 2, not 4: a different grouping of the fp32 sums, which
    the exact-grid inputs of ``make_problem`` cannot see (every sum is exact)."""
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_PRELOAD", False)
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_PREFETCH", False)
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_ROWS_TOGETHER", False)
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_LISTED", False)
    off = fn()
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_PRELOAD", mode == "preload")
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_PREFETCH", mode == "prefetch")
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_ROWS_TOGETHER", mode == "rows-together")
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_LISTED", mode == "listed")
    return off, fn()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits, NaN where NaN."""
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


@pytest.mark.parametrize("precision", ["match", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-t{c[3]}-c{c[4]}-p{c[5]}" for c in CASES])
def test_gated_row_gather_same_bits(case, dtype, precision, device, monkeypatch, mode):
    m, d, f, tile, cap, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=31 + m, dtype=dtype, device=device)
    off, on = _both(monkeypatch, mode=mode, fn=lambda: ops.sparse_gated_ffn(
        p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=tile, capacity=cap, precision=precision,
        backend="triton", method="row-gather"))
    assert torch.equal(on, off)


def test_relu_ffn_and_empty_rows_same_bits(device, monkeypatch, mode):
    p = make_problem(9, 32, 160, frac_pos=0.08, seed=5, dtype=torch.bfloat16, device=device)
    p["x"][4] = 0.0  # an empty row
    off, on = _both(monkeypatch, mode=mode, fn=lambda: ops.sparse_relu_ffn(
        p["x"], p["w_gate"], p["w_down"], tile=32, capacity=2, backend="triton", method="row-gather"))
    assert torch.equal(on, off) and torch.count_nonzero(on[4]) == 0


def test_spill_area_and_nan_same_bits(device, monkeypatch, mode):
    p = make_problem(11, 32, 128, frac_pos=0.4, seed=9, dtype=torch.float32, device=device)
    p["x"][2, 5] = float("nan")
    g = p["x"].cpu() @ p["w_gate"].cpu().T
    packed = pack_twell(g, tile=32, capacity=2)
    assert packed.n_overflow() > 0 and packed.spill_values is not None
    packed = TwellTensor(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                            for k, v in packed.__dict__.items()})
    off, on = _both(monkeypatch, mode=mode,
                    fn=lambda: ops.twell_gated_ffn(p["x"], packed, p["w_up"], p["w_down"], backend="triton"))
    assert _same(on.cpu(), off.cpu()) and bool(torch.isnan(on[2]).all())


@pytest.mark.parametrize("unit_ids", [False, True], ids=["columns", "unit-ids"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", HOT_COLD_CASES, ids=[f"m{c[0]}-f{c[2]}-t{c[3]}-h{c[6]}" for c in HOT_COLD_CASES])
def test_hot_cold_op_same_bits(case, dtype, unit_ids, device, monkeypatch, mode):
    """The split's cold gather (unit map or unit ids, fp32 init rows of the hot partial sums)."""
    m, d, f, tile, cap, frac, n_hot = case
    p = make_problem(m, d, f, frac_pos=frac, seed=41 + n_hot, dtype=dtype, device=device)
    plan = _plan(p, n_hot)
    monkeypatch.setattr(hot_cold, "COLD_UNIT_IDS", unit_ids)
    off, on = _both(monkeypatch, mode=mode,
                    fn=lambda: _run(p, plan, "triton", tile=tile, capacity=cap, cold_format="twell"))
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


@pytest.mark.parametrize("unit_ids", [False, True], ids=["columns", "unit-ids"])
def test_unused_slots_are_never_read_into_the_result(unit_ids, device):
    """The preload reads every slot of a row; slots past a tile's count hold whatever was there (here NaN
    values and out-of-range indices) and must not change a bit of the output."""
    m, d, f, tile, cap = 6, 32, 256, 32, 4  # 6 rows, not 13: 37 s under the interpreter instead of 54
    p = make_problem(m, d, f, frac_pos=0.06, seed=17, dtype=torch.bfloat16, device=device)
    g = p["x"] @ p["w_gate"].T
    unit_map = torch.randperm(f, generator=torch.Generator().manual_seed(3)).to(torch.int32).to(device)
    v, i, c = launch_pack_twell(g, tile, cap, unit_map=unit_map if unit_ids else None)
    used = used_slots((v, i, c), cap)
    assert bool((~used).any()) and bool(used.any())
    v_bad = torch.where(used, v, torch.full_like(v, float("nan")))
    i_bad = torch.where(used, i, torch.full_like(i, 30000 if unit_ids else 31))
    wdt = p["w_down"].t().contiguous()
    init = torch.randn(m, d, generator=torch.Generator().manual_seed(5)).to(device)

    def run(values, indices, preload, prefetch=False, together=False, listed=False):
        out = torch.empty(m, d, dtype=p["x"].dtype, device=device)
        return launch_twell_ffn(p["x"], values, indices, c, None, None, p["w_gate"], p["w_up"], wdt, n_cols=f,
                                tile=tile, round_hidden=True, out=out, unit_map=unit_map, init=init,
                                idx_is_unit=unit_ids, preload=preload, prefetch=prefetch, sb=2,
                                rows_together=together, listed=listed)

    want = run(v, i, False)
    assert torch.equal(run(v_bad, i_bad, True), want)  # the preload on good slots: the same-bits tests above
    assert torch.equal(run(v_bad, i_bad, False, True), want)
    assert torch.equal(run(v_bad, i_bad, False, False, True), want)
    assert torch.equal(run(v_bad, i_bad, False, False, False, True), want)


@pytest.mark.gpu
def test_gpu_hot_cold_real_shape(monkeypatch, mode):
    """d=2048, F=5632, 4096 tokens at ~0.5 % density (the synthetic generator), hot units as the module
    picks them: the preload and the rows requested together give the same bits; the prefetch (SB 2
    against 4: its fp32 sums grouped differently, on random data) stays within the bf16 tolerance."""
    off, on = _both(monkeypatch, mode=mode, fn=real_shape_hot_cold_op())
    if mode != "prefetch":
        assert torch.equal(on, off)
    else:
        assert rel_error(on, off) <= REL_TOL[torch.bfloat16]


def real_shape_hot_cold_op():
    """The hot/cold op at d=2048, F=5632 on 4096 synthetic tokens at ~0.5 % density, hot units as the module
    picks them, as a callable (skips the test without a CUDA GPU)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    dev = torch.device("cuda")
    q = synthetic_ffn_problem(4096, 2048, 5632, SparsityProfile(mean_l0=28.0),
                              generator=torch.Generator(device=dev).manual_seed(0), device=dev)
    hot = ops.choose_hot_units(ops.unit_frequency(q["x"], q["w_gate"]))
    plan = ops.build_hot_cold_plan(q["w_gate"], q["w_up"], q["w_down"], hot)
    return lambda: ops.hot_cold_gated_ffn(q["x"], q["w_gate"], q["w_up"], q["w_down"], plan, backend="triton")
