"""The hot/cold op's launches after its gate: the counts written into one buffer (no concatenation), the
gather's heavy-queue counter zeroed by the gate kernel (no fill kernel), the gather reading counts through a
row stride, and the list pass and gather as programmatic dependents (``hot_cold.LIST_PDL``).

Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU; exact-grid inputs from
test_ops_kernels.make_problem, so paths that sum the same products must agree bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from test_ops_hot_cold import _plan
from test_ops_kernels import make_problem

from twell.ops import hot_cold, twell_list_kernel
from twell.ops._runtime import pdl_supported
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.hot_cold import joined_counts
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.ops.twell_list_kernel import heavy_queue, launch_list_twell_rows


def _fused_problem(m: int, device, *, n_hot: int = 32, seed: int = 3):
    d, f, tile, cap = 32, 256, 32, 4
    p = make_problem(m, d, f, frac_pos=0.08, seed=seed, dtype=torch.bfloat16, device=device)
    plan = _plan(p, n_hot)
    fused = build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"], plan.hot, fused_tile=tile)
    return p, plan, fused, tile, cap


def test_fused_gate_writes_both_counts_into_one_buffer(device):
    p, plan, fused, tile, cap = _fused_problem(13, device)
    n_hot, n_cold = plan.n_hot, plan.n_units - plan.n_hot
    h_hot, hot_counts, values, indices, cold_counts = launch_hot_cold_gate(
        p["x"], fused.w_gemm, n_hot, n_cold, plan.cold, tile=tile, capacity=cap, unit_ids=True)
    assert cold_counts.untyped_storage().data_ptr() == hot_counts.untyped_storage().data_ptr()
    joined = joined_counts(cold_counts, hot_counts)
    assert joined.data_ptr() == cold_counts.data_ptr() and joined.is_contiguous()  # no copy
    assert torch.equal(joined, torch.cat([cold_counts, hot_counts], 1))
    assert torch.equal(joined.sum(1), (p["x"].float() @ p["w_gate"].float().T > 0).sum(1).to(torch.int32))
    weights = (p["w_gate"], p["w_up"], p["w_down"].t().contiguous())
    out, counts = hot_cold.launch_hot_cold_ffn(p["x"], fused, *weights, tile=tile, capacity=cap)
    out_unfused, counts_unfused = hot_cold.launch_hot_cold_ffn(p["x"], plan, *weights, tile=tile, capacity=cap)
    assert counts.is_contiguous() and torch.equal(counts, counts_unfused) and torch.equal(out, out_unfused)


@pytest.mark.parametrize("n_hot", [32, 64, 0], ids=["one-hot-tile", "two-hot-tiles", "no-hot-unit"])
def test_fused_gate_hot_tiles_last_same_outputs(n_hot, device):
    """The fused gate with its output tiles ordered cold first, hot last (``hot_last``, taken with the list pass
    beside the gate) writes what the grouped order writes: hidden state, container and counts; 37 rows leave a
    partial last row block."""
    p, plan, fused, tile, cap = _fused_problem(37, device, n_hot=n_hot, seed=4)
    args = (p["x"], fused.w_gemm, plan.n_hot, plan.n_units - plan.n_hot, plan.cold)
    want = launch_hot_cold_gate(*args, tile=tile, capacity=cap, unit_ids=True)
    got = launch_hot_cold_gate(*args, tile=tile, capacity=cap, unit_ids=True, hot_last=True)
    h, hc, v, i, cc = want
    assert torch.equal(got[0], h) and torch.equal(got[1], hc) and torch.equal(got[4], cc)
    used = torch.arange(cap, device=device) < cc[..., None]  # slots past a tile's count are not written
    assert torch.equal(got[2][used], v[used]) and torch.equal(got[3][used], i[used])


def test_joined_counts_concatenates_tensors_of_their_own(device):
    cold = torch.arange(12, dtype=torch.int32, device=device).view(4, 3)
    hot = torch.arange(8, dtype=torch.int32, device=device).view(4, 2) + 100
    assert torch.equal(joined_counts(cold, hot), torch.cat([cold, hot], 1))
    # adjacent columns of a wider buffer (a column past them): not the whole row, so concatenated
    wide = torch.arange(24, dtype=torch.int32, device=device).view(4, 6)
    got = joined_counts(wide[:, :3], wide[:, 3:5])
    assert torch.equal(got, wide[:, :5]) and got.is_contiguous()
    # one buffer, no hot column / no cold column / no row
    buf = torch.arange(12, dtype=torch.int32, device=device).view(4, 3)
    assert torch.equal(joined_counts(buf[:, :3], buf[:, 3:]), buf)
    assert torch.equal(joined_counts(buf[:, :0], buf[:, 0:]), buf)
    empty = torch.empty(0, 5, dtype=torch.int32, device=device)
    assert joined_counts(empty[:, :2], empty[:, 2:]).shape == (0, 5)


@pytest.mark.parametrize("m", [0, 9])
def test_fused_gate_zeroes_the_heavy_counter(m, device):
    p, plan, fused, tile, cap = _fused_problem(max(m, 1), device)
    x = p["x"][:m]
    queue, counter = heavy_queue(m, x.device, zeroed=False)
    counter.fill_(12345)
    launch_hot_cold_gate(x, fused.w_gemm, plan.n_hot, plan.n_units - plan.n_hot, plan.cold, tile=tile, capacity=cap,
                         unit_ids=True, zero=counter)
    assert int(counter[0]) == 0
    assert queue.numel() == -(-m // 16)


def test_gather_reads_counts_through_a_row_stride(device):
    """A container whose counts are a column view of a wider buffer (as the fused gate writes them), the
    other columns poisoned: the same bits as with counts of their own, listed, searched and heavy first, with
    the heavy queue handed in or made by the call; counts without unit stride along their tiles are refused."""
    m, d, f, tile, cap = 21, 32, 192, 32, 4
    p = make_problem(m, d, f, frac_pos=0.04, seed=17, dtype=torch.bfloat16, device=device)
    g = p["x"] @ p["w_gate"].T
    g[4, :12] = 1.0  # an overflowing row-tile
    values, indices, counts = launch_pack_twell(g, tile, cap)
    wide = torch.full((m, counts.shape[1] + 3), 2**30, dtype=torch.int32, device=device)
    wide[:, : counts.shape[1]] = counts
    view = wide[:, : counts.shape[1]]
    wdt = p["w_down"].t().contiguous()

    def run(c, listed, heavy_first, heavy=None):
        out = torch.empty(m, d, dtype=torch.bfloat16, device=device)
        return launch_twell_ffn(p["x"], values, indices, c, None, None, p["w_gate"], p["w_up"], wdt, n_cols=f,
                                tile=tile, round_hidden=True, out=out, listed=listed, heavy_first=heavy_first,
                                heavy=heavy)

    want = run(counts, False, False)
    for listed, heavy_first in ((False, False), (True, False), (True, True)):
        assert torch.equal(run(view, listed, heavy_first), want), (listed, heavy_first)
    queue = heavy_queue(m, device, zeroed=False)
    queue[1].zero_()
    assert torch.equal(run(view, True, True, heavy=queue), want)
    with pytest.raises(ValueError, match="unit stride along their tiles"):
        run(wide.t().contiguous().t()[:, : counts.shape[1]], False, False)


def test_pdl_allowed_is_the_same_op_where_it_is_not_supported(device, monkeypatch):
    """Off sm_90 (and under the interpreter) the request is not applied: the op is the same, bit for bit."""
    if device.type == "cpu":
        assert not pdl_supported(device)
    p, _, fused, tile, cap = _fused_problem(19, device, seed=5)
    weights = (p["w_gate"], p["w_up"], p["w_down"].t().contiguous())
    monkeypatch.setattr(hot_cold, "LIST_PDL", False)
    want = hot_cold.launch_hot_cold_ffn(p["x"], fused, *weights, tile=tile, capacity=cap)
    monkeypatch.setattr(hot_cold, "LIST_PDL", True)
    got = hot_cold.launch_hot_cold_ffn(p["x"], fused, *weights, tile=tile, capacity=cap)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("rounds", [None, 1], ids=["from-start", "last-round"])
@pytest.mark.parametrize("heavy_first", [False, True], ids=["index-order", "heavy-first"])
@pytest.mark.parametrize("dense_rows", [0, 8], ids=["no-dense-rows", "dense-rows"])
def test_list_pass_beside_the_gate_same_bits(heavy_first, dense_rows, rounds, device, monkeypatch):
    """The list pass after the fused gate's row-block counters (``LIST_BESIDE_GATE``; the interpreter runs the gate's
    grid first) against it after the hot down GEMM: the same output and counts, bit for bit; the pass was launched
    with the counters, and the heavy queue (when the gather takes it) was the zero-filled one."""
    from twell.ops import twell_ffn_kernel, twell_list_kernel

    p, _, fused, tile, cap = _fused_problem(37, device, seed=9)  # 37 rows: a partial last row block
    p["x"][2] *= 30.0  # a row with overflowing cold tiles
    weights = (p["w_gate"], p["w_up"], p["w_down"].t().contiguous())
    monkeypatch.setattr(twell_ffn_kernel, "GATHER_HEAVY_FIRST", heavy_first)
    monkeypatch.setattr(twell_list_kernel, "HEAVY_MIN_ENTRIES", 2)  # some heavy rows in this small problem
    monkeypatch.setattr(twell_ffn_kernel, "_INTERPRETER_SMS", 4)

    def op():
        return hot_cold.launch_hot_cold_ffn(p["x"], fused, *weights, tile=tile, capacity=cap, dense_rows=dense_rows)

    monkeypatch.setattr(hot_cold, "LIST_BESIDE_GATE", False)
    want = op()
    calls = []
    real = hot_cold.launch_list_twell_rows

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(hot_cold, "LIST_BESIDE_GATE", True)
    monkeypatch.setattr(hot_cold, "LIST_BESIDE_ROUNDS", rounds)
    monkeypatch.setattr(hot_cold, "launch_list_twell_rows", spy)
    got = op()
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert int(want[1][2, :-1].max()) > cap  # the overflowing row (its cold tiles)
    assert len(calls) == 1 and calls[0]["after_gate"] is not None
    done, target, row_block = calls[0]["after_gate"]
    assert int(done.sum()) == target * done.numel()  # every row block's cold output tiles were counted
    assert (calls[0]["heavy"] is not None) == heavy_first


def test_list_pass_beside_the_gate_refusals(device):
    p, plan, fused, tile, cap = _fused_problem(8, device)
    cold = launch_hot_cold_gate(p["x"], fused.w_gemm, plan.n_hot, plan.n_units - plan.n_hot, plan.cold, tile=tile,
                                capacity=cap, unit_ids=True)[2:]
    done = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="must be a multiple of the pass's rows"):
        launch_list_twell_rows(*cold, tile=tile, unit_map=plan.cold, idx_is_unit=True, after_gate=(done, 1, 3))
    with pytest.raises(ValueError, match="`done` needs int32"):
        launch_hot_cold_gate(p["x"], fused.w_gemm, plan.n_hot, plan.n_units - plan.n_hot, plan.cold, tile=tile,
                             capacity=cap, unit_ids=True, done=done.to(torch.int64))
    for rounds, flags in ((0, done), (1, None)):
        with pytest.raises(ValueError, match="trigger_rounds must be None or >= 1 and comes with `done`"):
            launch_hot_cold_gate(p["x"], fused.w_gemm, plan.n_hot, plan.n_units - plan.n_hot, plan.cold, tile=tile,
                                 capacity=cap, unit_ids=True, done=flags, trigger_rounds=rounds)


def _gpu_problem(m: int, seed: int):
    """``(x, plan, wg, wu, wdt)``: d=2048, F=5632, ``m`` synthetic tokens at 0.5 % on the GPU, the 256 most frequent
    units hot, row 3 scaled up so that some of its cold tiles overflow."""
    from twell.ops import hot_cold_plan
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    dev = torch.device("cuda")
    q = synthetic_ffn_problem(m, 2048, 5632, SparsityProfile(mean_l0=28.0),
                              generator=torch.Generator(device=dev).manual_seed(seed), device=dev)
    wg, wu, wdt = q["w_gate"], q["w_up"], q["w_down"].t().contiguous()
    hot = torch.argsort(hot_cold_plan.unit_frequency(q["x"], wg), descending=True)[:256]
    plan = build_hot_cold_plan(wg, wu, q["w_down"], hot, fused_tile=128)
    x = q["x"].clone()
    x[3] = x[3].abs() * 40.0
    return x, plan, wg, wu, wdt


def _assert_same_eager_and_graphed(op, want: torch.Tensor, want_counts: torch.Tensor, *, eager_calls: int) -> None:
    """``op()`` (on the GPU) gives ``(want, want_counts)`` bit for bit with the caching allocator's blocks poisoned
    first, ``eager_calls`` times eagerly and three times replayed from a CUDA graph with its output poisoned."""
    torch.cuda.synchronize()
    torch.empty(1 << 28, dtype=torch.uint8, device="cuda").fill_(0xFF)
    for _ in range(eager_calls):  # a wait or a release out of order shows as a difference now and then
        got, got_counts = op()
        assert torch.equal(got, want) and torch.equal(got_counts, want_counts)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            g_out, g_counts = op()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        g_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(g_out, want) and torch.equal(g_counts, want_counts)


@pytest.mark.gpu
@pytest.mark.parametrize("one_waits", [False, True], ids=["all-wait", "one-waits"])
@pytest.mark.parametrize("dense_rows", [0, 64], ids=["gemm-before", "dense-rows-before"])
def test_gpu_programmatic_dependents_same_bits_eager_and_graphed(dense_rows, one_waits, monkeypatch):
    """d=2048, F=5632, 16,384 synthetic tokens at 0.5 %, outputs poisoned: the op with the list pass and the
    gather as programmatic dependents (every list program waiting for the kernel before it, or the last one) equals
    the op without, eagerly and replayed from a CUDA graph."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert pdl_supported(torch.device("cuda")), "the GPU suite runs on Hopper: programmatic dependent launch must be on"
    x, plan, wg, wu, wdt = _gpu_problem(16384, 11)

    def op():  # row 3 through the dense rows, or the row kernel's dense pass
        return hot_cold.launch_hot_cold_ffn(x, plan, wg, wu, wdt, tile=128, capacity=16, dense_rows=dense_rows)

    monkeypatch.setattr(hot_cold, "LIST_PDL", False)
    want, want_counts = op()
    n_cold_tiles = -(-(plan.n_units - plan.n_hot) // 128)
    assert int(want_counts[3, :n_cold_tiles].max()) > 16
    monkeypatch.setattr(hot_cold, "LIST_PDL", True)
    monkeypatch.setattr(twell_list_kernel, "LIST_ONE_WAITS", one_waits)
    _assert_same_eager_and_graphed(op, want, want_counts, eager_calls=1)


@pytest.mark.gpu
@pytest.mark.parametrize("one_waits", [False, True], ids=["all-wait", "one-waits"])
@pytest.mark.parametrize("m", [16384, 300], ids=["m16384", "m300"])
@pytest.mark.parametrize("rounds", [None, 1, 4], ids=["from-start", "last-round", "last-4-rounds"])
def test_gpu_list_pass_beside_the_gate_same_bits_eager_and_graphed(m, rounds, one_waits, monkeypatch):
    """d=2048, F=5632 synthetic tokens at 0.5 %, outputs poisoned: the list pass beside the fused gate (launched from
    the gate's start or its last rounds of tiles; 300 rows: fewer tiles than programs) equals the op with the pass
    after the hot down GEMM, eagerly and replayed from a CUDA graph."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x, plan, wg, wu, wdt = _gpu_problem(m, 12)

    def op():
        return hot_cold.launch_hot_cold_ffn(x, plan, wg, wu, wdt, tile=128, capacity=16)

    monkeypatch.setattr(hot_cold, "LIST_BESIDE_GATE", False)
    want, want_counts = op()
    monkeypatch.setattr(hot_cold, "LIST_BESIDE_GATE", True)
    monkeypatch.setattr(hot_cold, "LIST_BESIDE_ROUNDS", rounds)
    monkeypatch.setattr(twell_list_kernel, "LIST_ONE_WAITS", one_waits)
    _assert_same_eager_and_graphed(op, want, want_counts, eager_calls=3)


@pytest.mark.gpu
def test_gpu_list_pass_beside_the_gate_with_the_largest_carveout_same_bits(monkeypatch):
    """``hot_cold_gate_kernel.BESIDE_MAX_CARVEOUT`` (off; the driver asked for all of an SM's unified memory as shared
    memory for the gate and the list pass): the driver takes the request and the op's bits do not move."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from twell.ops import hot_cold_gate_kernel

    x, plan, wg, wu, wdt = _gpu_problem(300, 13)

    def op():
        return hot_cold.launch_hot_cold_ffn(x, plan, wg, wu, wdt, tile=128, capacity=16)

    want, want_counts = op()
    monkeypatch.setattr(hot_cold, "LIST_BESIDE_GATE", True)
    monkeypatch.setattr(hot_cold_gate_kernel, "BESIDE_MAX_CARVEOUT", True)
    _assert_same_eager_and_graphed(op, want, want_counts, eager_calls=2)  # the first call sets the preference
