"""SparseGatedMLP's hot/cold sparse path (Triton backend; the interpreter on the CPU)."""

from __future__ import annotations

import pytest
import torch
from _helpers import hot_cold_test_layer, hot_cold_test_tokens, recording_backend

from twell.nn import DispatchPolicy, SparseGatedMLP, static_dispatch
from twell.reference.inference import dense_gated_ffn
from twell.tolerances import L0_ABS_TOL_FP32, REL_TOL, rel_error


def _layer(policy: DispatchPolicy | None = None, **kw) -> SparseGatedMLP:
    """The split's 32 x 256 test layer, sparse on the CPU at every token count (``policy``: another)."""
    return hot_cold_test_layer(policy or DispatchPolicy(table=((1, 1.0),), force=True), **kw)


_x = hot_cold_test_tokens


def test_hot_units_chosen_on_refresh_and_output_exact():
    layer = _layer(l0_refresh_every=2)
    refreshes = []
    original = layer._hot_cold.refresh
    layer._hot_cold.refresh = lambda *a, **k: (refreshes.append(1), original(*a, **k))[1]
    with torch.no_grad():
        for i in range(4):
            x = _x(40, seed=i)
            out = layer(x)
            want = dense_gated_ffn(x, layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)
            assert rel_error(out, want) <= REL_TOL[torch.float32]
    assert len(refreshes) == 2  # calls 0 and 2
    plan = layer._hot_cold.plan(layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)
    assert plan is not None and plan.n_hot == 64
    assert set(plan.hot.tolist()) == set(range(64))
    g = x @ layer.gate_proj.weight.T
    assert abs(float(layer.last_l0) - float((g > 0).sum(1).float().mean())) < L0_ABS_TOL_FP32


def test_hot_cold_off_uses_the_plain_sparse_op():
    layer = _layer(hot_cold=False)
    with torch.no_grad():
        x = _x(40, seed=5)
        out = layer(x)
    assert not layer._hot_cold.chosen
    want = dense_gated_ffn(x, layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)
    assert rel_error(out, want) <= REL_TOL[torch.float32]


def _spy_ops(monkeypatch) -> list[tuple[str, int]]:  # noqa: ANN001
    """(op name, tokens) of every sparse custom op the traced path calls from now on."""
    from twell.ops import custom_ops

    seen: list[tuple[str, int]] = []
    for name, real in (("sparse_gated_ffn_unchecked", custom_ops.sparse_gated_ffn_unchecked_op),
                       ("hot_cold_gated_ffn_unchecked", custom_ops.hot_cold_gated_ffn_unchecked_op)):
        monkeypatch.setattr(torch.ops.twell, name, lambda *a, _n=name, _r=real: (seen.append((_n, a[0].shape[0])),
                                                                               _r(*a))[1], raising=False)
    return seen


def _floored_layer() -> SparseGatedMLP:
    """Sparse at every token count, but eager calls of fewer than 64 tokens run dense."""
    return _layer(DispatchPolicy(table=((1, 1.0),), force=True, eager_min_tokens=64))


def _want(layer: SparseGatedMLP, x: torch.Tensor) -> torch.Tensor:
    return dense_gated_ffn(x, layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)


def test_below_the_floor_a_static_dispatch_call_outside_a_capture_chooses_the_hot_set(monkeypatch):
    """Eager calls below the floor run dense and choose no hot units; the recorded-call recipe's warm-up call inside
    ``static_dispatch`` (outside the capture) chooses them, and it and later such calls run the hot/cold split the
    tables were measured with."""

    layer = _floored_layer()
    seen = _spy_ops(monkeypatch)
    x = _x(40, seed=7)
    with torch.no_grad():
        eager = layer(x)
        assert layer._path(40, x.device, eager=True) == "dense" and not layer._hot_cold.chosen
        with static_dispatch():
            first, second = layer(x), layer(x)
    assert layer._hot_cold.n_hot == 64 and layer._hot_cold._plan is not None
    assert seen == [("hot_cold_gated_ffn_unchecked", 40)] * 2
    for out in (eager, first, second):
        assert rel_error(out, _want(layer, x)) <= REL_TOL[torch.float32]


def test_a_compiled_call_without_a_chosen_hot_set_runs_dense_until_choose_hot_units():
    """Traced by torch.compile inside ``static_dispatch`` (the recipe for recorded graphs; outside it the call is below
    the eager floor and runs dense anyway), a layer whose hot units no call has chosen runs the dense FFN (not the
    plain TwELL op the tables were not measured with, and no choice, which would synchronise); after
    ``choose_hot_units`` the compiled call runs the split."""
    layer = _floored_layer()
    x = _x(40, seed=8)
    graphs: list[str] = []

    torch._dynamo.reset()
    with torch.no_grad():
        layer(x)  # eager, below the floor: dense, sets the l0 estimate
        compiled = torch.compile(layer, backend=recording_backend(graphs))
        with static_dispatch():
            out = compiled(x)
        assert not layer._hot_cold.chosen and "twell" not in graphs[-1]
        assert rel_error(out, _want(layer, x)) <= REL_TOL[torch.float32]
        layer.choose_hot_units(x.reshape(2, 20, 32))  # any leading shape
        assert layer._hot_cold.n_hot == 64
        with static_dispatch():
            out = compiled(x)
    assert "hot_cold_gated_ffn_unchecked" in graphs[-1]
    assert rel_error(out, _want(layer, x)) <= REL_TOL[torch.float32]


def test_choose_hot_units_refuses_bad_input_and_is_a_no_op_without_the_split():
    layer = _floored_layer()
    with pytest.raises(ValueError, match="hidden_size=32"):
        layer.choose_hot_units(torch.randn(4, 16))
    with pytest.raises(ValueError, match="at least one token"):
        layer.choose_hot_units(torch.randn(0, 32))
    with pytest.raises(TypeError, match="x"):
        layer.choose_hot_units(torch.randn(4, 32, dtype=torch.float64))
    plain = _layer(hot_cold=False)
    plain.choose_hot_units(_x(40, seed=9))
    assert not plain._hot_cold.chosen


def test_weight_update_rebuilds_the_plan():
    layer = _layer()
    with torch.no_grad():
        layer(_x(40, seed=1))
        plan = layer._hot_cold.plan(layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)
        layer.up_proj.weight.mul_(-1.0)
        x = _x(40, seed=2)
        out = layer(x)
    want = dense_gated_ffn(x, layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)
    assert rel_error(out, want) <= REL_TOL[torch.float32]
    assert layer._hot_cold.plan(layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight) is not plan


def test_hot_cold_training_matches_dense_autograd_and_refreshes_hot_set():
    from twell.reference.training import dense_gated_ffn_l1

    layer = _layer(l0_refresh_every=2)
    layer.train_impl = "hot-cold"
    layer.train()
    chosen = []
    for i in range(3):
        x = _x(24, seed=10 + i).requires_grad_(True)
        out = layer(x)
        (out.square().sum() + layer.last_l1).backward()
        chosen.append(layer._train_hot)
        ws = [w.detach().clone().requires_grad_(True) for w in
              (layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)]
        x2 = x.detach().clone().requires_grad_(True)
        ref_out, ref_l1, _ = dense_gated_ffn_l1(x2, *ws)
        (ref_out.square().sum() + ref_l1).backward()
        assert rel_error(out, ref_out) <= REL_TOL[torch.float32]
        assert rel_error(x.grad, x2.grad) <= REL_TOL[torch.float32]
        assert rel_error(layer.gate_proj.weight.grad, ws[0].grad) <= REL_TOL[torch.float32]
        layer.zero_grad()
    assert chosen[0] is chosen[1] and chosen[2] is not chosen[1]  # refreshed on calls 0 and 2
    assert chosen[0].n_hot == 64


def test_hot_cold_training_rechooses_the_hot_set_when_the_token_count_moves():
    """A set chosen on few tokens (a check batch) sizes the op's buffers for those: a call with more than
    twice (or under half) as many tokens chooses again; one inside the band keeps it."""
    layer = _layer(l0_refresh_every=1000)
    layer.train_impl = "hot-cold"
    layer.train()
    chosen = []
    for m in (8, 16, 40, 24, 12):
        out = layer(_x(m, seed=m).requires_grad_(True))
        out.sum().backward()
        chosen.append(layer._train_hot)
        assert layer.last_spilled_tokens is not None and layer.last_spilled_tokens.shape == (1,)
    assert chosen[1] is chosen[0]  # 16 = 2 x 8: inside the band
    assert chosen[2] is not chosen[1]  # 40 > 2 x 8
    assert chosen[3] is chosen[2] and chosen[4] is not chosen[3]  # 24 inside [20, 80]; 12 < 40 / 2


def test_fused_gate_switch_gives_the_same_output_eager_and_compiled(monkeypatch):
    """With ``hot_cold_plan.FUSED_GATE`` on (the default), a bf16 layer's plan holds the fused kernel's
    weight layout and the op runs the fused gate kernel (eager: the cached plan; compiled: the layout built
    in the graph); on exact inputs the output equals the unfused path's."""
    from twell.ops import hot_cold, hot_cold_plan

    calls = []
    original = hot_cold.launch_hot_cold_gate
    monkeypatch.setattr(hot_cold, "launch_hot_cold_gate", lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    layer = _layer(l0_refresh_every=1000).to(torch.bfloat16)
    x = _x(40, seed=3).to(torch.bfloat16)
    monkeypatch.setattr(hot_cold_plan, "FUSED_GATE", False)
    with torch.no_grad():
        want = layer(x)  # chooses the hot units (refresh call), unfused plan
        assert calls == []
        monkeypatch.setattr(hot_cold_plan, "FUSED_GATE", True)
        got = layer(x)
        assert len(calls) == 1
        plan = layer._hot_cold.plan(layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight,
                                    fused_tile=layer.tile)
        assert plan.fused_tile == layer.tile
        assert plan.w_gemm.shape[0] == 2 * layer.tile * -(-plan.n_hot // layer.tile) + 256 - plan.n_hot
        compiled = torch.compile(layer, backend="aot_eager")
        traced = compiled(x)
    assert len(calls) >= 2  # the compiled call ran the fused kernel too
    assert torch.equal(got, want) and torch.equal(traced, want)


def _warm_sparse_layer(seed: int, n_inputs: int, *, choose: bool) -> tuple[SparseGatedMLP, list[torch.Tensor]]:
    """A default-policy bf16 layer of d=2048, F=5632 (synthetic weights, l0 28) after three eager calls of 4096 tokens
    (the first measures l0; with ``choose``, ``choose_hot_units`` on them after), and ``n_inputs`` batches of 4096
    tokens; sparse there by the H200 table, though the eager calls run dense: 4096 tokens is below the default's eager
    floor at this shape (8937 tokens, ``DispatchPolicy.eager_floor_tokens``), the case these recipes are for."""
    from twell.nn import DEFAULT_POLICY
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    d, f, m = 2048, 5632, 4096
    assert DEFAULT_POLICY.eager_floor_tokens((d, f)) > m
    gen = torch.Generator(device="cuda").manual_seed(seed)
    p = synthetic_ffn_problem(n_inputs * m, d, f, SparsityProfile(mean_l0=28.0), generator=gen, device="cuda")
    # eager_graphs=0: the recipes are for layers whose eager calls run dense (a layer that records its own calls, the
    # default, chooses its hot units on the second eager call and replays from the third: tests/test_nn_call_graphs.py)
    layer = SparseGatedMLP.from_weights(p["w_gate"], p["w_up"], p["w_down"], eager_graphs=0).eval()
    xs = [p["x"][i * m:(i + 1) * m].clone() for i in range(n_inputs)]
    with torch.no_grad():
        for _ in range(3):
            layer(xs[0])
    assert layer._path(m, xs[0].device) == "sparse" and not layer._hot_cold.chosen
    if choose:
        layer.choose_hot_units(xs[0])
        assert layer._hot_cold._plan is not None
    return layer, xs


@pytest.mark.gpu
def test_gpu_call_recorded_in_a_cuda_graph_under_static_dispatch():
    """What a caller whose host is the bottleneck can do (README, "Host time"; session 40 measured the op's host time
    at 442-957 us a call): eager calls first (they measure l0 and choose the hot set), then the layer's call of a
    fixed token count recorded in a CUDA graph inside ``static_dispatch`` on a side stream; a replay after new
    tokens are copied into the recorded input gives the eager layer's output for them."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")

    mlp, (x, x_new) = _warm_sparse_layer(seed=11, n_inputs=2, choose=False)
    with torch.no_grad():
        want = mlp(x_new)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), static_dispatch():
            mlp(x)  # the traced path once outside the capture: it chooses the hot units (the eager calls ran dense)
            assert mlp._hot_cold._plan is not None
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                out = mlp(x)
        torch.cuda.current_stream().wait_stream(side)
        x.copy_(x_new)
        graph.replay()
        torch.cuda.synchronize()
    assert not bool(torch.isnan(out).any())
    assert rel_error(out, want) <= REL_TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("cached_weights", [False, True])
def test_gpu_reduce_overhead_compile_matches_eager(cached_weights):
    """The other recipe for such a caller: the layer under ``torch.compile(mode="reduce-overhead")`` (inductor's CUDA
    graphs) after the same eager calls, traced and run inside ``static_dispatch`` (outside it a traced call below the
    eager floor counts as eager and runs dense); new inputs each call, as the recorded graph copies them in.  With
    ``cached_weights`` the graph reads the copies ``prepare_static_weights`` made (static addresses) and records
    without a skip."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch._dynamo.utils import counters

    layer, xs = _warm_sparse_layer(seed=17, n_inputs=4, choose=True)
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        wants = [layer(x) for x in xs]
        if cached_weights:
            assert layer.prepare_static_weights() is True
        compiled = torch.compile(layer, mode="reduce-overhead")
        with static_dispatch(cached_weights=cached_weights):
            for _ in range(2):  # inductor's first calls warm up, later ones replay the recorded graph
                for x, want in zip(xs, wants, strict=True):
                    got = compiled(x).clone()  # a replay's output is overwritten by the next replay
                    assert not bool(torch.isnan(got).any())
                    assert rel_error(got, want) <= REL_TOL[torch.bfloat16]
    assert counters["inductor"].get("cudagraph_skips", 0) == 0
