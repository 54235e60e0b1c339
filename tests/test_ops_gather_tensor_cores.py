"""The row-gather FFN with its per-token products on tensor cores (``twell_ffn_tc_kernel``,
``launch_twell_ffn(tensor_cores=True)``, ``twell_ffn_kernel.GATHER_TENSOR_CORES``) against the row kernel
alone: the same bits on exact-grid inputs (every product and sum exact, so the summation order cannot
show) on every path -- gated and ReLU FFN, blocks of 16 rows with rows over ``ROW_MAX`` pairs, blocks
over ``SLOTS`` pairs and overflowing tiles left to the row kernel, unit map and unit ids with fp32 init
rows, NaN, empty rows -- and the inputs it does not take (fp32, the "fp32" hidden rounding) left to the
row kernel whole.

Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_gather_preload import _same, real_shape_hot_cold_op
from test_ops_hot_cold import CASES as HOT_COLD_CASES
from test_ops_hot_cold import _plan, _run
from test_ops_kernels import CASES, make_problem

from twell import ops
from twell.format.twell import TwellTensor, pack_twell
from twell.ops import hot_cold, twell_ffn_kernel
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.ops.twell_ffn_tc_kernel import BT, ROW_MAX, SLOTS, tc_eligible
from twell.tolerances import REL_TOL, rel_error


def _both(monkeypatch, fn) -> tuple:
    """``fn()`` with the row kernel alone, then with the tensor-core kernel taking the rows it can."""
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_TENSOR_CORES", False)
    off = fn()
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_TENSOR_CORES", True)
    return off, fn()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-t{c[3]}-c{c[4]}-p{c[5]}" for c in CASES])
def test_gated_row_gather_same_bits(case, dtype, device, monkeypatch):
    m, d, f, tile, cap, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=31 + m, dtype=dtype, device=device)
    off, on = _both(monkeypatch, lambda: ops.sparse_gated_ffn(
        p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=tile, capacity=cap, backend="triton", method="row-gather"))
    assert torch.equal(on, off)


def taken_rows(counts: torch.Tensor, cap: int) -> torch.Tensor:
    """The rows the tensor-core kernel takes (``block_rows_taken``), computed here from its definition."""
    c = counts.cpu().long()
    eligible = (c <= cap).all(1) & (c.sum(1) <= ROW_MAX)
    total = torch.where(eligible, c.sum(1), 0)
    taken = torch.zeros(c.shape[0], dtype=torch.bool)
    for b0 in range(0, c.shape[0], BT):
        cum = total[b0:b0 + BT].cumsum(0)
        taken[b0:b0 + BT] = eligible[b0:b0 + BT] & (cum <= SLOTS)
    return taken


@pytest.mark.parametrize("d, f, tile", [(32, 256, 32), (192, 256, 32), (32, 1280, 16)],
                         ids=["d32", "d192", "80-tiles"])  # 192: whole 64-column steps, not a power of two;
def test_blocks_mixing_rows_it_takes_and_rows_it_leaves(d, f, tile, device, monkeypatch):  # 80 tiles: 3 steps
    """37 rows (two full blocks of 16 and a partial one), capacity = tile (no overflow): rows over ROW_MAX
    pairs and a block over SLOTS pairs (the row kernel's) next to empty and sparse rows (the tensor-core
    kernel's)."""
    m = 37
    p = make_problem(m, d, f, frac_pos=0.03, seed=3, dtype=torch.bfloat16, device=device)
    p["x"][:, 0] = 1.0 if f == 256 else 1.5  # the bias channel (negative gate weights): ~1-17 pairs a row
    p["x"][1] = 0.0  # empty row
    p["x"][[4, 33], 0] = -3.0  # every unit fires: over ROW_MAX
    p["x"][16:32, 0] = 0.8 if f == 256 else 1.2  # a block of 12-50 pairs a row: together over SLOTS
    g = p["x"] @ p["w_gate"].T
    counts = torch.stack([(g[:, j:j + tile] > 0).sum(1) for j in range(0, f, tile)], 1)
    taken = taken_rows(counts, tile)
    assert bool(taken.any()) and bool((~taken).any())
    assert int(counts[4].sum()) > ROW_MAX and int(counts[16:32].sum()) > SLOTS and bool(taken[16:32].any())
    off, on = _both(monkeypatch, lambda: ops.sparse_gated_ffn(
        p["x"], p["w_gate"], p["w_up"], p["w_down"], tile=tile, capacity=tile, backend="triton", method="row-gather"))
    assert torch.equal(on, off) and torch.count_nonzero(on[1]) == 0


def test_relu_ffn_and_spill_area_with_nan_same_bits(device, monkeypatch):
    p = make_problem(9, 32, 160, frac_pos=0.08, seed=5, dtype=torch.bfloat16, device=device)
    p["x"][4] = 0.0
    off, on = _both(monkeypatch, lambda: ops.sparse_relu_ffn(
        p["x"], p["w_gate"], p["w_down"], tile=32, capacity=2, backend="triton", method="row-gather"))
    assert torch.equal(on, off) and torch.count_nonzero(on[4]) == 0
    q = make_problem(11, 32, 128, frac_pos=0.2, seed=9, dtype=torch.bfloat16, device=device)
    q["x"][2, 5] = float("nan")
    packed = pack_twell(q["x"].cpu() @ q["w_gate"].cpu().T, tile=32, capacity=4)  # bf16 values, a spill area
    assert packed.n_overflow() > 0 and packed.values.dtype == torch.bfloat16
    packed = TwellTensor(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(packed).items()})
    off, on = _both(monkeypatch, lambda: ops.twell_gated_ffn(q["x"], packed, q["w_up"], q["w_down"], backend="triton"))
    assert _same(on.cpu(), off.cpu()) and bool(torch.isnan(on[2]).all())


@pytest.mark.parametrize("unit_ids", [False, True], ids=["columns", "unit-ids"])
@pytest.mark.parametrize("case", HOT_COLD_CASES, ids=[f"m{c[0]}-f{c[2]}-t{c[3]}-h{c[6]}" for c in HOT_COLD_CASES])
def test_hot_cold_op_same_bits(case, unit_ids, device, monkeypatch):
    """The split's cold gather: unit map or unit ids, fp32 init rows of the hot partial sums."""
    m, d, f, tile, cap, frac, n_hot = case
    p = make_problem(m, d, f, frac_pos=frac, seed=41 + n_hot, dtype=torch.bfloat16, device=device)
    plan = _plan(p, n_hot)
    monkeypatch.setattr(hot_cold, "COLD_UNIT_IDS", unit_ids)
    off, on = _both(monkeypatch, lambda: _run(p, plan, "triton", tile=tile, capacity=cap, cold_format="twell"))
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


def test_unused_slots_and_inputs_it_does_not_take(device):
    """Slots past a tile's count (NaN values, out-of-range ids) never reach the result; fp32 inputs and the
    "fp32" rounding are not eligible (the row kernel alone runs them)."""
    m, d, f, tile, cap = 13, 32, 256, 32, 4
    p = make_problem(m, d, f, frac_pos=0.06, seed=17, dtype=torch.bfloat16, device=device)
    g = p["x"] @ p["w_gate"].T
    unit_map = torch.randperm(f, generator=torch.Generator().manual_seed(3)).to(torch.int32).to(device)
    v, i, c = launch_pack_twell(g, tile, cap, unit_map=unit_map)
    used = torch.arange(cap, device=c.device)[None, None, :] < c.clamp(max=cap)[:, :, None]
    v_bad = torch.where(used, v, torch.full_like(v, float("nan")))
    i_bad = torch.where(used, i, torch.full_like(i, 30000))
    wdt = p["w_down"].t().contiguous()
    init = torch.randn(m, d, generator=torch.Generator().manual_seed(5)).to(device)

    def run(values, indices, tc):
        out = torch.full((m, d), float("nan"), dtype=p["x"].dtype, device=device)  # poisoned
        return launch_twell_ffn(p["x"], values, indices, c, None, None, p["w_gate"], p["w_up"], wdt, n_cols=f,
                                tile=tile, round_hidden=True, out=out, unit_map=unit_map, init=init,
                                idx_is_unit=True, tensor_cores=tc)

    want = run(v, i, False)
    assert not bool(torch.isnan(want).any())
    assert torch.equal(run(v_bad, i_bad, True), want) and torch.equal(run(v, i, True), want)
    assert tc_eligible(p["x"], True)
    assert not tc_eligible(p["x"], False) and not tc_eligible(p["x"].float(), True)
    assert not tc_eligible(p["x"][:, :8], True)  # d < 16: no tensor-core operand


@pytest.mark.gpu
def test_gpu_hot_cold_real_shape(monkeypatch):
    """d=2048, F=5632, 4096 tokens at ~0.5 % density (the synthetic generator): within the bf16 tolerance
    of the row kernel on random data (the fp32 sums are grouped differently)."""
    off, on = _both(monkeypatch, real_shape_hot_cold_op())
    assert rel_error(on, off) <= REL_TOL[torch.bfloat16]


def test_tc_kernel_writes_exactly_the_rows_it_takes(device):
    """Alone, the tensor-core kernel writes the rows ``block_rows_taken`` accepts (equal to the row kernel's),
    flags exactly those, and leaves every other row as it was (here: poisoned with NaN)."""
    from twell.ops.twell_ffn_tc_kernel import launch_twell_ffn_tc

    m, d, f, tile, cap = 37, 32, 256, 32, 32
    p = make_problem(m, d, f, frac_pos=0.03, seed=3, dtype=torch.bfloat16, device=device)
    p["x"][[2, 17], 0] = -3.0  # over ROW_MAX
    p["x"][16:32, 0] = 0.8  # the second block over SLOTS from some row on
    v, i, c = launch_pack_twell(p["x"] @ p["w_gate"].T, tile, cap)
    c = c.clone()
    c[5, 0] = cap + 1  # one overflowing tile (the row kernel recomputes it)
    taken = taken_rows(c, cap).to(c.device)
    assert int(taken.sum()) > m // 2 and bool((~taken[16:32]).any()) and bool(taken[16:32].any())
    wdt = p["w_down"].t().contiguous()
    out = torch.full((m, d), float("nan"), dtype=torch.bfloat16, device=device)
    flags = launch_twell_ffn_tc(p["x"], v, i, c, p["w_up"], wdt, tile=tile, out=out)
    assert torch.equal(flags.bool(), taken)  # what the row kernel then skips
    want = launch_twell_ffn(p["x"], v, i, c, None, None, p["w_gate"], p["w_up"], wdt, n_cols=f, tile=tile,
                            round_hidden=True, out=torch.empty_like(out), tensor_cores=False)
    assert torch.equal(out[taken], want[taken])
    assert bool(torch.isnan(out[~taken]).all())
    both = launch_twell_ffn(p["x"], v, i, c, None, None, p["w_gate"], p["w_up"], wdt, n_cols=f, tile=tile,
                            round_hidden=True, out=torch.full_like(out, float("nan")), tensor_cores=True)
    assert torch.equal(both, want)  # the row kernel fills in exactly the rest
