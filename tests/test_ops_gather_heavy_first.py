"""The cold gather's heavy-first order (``twell_ffn_kernel.GATHER_HEAVY_FIRST``, on by default up to
``GATHER_HEAVY_FIRST_MAX_ROWS_PER_SM`` rows an SM while the gathered rows fit in L2): the list pass
queues the heavy rows (over ``HEAVY_MIN_ENTRIES`` entries, or searched) and marks them, the gather's first
programs take the queue and the others skip the marked rows.  Every row is still computed by one program in one
order, so the output keeps its bits: checked against the index order and the searched path with rows of every
kind (empty, listed, over LIST_MAX, an overflowing tile), a queue too short for the heavy rows, and through the
hot/cold op.  Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_kernels import make_problem
from test_ops_twell_list import reference_lists

from twell import ops
from twell.ops import hot_cold, twell_ffn_kernel, twell_list_kernel
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.ops.twell_list_kernel import HEAVY_MARK, heavy_queue, launch_list_twell_rows


def _problem(device, dtype=torch.bfloat16):
    """23 rows of d=32, F=192 at tile 32, capacity 4: an empty row, an overflowing tile, rows of 0 to ~20 entries."""
    m, d, f, tile, cap = 23, 32, 192, 32, 4
    p = make_problem(m, d, f, frac_pos=0.05, seed=12, dtype=dtype, device=device)
    p["x"][5] = 0.0
    g = p["x"] @ p["w_gate"].T
    g[7, :10] = 1.0  # an overflowing row-tile: searched, so heavy
    g[11, ::3] = 1.0  # a row over LIST_MAX (64 entries against 32): searched as well
    return p, launch_pack_twell(g, tile, cap), tile


def _gather(p, container, tile, **kw) -> torch.Tensor:
    m, d = p["x"].shape
    out = torch.full((m, d), float("nan"), dtype=p["x"].dtype, device=p["x"].device)
    return launch_twell_ffn(p["x"], *container, None, None, p["w_gate"], p["w_up"], p["w_down"].t().contiguous(),
                            n_cols=p["w_gate"].shape[0], tile=tile, round_hidden=True, out=out, **kw)


def heavy_first_on(monkeypatch) -> list:
    """GATHER_HEAVY_FIRST on for the test, and the heavy queues (slots, counter) that the list passes then fill, as
    they are filled: the gather's own, or the hot/cold op's (whose list pass beside the fused gate counts in the
    gate's flags buffer, not in the counter that ``heavy_queue`` returned)."""
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_HEAVY_FIRST", True)
    queues = []

    def spy(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if kwargs.get("heavy") is not None:
            queues.append(kwargs["heavy"])
        return launch_list_twell_rows(*args, **kwargs)

    # the gather lists the rows, or the hot/cold op does beside its fused gate (hot_cold.LIST_BESIDE_GATE)
    monkeypatch.setattr(twell_ffn_kernel, "launch_list_twell_rows", spy)
    monkeypatch.setattr(hot_cold, "launch_list_twell_rows", spy)
    return queues


@pytest.mark.parametrize(("heavy_min", "slot_every"), [(3, 1), (3, 8), (0, 1), (1000, 1)],
                         ids=["queue-holds-all", "queue-too-short", "every-row-with-entries", "only-searched"])
def test_queue_and_marks(heavy_min, slot_every, device, monkeypatch):
    """The queue holds heavy rows only, each once, as many as fit; ``queued`` counts every heavy row; a queued
    row's lst_n is its count (or -1) plus HEAVY_MARK, every other row's as without the queue."""
    p, container, tile = _problem(device)
    monkeypatch.setattr(twell_list_kernel, "HEAVY_MIN_ENTRIES", heavy_min)
    monkeypatch.setattr(twell_list_kernel, "HEAVY_SLOT_EVERY", slot_every)
    monkeypatch.setattr(twell_list_kernel, "LIST_MAX", 32)
    m = p["x"].shape[0]
    queue, queued = heavy_queue(m, p["x"].device)
    assert queue.numel() == -(-m // slot_every) and int(queued) == 0
    _, lst_n = launch_list_twell_rows(*container, tile=tile, unit_map=None, idx_is_unit=False, heavy=(queue, queued))
    _, want_n = reference_lists(*container, tile=tile, unit_map=None, idx_is_unit=False, list_max=32)
    heavy = {r for r, n in enumerate(want_n) if n < 0 or n > heavy_min}
    assert {7, 11} <= heavy and int(queued) == len(heavy)
    assert (len(heavy) > queue.numel()) == (slot_every == 8)  # the short queue is short, the others hold all
    taken = queue[: min(len(heavy), queue.numel())].cpu().tolist()
    assert len(set(taken)) == len(taken) and set(taken) <= heavy
    got = lst_n.cpu().tolist()
    for r, n in enumerate(want_n):
        assert got[r] == (n + HEAVY_MARK if r in taken else n), f"row {r}"


@pytest.mark.parametrize(("heavy_min", "slot_every"), [(3, 1), (3, 8), (0, 2)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_heavy_first_keeps_the_bits(dtype, heavy_min, slot_every, device, monkeypatch):
    p, container, tile = _problem(device, dtype)
    monkeypatch.setattr(twell_list_kernel, "HEAVY_MIN_ENTRIES", heavy_min)
    monkeypatch.setattr(twell_list_kernel, "HEAVY_SLOT_EVERY", slot_every)
    monkeypatch.setattr(twell_list_kernel, "LIST_MAX", 32)
    in_order = _gather(p, container, tile, listed=True, heavy_first=False)
    heavy_first = _gather(p, container, tile, listed=True, heavy_first=True)
    searched = _gather(p, container, tile, listed=False)
    assert not heavy_first.isnan().any()  # every row written (the output was NaN before)
    assert torch.equal(heavy_first, in_order) and torch.equal(heavy_first, searched)
    assert torch.count_nonzero(heavy_first[5]) == 0


def test_heavy_first_through_the_hot_cold_op(device, monkeypatch):
    """The split as SparseGatedMLP runs it (unit map, fp32 hot partial sums as init), the module switch on."""
    p = make_problem(40, 32, 256, frac_pos=0.08, seed=5, dtype=torch.bfloat16, device=device)
    freq = ops.unit_frequency(p["x"], p["w_gate"])
    plan = ops.build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"],
                                   torch.argsort(freq, descending=True, stable=True)[:32])
    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return ops.hot_cold_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"], plan, tile=32, capacity=4,
                                      backend="triton", return_counts=True)

    want = run()
    monkeypatch.setattr(twell_list_kernel, "HEAVY_MIN_ENTRIES", 2)
    queues = heavy_first_on(monkeypatch)
    got = run()
    assert len(queues) == 1 and int(queues[0][1]) > 0  # the op's gather took heavy rows first
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_refusals(device):
    p, container, tile = _problem(device)
    with pytest.raises(ValueError, match="heavy_first=True needs the rows listed"):
        _gather(p, container, tile, listed=False, heavy_first=True)
    with pytest.raises(ValueError, match="heavy_first=True needs the rows listed.*16-bit gate values"):
        q = {k: v.float() for k, v in p.items()}
        _gather(q, (container[0].float(), *container[1:]), tile, heavy_first=True)
    with pytest.raises(ValueError, match="list_max must be below"):
        launch_list_twell_rows(*container, tile=tile, unit_map=None, idx_is_unit=False, list_max=HEAVY_MARK)


def test_heavy_first_default_follows_rows_and_l2(device, monkeypatch):
    """The default takes the heavy rows first up to GATHER_HEAVY_FIRST_MAX_ROWS_PER_SM rows an SM and while the
    gathered units' rows fit in L2 (the interpreter counting the H200's 132 SMs and 50 MiB), else keeps the index
    order, as it does with the switch off; a default launch of the small problem fills one queue, and none once
    its rows are over the limit or its weights over L2."""
    from twell.ops._runtime import l2_bytes, sm_count

    cuda = device.type == "cuda"
    sms = sm_count(device.index) if cuda else 132
    l2 = l2_bytes(device.index) if cuda else 50 * 2**20
    default = twell_ffn_kernel.heavy_first_default
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_HEAVY_FIRST_MAX_ROWS_PER_SM", 2)
    assert default(2 * sms, l2, device)
    assert not default(2 * sms + 1, 0, device)
    assert not default(1, l2 + 1, device)
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_HEAVY_FIRST", False)
    assert not default(1, 0, device)

    p, container, tile = _problem(device)
    queues = heavy_first_on(monkeypatch)
    _gather(p, container, tile)
    assert len(queues) == 1 and int(queues[0][1]) > 0
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_HEAVY_FIRST_MAX_ROWS_PER_SM", 0)
    _gather(p, container, tile)
    assert len(queues) == 1  # 23 rows over 0 an SM: the index order, no queue
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_HEAVY_FIRST_MAX_ROWS_PER_SM", 256)
    monkeypatch.setattr(twell_ffn_kernel, "l2_bytes", lambda index: 0)
    monkeypatch.setattr(twell_ffn_kernel, "_INTERPRETER_L2_BYTES", 0)
    _gather(p, container, tile)
    assert len(queues) == 1  # the rows over an L2 of 0 bytes: no queue


@pytest.mark.gpu
def test_gpu_heavy_first_on_the_split_cold_container(monkeypatch):
    """d=2048, F=5632, 16384 synthetic tokens at ~0.5 % density through the fused hot/cold gate: the op's output
    and counts with the heavy-first gather equal the index order's, bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from twell.bench.probe import split_problem
    from twell.ops.hot_cold import launch_hot_cold_ffn

    q = split_problem(16384, 2048, 5632, 28.0, torch.device("cuda"))  # twell bench ffn's problem, seed 0
    plan = ops.build_hot_cold_plan(q.w_gate, q.w_up, q.w_down, ops.choose_hot_units(q.frequency), fused_tile=128)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return launch_hot_cold_ffn(q.x, plan, q.w_gate, q.w_up, q.w_down_t, tile=128, capacity=16)

    monkeypatch.setattr(twell_ffn_kernel, "GATHER_HEAVY_FIRST", False)
    want = run()
    queues = heavy_first_on(monkeypatch)
    got = run()
    # heavy rows there were (~2.4 % of the rows on the CPU count), and the queue of M / 16 slots held them
    assert len(queues) == 1 and 0 < int(queues[0][1]) <= queues[0][0].numel()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
