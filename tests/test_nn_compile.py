"""SparseGatedMLP's inference path under torch.compile (aot_eager, CPU): one graph, eager's outputs.

The eager path counts calls and refreshes l0 every few calls; traced, that state made dynamo recompile
on every call until its cache limit, after which the layer ran uncompiled.  The traced path decides
from the current estimate only.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import recording_backend
from test_nn_mlp import FF, D, make_layer, make_x
from torch._dynamo.utils import counters

from twell.nn import DispatchPolicy

POLICIES = {
    "dense": DispatchPolicy.always_dense(),
    "sparse": DispatchPolicy.always_sparse(),
    "decode": DispatchPolicy(table=(), decode_max_tokens=8, force=True),
    # the layer's 32 x 128 unmeasured, between two measured shapes whose tables both run 4 tokens sparse: the envelope
    # a decode table for the layer's D x FF, applied as in a recorded step (what GreedyDecoder sets)
    "decode-table": DispatchPolicy(table=(), force=True, decode_tables=(((D, FF), ((1, 1.0),)),), decode_graphed=True),
    "envelope": DispatchPolicy(shape_tables=(((16, 64), ((1, 1.0),)), ((64, 256), ((1, 1.0),))),
                               shapes=((16, 64), (64, 256)), device_types=("cpu",), other_shapes="envelope"),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_compiled_layer_is_one_graph_with_eager_outputs(name):
    torch._dynamo.reset()
    counters.clear()
    layer = make_layer(torch.float32, policy=POLICIES[name]).eval()
    x = make_x((4, D), seed=0, dtype=torch.float32)
    with torch.no_grad():
        want = layer(x)  # eager: sets the l0 estimate the traced path reads
        if name == "decode-table":
            assert layer._path(4, "cpu") == "decode"
        if name == "envelope":
            assert layer.policy.envelope_shapes((D, 128)) == ((16, 64), (64, 256))
            assert layer._path(4, "cpu") == "sparse"  # the envelope's table, not the dense default for other shapes
        compiled = torch.compile(layer, backend="aot_eager")
        for _ in range(12):
            assert torch.equal(compiled(x), want)
    assert counters["frames"]["total"] == 1  # no recompilation and no graph break


@pytest.mark.parametrize("always", ["dense", "sparse"])
def test_compiled_training_layer_never_recompiles(always, monkeypatch):
    """train_impl="auto" under torch.compile: the switch decides from its estimate without counting calls
    (the count recompiled the graph every call).  The sparse path is the PyTorch reference Function here
    (the Triton interpreter is not something to trace); it breaks the graph, which is allowed;
    recompiling is not."""
    import twell.nn.mlp as mlp_mod
    from twell.nn.train_dispatch import TrainDispatchPolicy
    from twell.reference.training import gated_ffn_l1

    monkeypatch.setattr(mlp_mod, "sparse_train_fn", lambda device: gated_ffn_l1)
    policy = TrainDispatchPolicy.always_dense() if always == "dense" else TrainDispatchPolicy.always_sparse()
    torch._dynamo.reset()
    counters.clear()
    layer = make_layer(torch.float32, train_impl="auto", train_policy=policy).train()
    x0 = make_x((8, D), seed=0, dtype=torch.float32)
    layer(x0).sum().backward()  # an eager call: the switch's l0 estimate
    eager_calls = layer._train_switch.calls
    compiled = torch.compile(layer, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):  # a recompilation raises
        for _ in range(10):
            x = x0.clone().requires_grad_(True)
            (compiled(x).sum() + layer.l1_loss()).backward()
    assert layer._train_switch.calls == eager_calls  # the compiled calls counted nothing
    if always == "dense":
        assert counters["frames"]["total"] == 1


def test_compiled_hot_cold_training_layer_matches_eager_without_recompiling():
    """train_impl="hot-cold": the hot set chosen by an eager call; compiled calls run the custom-op form
    of the op (twell::hot_cold_gated_ffn_l1) with that set, the eager results, no recompilation."""
    layer = make_layer(torch.float32, train_impl="hot-cold").train()
    x0 = make_x((24, D), seed=3, dtype=torch.float32)
    layer(x0.clone().requires_grad_(True)).sum().backward()  # eager: chooses the hot set

    def step(fn):
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        out = fn(x)
        (out.square().sum() + 0.5 * layer.l1_loss()).backward()
        return out.detach(), x.grad, [p.grad for p in layer.parameters()]

    want = step(layer)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            got = step(compiled)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for a, b in zip(got[2], want[2], strict=True):
        assert torch.equal(a, b)


def test_compiled_hot_cold_reads_the_prepared_copies_inside_static_dispatch_cached_weights():
    """Inside ``static_dispatch(cached_weights=True)`` the traced split reads the plan's copies and the cached Wd^T
    that ``prepare_static_weights`` made current (no gather or concatenation of weights in the graph), and matches
    eager; after a weight update and another ``prepare_static_weights`` it matches eager again.  Outside the flag the
    graph builds its copies, as before."""
    from test_ops_kernels import make_problem

    from twell.nn import SparseGatedMLP, static_dispatch

    prob = make_problem(48, 32, 128, frac_pos=0.01, seed=2, dtype=torch.float32, device="cpu")
    layer = SparseGatedMLP.from_weights(prob["w_gate"], prob["w_up"], prob["w_down"], backend="triton", tile=32,
                                        policy=DispatchPolicy.always_sparse()).eval()
    x = prob["x"]
    torch._dynamo.reset()
    with torch.no_grad():
        want = layer(x)  # eager: l0 estimate, hot units chosen, plan built
        assert layer.prepare_static_weights() is True
        plan = layer._hot_cold._plan
        for t in (plan.w_gemm, plan.w_down_hot_t, layer._wd_unit_major):
            assert getattr(t, "_dynamo_static_input_type", None) is not None  # recorded graphs read them in place
        graphs: list[str] = []
        compiled = torch.compile(layer, backend=recording_backend(graphs))
        with static_dispatch(cached_weights=True):
            assert torch.equal(compiled(x), want)
        assert "hot_cold_gated_ffn_unchecked" in graphs[-1]
        assert "index_select" not in graphs[-1] and "torch.cat" not in graphs[-1], graphs[-1]
        with static_dispatch():  # the flag off: a graph of its own, which builds the copies
            assert torch.equal(compiled(x), want)
        assert "index_select" in graphs[-1]
        for w in layer.parameters():
            w.mul_(1.25)
        want = layer(x)
        assert layer.prepare_static_weights() is True
        with static_dispatch(cached_weights=True):
            assert torch.equal(compiled(x), want)
    torch._dynamo.reset()
    # a layer that runs no split (the torch backend) has only the cached Wd^T to offer
    assert SparseGatedMLP.from_weights(prob["w_gate"], prob["w_up"], prob["w_down"],
                                       backend="torch").prepare_static_weights() is False


def test_compiled_hot_cold_inference_builds_its_weight_copies_from_the_current_weights():
    """Traced, the hot/cold split reads only the unit ids from the cache and builds the weight copies
    in the graph: after an in-place weight update (which no dynamo guard sees) the compiled layer
    still matches eager, which rebuilt its cached plan."""
    from test_ops_kernels import make_problem

    from twell.nn import SparseGatedMLP

    prob = make_problem(48, 32, 128, frac_pos=0.01, seed=2, dtype=torch.float32, device="cpu")
    layer = SparseGatedMLP.from_weights(prob["w_gate"], prob["w_up"], prob["w_down"], backend="triton", tile=32,
                                        policy=DispatchPolicy.always_sparse()).eval()
    x = prob["x"]
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        want = layer(x)  # eager: l0 estimate, hot units chosen, plan built
        plan = layer._hot_cold._plan
        assert plan is not None and plan.hot.numel() > 0 and plan.cold.numel() > 0
        graphs: list[str] = []
        compiled = torch.compile(layer, backend=recording_backend(graphs))
        assert torch.equal(compiled(x), want)
        assert len(graphs) == 1 and "hot_cold_gated_ffn_unchecked" in graphs[0]  # the split, traced
        for w in layer.parameters():
            w.mul_(1.25)  # an optimizer step, say: eager sees the version bump, dynamo does not
        want = layer(x)
        assert torch.equal(compiled(x), want)
    assert counters["frames"]["total"] == 1


def test_compiled_hot_cold_training_rechooses_the_hot_set_for_a_larger_batch():
    """A set chosen by an eager call on 8 tokens, then compiled steps of 64: the token-count rule re-chooses the set
    on the compiled call (eagerly, outside the graph), as an eager call would; the results are the op's with that
    set.  Traced with the eager call's set instead (until session 55), the 1.5B benchmark model's compiled step
    spilled up to 10,167 of 16,384 tokens a layer to the dense recompute (0.068x of dense on an H100)."""
    from twell.ops import twell_gated_ffn_l1_hot_cold

    layer = make_layer(torch.float32, train_impl="hot-cold").train()
    layer(make_x((8, D), seed=5, dtype=torch.float32)).sum().backward()  # eager: a set chosen on 8 tokens
    assert layer._train_hot_tokens == 8
    small_set = layer._train_hot
    x0 = make_x((64, D), seed=6, dtype=torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager")
    calls = layer._train_hot_calls
    got = compiled(x0.clone().requires_grad_(True))
    assert layer._train_hot_tokens == 64 and layer._train_hot is not small_set  # re-chosen under compile
    assert layer._train_hot_calls == calls + 1  # compiled calls count toward the refresh, as eager ones
    want = twell_gated_ffn_l1_hot_cold(x0, *layer._weights(), layer._train_hot)[0]
    assert torch.equal(got, want)


def test_compiled_hot_cold_training_follows_refreshed_sets_of_any_size(monkeypatch):
    """Refreshed under compile at every call (l0_refresh_every=1) to sets of 0 to 128 hot units with cold l0 estimates
    that change the ELL width: each compiled call computes the op's eager result with the set it was given, forward
    and backward.  Dynamo compiles the graph after the break again when a size first changes (then marked dynamic;
    0 hot units and width 1 are specialised, as dynamo does sizes 0 and 1), and the second pass over the same sets
    compiles nothing."""
    import twell.nn.mlp as mlp_mod
    from twell.ops import twell_gated_ffn_l1_hot_cold
    from twell.ops.hot_cold_training import hot_units

    sets = [(torch.arange(0), 3.0), (torch.arange(64), 1.0), (torch.arange(32, 160, 2), 20.0),
            (torch.arange(128), 0.0), (torch.arange(0, 128, 2), 40.0), (torch.arange(64, 128), 9.0)]
    given: list = []

    def chooser(x, w_gate):
        ids, cold_l0 = sets[len(given) % len(sets)]
        given.append(hot_units(ids[ids < FF], FF, cold_l0=cold_l0))
        return given[-1]

    monkeypatch.setattr(mlp_mod, "choose_training_hot_units", chooser)
    layer = make_layer(torch.float32, train_impl="hot-cold", l0_refresh_every=1).train()
    x0 = make_x((24, D), seed=7, dtype=torch.float32)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(layer, backend="aot_eager")
    graphs_after_pass = []
    for _ in range(2):
        for _ in range(len(sets)):
            x = x0.clone().requires_grad_(True)
            layer.zero_grad(set_to_none=True)
            out = compiled(x)
            (out.square().sum() + 0.5 * layer.l1_loss()).backward()
            xr = x0.clone().requires_grad_(True)
            weights = [p.detach().clone().requires_grad_(True) for p in layer._weights()]
            ref_out, ref_l1, _ = twell_gated_ffn_l1_hot_cold(xr, *weights, given[-1])
            (ref_out.square().sum() + 0.5 * ref_l1).backward()
            assert torch.equal(out.detach(), ref_out.detach()) and torch.equal(x.grad, xr.grad)
            for a, b in zip(layer._weights(), weights, strict=True):
                assert torch.equal(a.grad, b.grad)
        graphs_after_pass.append(counters["stats"]["unique_graphs"])
    assert len(given) == 2 * len(sets)
    assert graphs_after_pass[1] == graphs_after_pass[0] <= 1 + 4, graphs_after_pass  # before the break + 4 after
