"""SparseGatedMLP's small-batch (decode) path: which calls take it, its outputs and l0, and the policy field."""

from __future__ import annotations

import pytest
import torch
from test_nn_mlp import FF, D, dense_ref, make_layer, make_x

import twell.nn.mlp as mlp_mod
from twell.nn import DispatchPolicy
from twell.ops import DECODE_MAX_TOKENS
from twell.tolerances import REL_TOL, rel_error


def _count_calls(monkeypatch, name: str, owner: object = torch.ops.twell) -> list[int]:
    """Record the token count of every call of ``owner.<name>`` (it still runs)."""
    calls: list[int] = []
    fn = getattr(owner, name)

    def spy(x, *args, **kwargs):  # noqa: ANN001, ANN202
        calls.append(x.shape[0])
        return fn(x, *args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_small_calls_take_the_decode_kernels_and_larger_ones_the_table(backend, monkeypatch):
    policy = DispatchPolicy(table=((0, 1.0),), decode_max_tokens=8, force=True)
    # every call an l0-refresh call: a decode call measures l0 on those only
    layer = make_layer(torch.float32, backend=backend, policy=policy, l0_refresh_every=1).eval()
    # eager Triton decode and hot/cold calls go to the launchers directly; the custom ops are for torch.compile and
    # "torch"
    decode_calls = (_count_calls(monkeypatch, "launch_decode_ffn", mlp_mod) if backend == "triton"
                    else _count_calls(monkeypatch, "decode_gated_ffn_unchecked"))
    # the table's sparse path: the plain TwELL op, or the hot/cold op where the layer's hot set is not empty (which
    # depends on the hot-set rule of hot_cold_plan, not on the dispatch this test is about)
    table_calls = _count_calls(monkeypatch, "sparse_gated_ffn_unchecked")
    hot_cold_calls = (_count_calls(monkeypatch, "launch_hot_cold_ffn", mlp_mod) if backend == "triton"
                      else _count_calls(monkeypatch, "hot_cold_gated_ffn_unchecked"))
    for m in (1, 8, 9):
        x = make_x((m, D), seed=m, dtype=torch.float32)
        with torch.no_grad():
            out = layer(x)
        assert rel_error(out, dense_ref(layer, x)) <= REL_TOL[torch.float32]
        assert layer.last_l0 is not None
        g = x.double() @ layer.gate_proj.weight.detach().double().T
        assert float(layer.last_l0) == pytest.approx(float((g > 0).sum()) / m)
    assert decode_calls == [1, 8] and table_calls + hot_cold_calls == [9]


def test_decode_path_keeps_leading_dimensions_and_skips_the_hot_set(monkeypatch):
    policy = DispatchPolicy(table=(), decode_max_tokens=DECODE_MAX_TOKENS, force=True)
    layer = make_layer(torch.float32, backend="torch", policy=policy, hot_cold=True).eval()
    calls = _count_calls(monkeypatch, "decode_gated_ffn_unchecked")
    x = make_x((2, 3, D), seed=4, dtype=torch.float32)
    with torch.no_grad():
        out = layer(x)
    assert out.shape == (2, 3, D) and calls == [6]
    assert rel_error(out, dense_ref(layer, x)) <= REL_TOL[torch.float32]
    assert not layer._hot_cold.chosen  # a decode call neither uses nor chooses a hot set


def test_decode_calls_measure_l0_on_refresh_calls_only(monkeypatch):
    policy = DispatchPolicy(table=(), decode_max_tokens=8, force=True)
    layer = make_layer(torch.float32, backend="torch", policy=policy, l0_refresh_every=3).eval()
    measured = []
    with torch.no_grad():
        for i in range(6):
            layer.last_l0 = None
            layer(make_x((2, D), seed=i, dtype=torch.float32))
            measured.append(layer.last_l0 is not None)
    assert measured == [True, False, False, True, False, False]


def test_default_policy_leaves_decode_off_until_measured():
    assert DispatchPolicy().decode_max_tokens == 0
    assert not DispatchPolicy().use_decode(1, shape=(2048, 5632))
    on = DispatchPolicy(decode_max_tokens=16)
    assert on.use_decode(16, shape=(2048, 5632)) and not on.use_decode(17, shape=(2048, 5632))
    assert not on.use_decode(0, shape=(2048, 5632))
    assert not on.use_decode(4, device_type="cpu", shape=(2048, 5632))  # not measured there
    assert not on.use_decode(4, shape=(D, FF))  # unmeasured shape
    for bad in (-1, DECODE_MAX_TOKENS + 1, True, 2.0):
        with pytest.raises(ValueError, match="decode_max_tokens"):
            DispatchPolicy(decode_max_tokens=bad)


def test_decode_tables_apply_to_graphed_calls_of_their_shape_by_density():
    shape = (2048, 5632)
    table = ((1, 0.1), (2, 0.02), (16, 0.005), (32, 0.0))
    policy = DispatchPolicy(decode_tables=((shape, table),), decode_graphed=True)
    assert policy.decode_table_for(shape) == table and policy.decode_table_for((D, FF)) is None
    assert policy.use_decode(1, density=0.1, shape=shape) and not policy.use_decode(1, density=0.11, shape=shape)
    assert policy.use_decode(15, density=0.02, shape=shape) and not policy.use_decode(15, density=0.03, shape=shape)
    assert policy.use_decode(31, density=0.005, shape=shape) and not policy.use_decode(16, density=0.006, shape=shape)
    assert not policy.use_decode(32, density=0.001, shape=shape)  # a row of 0: dense but for an all-zero layer
    assert policy.use_decode(64, density=0.0, shape=shape)
    assert not policy.use_decode(DECODE_MAX_TOKENS + 1, density=0.0, shape=shape)
    assert not policy.use_decode(0, density=0.0, shape=shape)
    assert not policy.use_decode(2, density=0.001, shape=(D, FF))  # no table for that shape
    assert not policy.use_decode(2, density=0.001, device_type="cpu", shape=shape)  # not measured there
    assert not policy.use_decode(2, shape=shape)  # density unknown: counts as 1
    for bad in (-0.1, 1.5, float("nan"), True, "0.01"):
        with pytest.raises(ValueError, match="density must be a float in \\[0, 1\\]"):
            policy.use_decode(2, density=bad, shape=shape)
    eager = DispatchPolicy(decode_tables=((shape, table),))  # decode_graphed False: the tables wait for a graph
    assert not eager.use_decode(2, density=0.001, shape=shape)
    # graphed, the shape's calls of up to 64 tokens are the decode table's: never the inference table's TwELL path
    table_sparse = DispatchPolicy(table=((1, 0.2),), decode_tables=((shape, table),), decode_graphed=True)
    assert not table_sparse.use_sparse(8, 0.05, shape=shape) and table_sparse.use_sparse(65, 0.05, shape=shape)
    assert DispatchPolicy(table=((1, 0.2),), decode_tables=((shape, table),)).use_sparse(8, 0.05, shape=shape)
    assert DispatchPolicy(table=((1, 0.2),), shapes=None, decode_graphed=True).use_sparse(8, 0.05, shape=shape)
    # decode_max_tokens still lifts calls up to it whatever the density, in shapes
    both = DispatchPolicy(decode_tables=((shape, table),), decode_graphed=True, decode_max_tokens=4)
    assert both.use_decode(4, density=0.5, shape=shape) and not both.use_decode(5, density=0.5, shape=shape)


def test_a_layer_follows_its_decode_table_at_its_l0_estimate():
    policy = DispatchPolicy(table=(), force=True, decode_tables=(((D, FF), ((1, 0.5),)),), decode_graphed=True)
    layer = make_layer(torch.float32, backend="torch", policy=policy).eval()
    layer._l0_estimate = 0.5 * FF
    assert layer._path(3, "cpu") == "decode"
    layer._l0_estimate = 0.6 * FF
    assert layer._path(3, "cpu") == "dense"
    assert layer._path(DECODE_MAX_TOKENS + 1, "cpu") == "dense"


@pytest.mark.gpu
@pytest.mark.parametrize(("density", "want"), [(0.01, "decode"), (0.5, "dense")])
def test_gpu_recorded_calls_follow_the_shipped_decode_table(density, want):
    """A 2048 x 5632 bf16 layer under the default policy with ``decode_graphed`` (what GreedyDecoder gives it): eight
    tokens in a recorded CUDA graph take the small-batch kernels at a 1 % l0 estimate (the H200 table's row for 5-8
    tokens allows 4.9 %) and the dense path at 50 %; the replayed output matches the fp32 reference either way."""
    import dataclasses

    from twell.generation import record_cuda_graph
    from twell.nn import DEFAULT_POLICY, SparseGatedMLP, static_dispatch
    from twell.reference.inference import dense_gated_ffn
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    gen = torch.Generator(device="cuda").manual_seed(7)
    p = synthetic_ffn_problem(8, 2048, 5632, SparsityProfile(mean_l0=40.0), generator=gen, device="cuda")
    policy = dataclasses.replace(DEFAULT_POLICY, decode_graphed=True)
    layer = SparseGatedMLP.from_weights(p["w_gate"], p["w_up"], p["w_down"], policy=policy).eval()
    layer._l0_estimate = density * 5632
    layer.w_down_unit_major()
    assert layer._path(8, "cuda") == want
    x = p["x"]
    out = torch.full_like(x, float("nan"))

    def step() -> None:
        with static_dispatch(unit_major_down=True):
            out.copy_(layer(x))

    with torch.no_grad():
        replay = record_cuda_graph(step)
        out.fill_(float("nan"))
        replay()
    torch.cuda.synchronize()
    want_out = dense_gated_ffn(*(p[k].float() for k in ("x", "w_gate", "w_up", "w_down")))
    assert rel_error(out, want_out) <= REL_TOL[torch.bfloat16]
