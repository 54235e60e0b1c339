"""The eager floor (``DispatchPolicy.eager_min_tokens``; ``eager_min_flops`` too where the module and policy files are
concerned): eager calls below the floor run dense, and so do calls traced by torch.compile outside ``static_dispatch``;
static-dispatch and recorded calls, and calls at or above the floor, follow the tables; the floor is validated, stored
in policy files and told by the summary."""

from __future__ import annotations

import pytest
import torch
from _helpers import count_sparse_calls, recording_backend

from twell.nn import DEFAULT_POLICY, DispatchPolicy, SparseGatedMLP, load_policy, save_policy, static_dispatch
from twell.nn.dispatch_file import policy_from_dict, policy_to_dict
from twell.nn.dispatch_summary import inference_summary
from twell.tolerances import REL_TOL, rel_error

SPARSE_EVERYWHERE = {"table": ((0, 1.0),), "shapes": None}


def test_the_default_policy_sets_no_token_floor():
    """The default's floor is in work (``eager_min_flops``, tests/test_dispatch_eager_flops.py), not in tokens."""
    assert DEFAULT_POLICY.eager_min_tokens == 0
    assert DispatchPolicy().eager_min_tokens == 0 and DispatchPolicy().eager_floor_tokens((2048, 5632)) == 0


@pytest.mark.parametrize("floor", [-1, 1.5, True, "64", None])
def test_a_bad_floor_is_refused_by_name(floor):
    with pytest.raises(ValueError, match=r"eager_min_tokens must be an int >= 0 \(0: no floor for eager calls\), got"):
        DispatchPolicy(eager_min_tokens=floor)


def test_eager_calls_below_the_floor_run_dense_and_others_follow_the_table():
    policy = DispatchPolicy(**SPARSE_EVERYWHERE, eager_min_tokens=4096)
    for n in (1, 100, 4095):
        assert not policy.use_sparse(n, 0.005, eager=True)
        assert policy.use_sparse(n, 0.005)  # not eager: the table's answer
    assert policy.use_sparse(4096, 0.005, eager=True) and policy.use_sparse(131072, 0.005, eager=True)
    forced = DispatchPolicy(table=((0, 1.0),), force=True, eager_min_tokens=8)
    assert not forced.use_sparse(4, 0.5, device_type="cpu", eager=True)  # force lifts device and shape limits only
    assert forced.use_sparse(4, 0.5, device_type="cpu") and forced.use_sparse(8, 0.5, device_type="cpu", eager=True)
    assert DispatchPolicy(**SPARSE_EVERYWHERE).use_sparse(1, 0.005, eager=True)  # no floor


def test_the_floor_applies_to_the_small_batch_kernels_too():
    policy = DispatchPolicy(**SPARSE_EVERYWHERE, decode_max_tokens=8, eager_min_tokens=4)
    assert policy.use_decode(2) and not policy.use_decode(2, eager=True)
    assert policy.use_decode(4, eager=True) and policy.use_decode(8, eager=True)


@pytest.mark.parametrize("eager", [1, "yes", None])
def test_eager_must_be_a_bool(eager):
    policy = DispatchPolicy(**SPARSE_EVERYWHERE, eager_min_tokens=4)
    with pytest.raises(TypeError, match="eager must be a bool"):
        policy.use_sparse(2, 0.005, eager=eager)
    with pytest.raises(TypeError, match="eager must be a bool"):
        DispatchPolicy(**SPARSE_EVERYWHERE, decode_max_tokens=8).use_decode(2, eager=eager)


@pytest.mark.parametrize(("policy", "key", "bad", "refusal"), [
    # files written before session 41 have no eager_min_tokens, before session 43 no eager_min_flops
    (DispatchPolicy(table=((1024, 0.01),), eager_min_tokens=2048), "eager_min_tokens", -5,
     "p.json: eager_min_tokens must be an int >= 0"),
    (DEFAULT_POLICY, "eager_min_flops", -1, "p.json: eager_min_flops must be a finite number >= 0"),
])
def test_policy_files_keep_the_floor_and_older_files_load_without_one(tmp_path, policy, key, bad, refusal):
    assert load_policy(save_policy(policy, tmp_path / "p.json")) == policy
    older = policy_to_dict(policy)
    del older[key]
    assert getattr(policy_from_dict(older), key) == 0
    broken = {**policy_to_dict(policy), key: bad}
    with pytest.raises(ValueError, match=refusal):
        policy_from_dict(broken, source="p.json")


def test_the_summary_tells_the_floor():
    hopper = (9, 0)
    assert "eager" not in inference_summary(DEFAULT_POLICY.without_eager_floor(), "cuda", hopper)
    text = inference_summary(DispatchPolicy(eager_min_tokens=4096), "cuda", hopper)
    recorded = (", but for those a layer records in CUDA graphs (SparseGatedMLP eager_graphs, on by default: from "
                "4096 tokens' work at 2048x5632 below the floor, up to 12288 above it; twell.nn.call_graphs)")
    assert text.endswith("; eager calls (also those compiled outside static_dispatch) of fewer than 4096 tokens "
                         "(eager_min_tokens) run dense" + recorded)
    forced = inference_summary(DispatchPolicy(table=((0, 1.0),), force=True, eager_min_tokens=16), "cpu", None)
    assert forced.startswith("forced: ") and forced.endswith("fewer than 16 tokens (eager_min_tokens) run dense"
                                                             + recorded)


def _layer(**floor: int) -> SparseGatedMLP:
    torch.manual_seed(0)
    policy = DispatchPolicy(table=((0, 1.0),), device_types=("cpu",), shapes=None, **floor)
    return SparseGatedMLP(32, 64, policy=policy, dtype=torch.float64).eval()


#: The same floor of 16 tokens for the 32 x 64 layer, in tokens and in dense FFN work (6 x 16 x 32 x 64).
FLOORS_OF_16 = [{"eager_min_tokens": 16}, {"eager_min_flops": 6 * 16 * 32 * 64}]


@pytest.mark.parametrize("floor", FLOORS_OF_16, ids=["tokens", "flops"])
def test_the_module_runs_eager_calls_below_the_floor_dense(monkeypatch, floor):
    layer = _layer(**floor)
    dense = layer.to_dense().eval()
    calls = count_sparse_calls(monkeypatch)
    with torch.no_grad():
        for m in (1, 15, 16, 40):
            x = torch.randn(m, 32, dtype=torch.float64)
            assert rel_error(layer(x), dense(x)) <= REL_TOL[torch.float64]
            assert layer._use_sparse(m, "cpu", eager=True) == (m >= 16)
            assert layer._use_sparse(m, "cpu")  # the same layer, not eager: the table's answer
        layer.policy = layer.policy.without_eager_floor()  # a new policy: the layer works its floor out again
        layer(torch.randn(3, 32, dtype=torch.float64))
    assert calls == [16, 40, 3]  # 1 and 15 tokens took the dense path


def test_static_dispatch_calls_are_not_eager(monkeypatch):
    """Inside ``static_dispatch`` (what recording a CUDA graph needs) the layer asks the policy without ``eager``, so
    the floor does not apply there."""
    layer = _layer(eager_min_tokens=16)
    asked: list[tuple[int, bool]] = []
    real = DispatchPolicy.use_sparse

    def spy(self, n_tokens, density, **kw):
        asked.append((n_tokens, kw.get("eager", False)))
        return real(self, n_tokens, density, **kw)

    x = torch.randn(4, 32, dtype=torch.float64)
    with torch.no_grad():
        layer(x)  # an eager call sets the l0 estimate
        monkeypatch.setattr(DispatchPolicy, "use_sparse", spy)
        with static_dispatch():
            out = layer(x)
    assert asked == [(4, False)]
    assert rel_error(out, layer.to_dense()(x)) <= REL_TOL[torch.float64]


def _compiled_graph(layer: SparseGatedMLP, x: torch.Tensor, *,
                    inside_static_dispatch: bool) -> tuple[str, torch.Tensor]:
    """The code of the graph torch.compile traces for ``layer(x)`` (run as traced) and its output."""
    import contextlib

    graphs: list[str] = []

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=recording_backend(graphs))
    with torch.no_grad(), static_dispatch() if inside_static_dispatch else contextlib.nullcontext():
        out = compiled(x)
    assert len(graphs) == 1, graphs
    return graphs[0], out


@pytest.mark.parametrize("floor", FLOORS_OF_16, ids=["tokens", "flops"])
def test_compiled_calls_are_eager_outside_static_dispatch(floor):
    """A graph compiled without CUDA graphs issues its launches from the host like eager code (session 45: the 1.5B
    backbone under inductor's default mode at 4096 tokens ran 0.794x of compiled dense with the tables alone), so a
    call traced outside ``static_dispatch`` below the floor runs dense; traced inside (the recipe for
    ``mode="reduce-overhead"``) or at the floor, it follows the table."""
    layer = _layer(**floor)
    dense = layer.to_dense().eval()
    with torch.no_grad():
        layer(torch.randn(4, 32, dtype=torch.float64))  # an eager call sets the l0 estimate the traced path reads
    for m, inside, sparse in [(4, False, False), (4, True, True), (15, False, False), (16, False, True)]:
        x = torch.randn(m, 32, dtype=torch.float64)
        graph, out = _compiled_graph(layer, x, inside_static_dispatch=inside)
        assert ("sparse_gated_ffn_unchecked" in graph) == sparse, (m, inside, graph)
        assert rel_error(out, dense(x)) <= REL_TOL[torch.float64]
    torch._dynamo.reset()


def test_one_compiled_layer_follows_static_dispatch_in_and_out_without_a_reset():
    """dynamo guards the traced decision on ``static_dispatch``'s depth: the same compiled layer gets a second graph
    inside it (sparse below the floor) and goes back to the first outside (dense), with no reset between."""
    layer = _layer(eager_min_tokens=16)
    x = torch.randn(4, 32, dtype=torch.float64)
    graphs: list[str] = []

    torch._dynamo.reset()
    with torch.no_grad():
        layer(x)  # an eager call sets the l0 estimate
        compiled = torch.compile(layer, backend=recording_backend(graphs))
        outs = [compiled(x)]
        with static_dispatch():
            outs.append(compiled(x))
        outs.append(compiled(x))
    torch._dynamo.reset()
    assert ["sparse_gated_ffn_unchecked" in g for g in graphs] == [False, True]
    want = layer.to_dense()(x)
    assert all(rel_error(out, want) <= REL_TOL[torch.float64] for out in outs)
