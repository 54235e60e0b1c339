"""SparseGatedMLP's recorded eager calls (``eager_graphs``, ``twell.nn.call_graphs``).

On the CPU a recorder that replays by running the recorded launch again (the Triton interpreter's kernels on the
static buffers) stands in for CUDA graphs: the bookkeeping -- which call records, replays, runs dense or eagerly, what
invalidates a recording, the shared buffers, fresh outputs -- is the same code; the GPU tests at the end record real
CUDA graphs."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from _helpers import hot_cold_test_layer, hot_cold_test_tokens

from twell.nn import DispatchPolicy, SparseGatedMLP, graph_eager_calls
from twell.nn import call_graphs as cg
from twell.ops.hot_cold import launch_hot_cold_ffn
from twell.reference.inference import dense_gated_ffn
from twell.tolerances import REL_TOL, rel_error

D, F, M = 32, 256, 40
FLOOR = 64  # eager calls under 64 tokens are below the floor


class ReplayingRecorder:
    """``call_graphs.Recorder`` for the CPU: records the launch, replays it by running it again; counts both."""

    def __init__(self) -> None:
        self.records = 0
        self.replays = 0
        self.syncs = 0
        self.stream = 0

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def stream_key(self, device: torch.device) -> int:
        return self.stream

    def record(self, launch, device):  # noqa: ANN001, ANN201 - the Recorder protocol's signature
        self.records += 1

        def replay() -> None:
            self.replays += 1
            launch()

        return replay

    def synchronize(self, device: torch.device) -> None:
        self.syncs += 1


@pytest.fixture
def recorder(monkeypatch) -> ReplayingRecorder:  # noqa: ANN001
    """The CPU recorder, no floor in work for recording (the test layer's calls are tiny) and no recording at or above
    the eager floor (tests that want it set ``RECORD_MAX_FLOPS``)."""
    rec = ReplayingRecorder()
    monkeypatch.setattr(cg, "RECORDER", rec)
    monkeypatch.setattr(cg, "RECORD_MIN_FLOPS", 0)
    monkeypatch.setattr(cg, "RECORD_MAX_FLOPS", 0)
    return rec


def _layer(eager_graphs: int = 2, *, policy: DispatchPolicy | None = None, **kw) -> SparseGatedMLP:
    """The split's 32 x 256 test layer (64 frequent units) whose tables say sparse at every count, eager calls under
    64 tokens below its floor (``policy``: another)."""
    policy = policy or DispatchPolicy(table=((1, 1.0),), force=True, eager_min_tokens=FLOOR)
    kw.setdefault("l0_refresh_every", 1000)
    return hot_cold_test_layer(policy, eager_graphs=eager_graphs, **kw)


_x = hot_cold_test_tokens


def _want(layer: SparseGatedMLP, x: torch.Tensor) -> torch.Tensor:
    return dense_gated_ffn(x, layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)


def _split(layer: SparseGatedMLP, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's hot/cold op on ``x`` launched directly with its current plan and dense-row budget."""
    w = (layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)
    plan = layer._hot_cold._plan
    out, _ = launch_hot_cold_ffn(x, plan, w[0], w[1], layer.w_down_unit_major(), tile=layer.tile,
                                 capacity=layer._sparse_prep.capacity, dense_rows=layer._hot_cold.dense_rows(len(x)),
                                 residual=residual)
    return out


def _spy_split(monkeypatch) -> list[int]:  # noqa: ANN001
    """Tokens of every hot/cold launch the layer makes eagerly from now on (recordings and replays not counted)."""
    from twell.nn import mlp

    seen: list[int] = []
    real = mlp.launch_hot_cold_ffn

    def spy(x, *a, **k):  # noqa: ANN001, ANN202
        if "out" not in k:  # the recorded launch passes its static output
            seen.append(x.shape[0])
        return real(x, *a, **k)

    monkeypatch.setattr(mlp, "launch_hot_cold_ffn", spy)
    return seen


def test_first_call_dense_second_records_then_replays(recorder, monkeypatch):
    layer = _layer()
    eager = _spy_split(monkeypatch)
    xs = [_x(M, seed=i) for i in range(5)]
    outs = []
    with torch.no_grad():
        for x in xs:
            outs.append(layer(x))
    # call 0, the count's first, runs as without recordings (dense below the floor; it measures l0), call 1 runs the
    # split eagerly (choosing the hot units) and records it, calls 2-4 replay
    assert eager == [M]
    assert recorder.records == 1 and recorder.replays == 3
    assert layer._hot_cold.n_hot == 64 and list(layer._graphs.calls) == [M]
    for x, out in zip(xs, outs, strict=True):
        assert rel_error(out, _want(layer, x)) <= REL_TOL[torch.float32]
    for x, out in zip(xs[1:], outs[1:], strict=True):  # the split's bits, recorded or not
        assert torch.equal(out, _split(layer, x))
    # each replay's output is fresh: the static output is overwritten by the next replay, not the caller's tensor
    call = layer._graphs.calls[M]
    assert all(out.data_ptr() != call.out.data_ptr() for out in outs)
    assert torch.equal(outs[3], _split(layer, xs[3]))


def test_residual_is_added_outside_the_recording_with_the_fused_adds_bits(recorder):
    layer = _layer()
    x, res = _x(M, seed=3), torch.randn(M, D, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        outs = [layer(x, residual=res) for _ in range(4)]  # dense, eager and recorded, replay, replay
        want = _split(layer, x, residual=res)
    assert recorder.replays == 2
    assert all(torch.equal(out, want) for out in outs[1:])
    assert rel_error(outs[0], res + _want(layer, x)) <= REL_TOL[torch.float32]


def test_leading_dimensions_are_kept(recorder):
    layer = _layer()
    x = _x(M, seed=5).reshape(2, M // 2, D)
    with torch.no_grad():
        outs = [layer(x) for _ in range(4)]
    assert recorder.replays == 2
    assert all(out.shape == x.shape for out in outs)
    assert torch.equal(outs[3], _split(layer, x.reshape(M, D)).reshape(x.shape))


def test_counts_beyond_the_limit_run_as_without_recordings(recorder, monkeypatch):
    layer = _layer(eager_graphs=1)
    eager = _spy_split(monkeypatch)
    with torch.no_grad():
        layer(_x(M, seed=0))  # the first of 40: dense, measures l0
        for m in (M, 48, M, 48, M, 48, M, 48):
            out = layer(_x(m, seed=m))
            assert rel_error(out, _want(layer, _x(m, seed=m))) <= REL_TOL[torch.float32]
    # 40 recorded on its second call and replayed three times; 48 never: no room, so dense (no eager split either)
    assert eager == [M] and recorder.records == 1 and recorder.replays == 3
    assert list(layer._graphs.calls) == [M]


def test_a_stale_count_gives_its_place_to_a_new_one(recorder, monkeypatch):
    monkeypatch.setattr(cg, "STALE_CALLS", 4)
    layer = _layer(eager_graphs=1)
    eager = _spy_split(monkeypatch)
    with torch.no_grad():
        for m in (M, M, M, 48, 48, 48, 48, 48, M, M):
            out = layer(_x(m, seed=m))
            assert rel_error(out, _want(layer, _x(m, seed=m))) <= REL_TOL[torch.float32]
    # calls 1-3 (40): dense, recorded, replayed (last used at call 3); 48's calls 4-6 find no room (40 used 1-3 calls
    # ago) and run dense; call 7 finds 40 unused for 4 calls: the split eagerly, recorded in 40's place; call 8 replays;
    # 40's calls 9-10 find no room (48 used 1-2 calls ago) and run dense
    assert eager == [M, 48] and recorder.records == 2 and recorder.replays == 2
    assert list(layer._graphs.calls) == [48] and recorder.syncs >= 1


def test_counts_cycling_within_the_stale_bound_evict_nothing(recorder, monkeypatch):
    monkeypatch.setattr(cg, "STALE_CALLS", 4)
    layer = _layer(eager_graphs=1)
    with torch.no_grad():
        for m in (M, M) + (M, 48, 48) * 4:  # 40 comes back every third call: never stale
            layer(_x(m, seed=m))
    assert recorder.records == 1 and list(layer._graphs.calls) == [M]


def test_two_counts_recorded_share_nothing_but_the_pool(recorder):
    layer = _layer(eager_graphs=2)
    with torch.no_grad():
        layer(_x(M, seed=0))
        for _ in range(3):
            for m in (M, 48):
                layer(_x(m, seed=m))
    assert recorder.records == 2 and set(layer._graphs.calls) == {M, 48}
    a, b = layer._graphs.calls[M], layer._graphs.calls[48]
    assert a.x.shape == (M, D) and b.x.shape == (48, D) and a.out.data_ptr() != b.out.data_ptr()


def test_layers_of_one_shape_share_the_static_buffers(recorder):
    first, second = _layer(), _layer()
    with torch.no_grad():
        for _ in range(3):
            for layer in (first, second):
                layer(_x(M, seed=1))
    a, b = first._graphs.calls[M], second._graphs.calls[M]
    assert a.x is b.x and a.out is b.out
    recorder.stream = 1  # another stream: its own buffers, and the layer's recordings of the old one dropped
    with torch.no_grad():
        first(_x(M, seed=1))
    c = first._graphs.calls[M]
    assert recorder.records == 3 and c.x is not a.x


def test_a_weight_update_drops_the_recordings(recorder):
    layer = _layer()
    with torch.no_grad():
        for _ in range(4):
            layer(_x(M, seed=0))
        assert recorder.records == 1
        layer.up_proj.weight.mul_(-1.0)
        x = _x(M, seed=6)
        out = layer(x)  # a new weight state: recorded again (eagerly run, then recorded)
        again = layer(x)
    assert recorder.records == 2 and recorder.replays == 3
    assert rel_error(out, _want(layer, x)) <= REL_TOL[torch.float32]
    assert torch.equal(again, out)


def test_refresh_calls_run_the_split_eagerly_and_rechoose_the_hot_units(recorder, monkeypatch):
    layer = _layer(l0_refresh_every=4)
    refreshes = []
    original = layer._hot_cold.refresh
    layer._hot_cold.refresh = lambda *a, **k: (refreshes.append(1), original(*a, **k))[1]
    eager = _spy_split(monkeypatch)
    with torch.no_grad():
        for i in range(9):
            layer(_x(M, seed=i))
    # call 0: dense (the count's first; l0); 1: eager, chooses the hot units, records; 2-3: replays; 4: refresh,
    # eager (the same hot set kept); 5-7: replays; 8: refresh, eager
    assert eager == [M, M, M] and len(refreshes) == 3
    assert recorder.records == 1 and recorder.replays == 5
    assert layer.last_l0 is not None and 1.0 < float(layer.last_l0) < F


def test_calls_at_or_above_the_floor_or_needing_grad_are_not_recorded(recorder):
    layer = _layer()
    with torch.no_grad():
        for _ in range(4):
            out = layer(_x(FLOOR, seed=2))  # at the floor: the tables' split, eagerly, every call
    assert recorder.records == 0
    assert rel_error(out, _want(layer, _x(FLOOR, seed=2))) <= REL_TOL[torch.float32]
    x = _x(M, seed=3).requires_grad_(True)
    for _ in range(4):  # eval mode with grad: the dense path, whatever the policy says
        out = layer(x)
    assert recorder.records == 0 and out.requires_grad


def test_calls_above_the_floor_are_recorded_up_to_the_bound_in_work(recorder, monkeypatch):
    monkeypatch.setattr(cg, "RECORD_MAX_FLOPS", 6 * 96 * D * F)  # at or above the floor: 96 tokens recorded, 128 not
    layer = _layer(eager_graphs=3)
    eager = _spy_split(monkeypatch)
    xs = {m: [_x(m, seed=m + i) for i in range(4)] for m in (FLOOR, 96, 128)}
    with torch.no_grad():
        outs = {m: [layer(x) for x in xs[m]] for m in xs}
    # above the floor a count's first call runs the split eagerly already (as without recordings), the second records
    assert eager == [FLOOR, FLOOR, 96, 96, 128, 128, 128, 128]
    assert recorder.records == 2 and recorder.replays == 4
    assert sorted(layer._graphs.calls) == [FLOOR, 96]
    for m in xs:
        for x, out in zip(xs[m], outs[m], strict=True):
            assert torch.equal(out, _split(layer, x))


def test_a_policy_without_an_eager_floor_records_up_to_the_bound(recorder, monkeypatch):
    monkeypatch.setattr(cg, "RECORD_MAX_FLOPS", 6 * M * D * F)
    layer = _layer(policy=DispatchPolicy(table=((1, 1.0),), force=True))
    xs = [_x(M, seed=i) for i in range(4)]
    with torch.no_grad():
        outs = [layer(x) for x in xs]
    assert recorder.records == 1 and recorder.replays == 2 and list(layer._graphs.calls) == [M]
    assert all(torch.equal(out, _split(layer, x)) for x, out in zip(xs, outs, strict=True))


def test_threads_calling_one_layer_get_their_own_tokens_results(recorder):
    """Replays share the static input and output: the lock keeps one thread's copy in, replay and copy out together
    (the CPU stand-in replays synchronously, so an interleaved copy would show as another thread's result)."""
    import threading

    layer = _layer()
    with torch.no_grad():
        for i in range(2):
            layer(_x(M, seed=100 + i))  # the count's first call, then the recording
    assert recorder.records == 1
    xs = [_x(M, seed=i) for i in range(6)]
    with torch.no_grad():
        wants = [_split(layer, x) for x in xs]
    bad: list[int] = []

    def work(k: int) -> None:
        with torch.no_grad():
            for _ in range(5):
                if not torch.equal(layer(xs[k]), wants[k]):
                    bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == [] and recorder.replays == 5 * len(xs) and recorder.records == 1


def test_no_recording_without_the_split_or_where_the_recorder_cannot(recorder, monkeypatch):
    plain = _layer(hot_cold=False)
    with torch.no_grad():
        for _ in range(4):
            out = plain(_x(M, seed=4))
    assert recorder.records == 0 and rel_error(out, _want(plain, _x(M, seed=4))) <= REL_TOL[torch.float32]
    monkeypatch.setattr(recorder, "supports", lambda device: False)
    layer = _layer()
    with torch.no_grad():
        for _ in range(4):
            layer(_x(M, seed=4))
    assert recorder.records == 0 and not layer._hot_cold.chosen  # below the floor: dense, as without recordings


def test_calls_under_the_recording_floor_in_work_run_as_without_recordings(recorder, monkeypatch):
    monkeypatch.setattr(cg, "RECORD_MIN_FLOPS", 6 * M * D * F)  # 40 tokens of this layer: recorded; 32: not
    layer = _layer()
    with torch.no_grad():
        for m in (M, 32) * 4:
            out = layer(_x(m, seed=m))
            assert rel_error(out, _want(layer, _x(m, seed=m))) <= REL_TOL[torch.float32]
    assert recorder.records == 1 and list(layer._graphs.calls) == [M] and 32 not in layer._graphs.seen
    assert cg.RECORD_MIN_FLOPS == 6 * M * D * F


def test_the_shipped_recording_floor_is_4096_tokens_at_2048x5632():
    assert cg.RECORD_MIN_FLOPS == 6 * 4096 * 2048 * 5632


def test_tables_that_say_dense_are_followed(recorder):
    dense_everywhere = DispatchPolicy(table=((10**9, 1.0),), force=True, eager_min_tokens=FLOOR)
    layer = _layer(policy=dense_everywhere)
    with torch.no_grad():
        for _ in range(4):
            layer(_x(M, seed=5))
    assert recorder.records == 0 and not layer._hot_cold.chosen


def test_on_by_default_and_setting_it_drops_the_recordings(recorder):
    default = hot_cold_test_layer(DispatchPolicy(table=((1, 1.0),), force=True, eager_min_tokens=FLOOR))
    assert default.eager_graphs == cg.DEFAULT_COUNTS == 4 and "eager_graphs" not in repr(default)
    layer = _layer(eager_graphs=0)
    with torch.no_grad():
        for _ in range(4):
            layer(_x(M, seed=0))
    assert recorder.records == 0 and layer.eager_graphs == 0 and "eager_graphs=0" in repr(layer)
    layer.eager_graphs = 3
    assert "eager_graphs=3" in repr(layer)
    with torch.no_grad():
        for _ in range(2):
            layer(_x(M, seed=0))
    assert recorder.records == 1 and layer._graphs.calls
    syncs = recorder.syncs
    layer.eager_graphs = 0
    assert not layer._graphs.calls and recorder.syncs == syncs + 1  # dropped after the queued work


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2", None])
def test_bad_eager_graphs_is_refused(bad):
    with pytest.raises(ValueError, match="eager_graphs must be an int >= 0"):
        _layer(eager_graphs=bad)
    layer = _layer()
    with pytest.raises(ValueError, match="eager_graphs must be an int >= 0"):
        layer.eager_graphs = bad
    assert layer.eager_graphs == 2


def test_graph_eager_calls_sets_every_layer_and_refuses_bad_input():
    model = torch.nn.Sequential(_layer(eager_graphs=0), torch.nn.Linear(4, 4), _layer(eager_graphs=0))
    assert graph_eager_calls(model, 3) == 2
    assert [m.eager_graphs for m in model if isinstance(m, SparseGatedMLP)] == [3, 3]
    assert graph_eager_calls(model[0]) == 1 and model[0].eager_graphs == 4
    with pytest.raises(TypeError, match="nn.Module"):
        graph_eager_calls("model")
    with pytest.raises(ValueError, match="holds no SparseGatedMLP"):
        graph_eager_calls(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="eager_graphs must be an int >= 0"):
        graph_eager_calls(model, -2)
    assert [m.eager_graphs for m in model if isinstance(m, SparseGatedMLP)] == [4, 3]  # refused before any change


def test_conversion_passes_eager_graphs():
    from twell.models import apply
    from twell.nn import DenseReluGatedMLP

    model = torch.nn.Sequential(torch.nn.Identity(), DenseReluGatedMLP(D, F))
    apply(model, eager_graphs=5)
    assert isinstance(model[1], SparseGatedMLP) and model[1].eager_graphs == 5
    model = torch.nn.Sequential(torch.nn.Identity(), DenseReluGatedMLP(D, F))
    apply(model)
    assert model[1].eager_graphs == cg.DEFAULT_COUNTS


@pytest.mark.parametrize("arch", ["builtin", "hf"])
def test_models_built_for_training_record_nothing(arch):
    """Their weights change between evaluations: recordings would be re-made on each and held through training."""
    from twell.train.model import PRESETS, build_model

    model = build_model(PRESETS["tiny"], arch=arch)
    layers = [m for m in model.modules() if isinstance(m, SparseGatedMLP)]
    assert layers and {m.eager_graphs for m in layers} == {0}
    assert graph_eager_calls(model) == len(layers) and {m.eager_graphs for m in layers} == {cg.DEFAULT_COUNTS}


def test_pickle_and_deepcopy_keep_the_limit_not_the_recordings(recorder):
    layer = _layer(eager_graphs=3)
    with torch.no_grad():
        for _ in range(3):
            layer(_x(M, seed=0))
    assert layer._graphs.calls
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert twin.eager_graphs == 3 and not twin._graphs.calls and not twin._graphs.seen
    assert layer._graphs.calls


def test_a_launch_that_fails_while_recording_raises_and_records_nothing(recorder, monkeypatch):
    layer = _layer()

    def failing(launch, device):  # noqa: ANN001, ANN202
        raise RuntimeError("capture failed")

    monkeypatch.setattr(recorder, "record", failing)
    with torch.no_grad():
        layer(_x(M, seed=0))
        with pytest.raises(RuntimeError, match="capture failed"):
            layer(_x(M, seed=0))
    assert not layer._graphs.calls


def test_layer_graphs_bookkeeping(recorder):
    graphs = cg.LayerGraphs(limit=1)
    cpu = torch.device("cpu")
    assert graphs.first_call(8) and not graphs.first_call(8)
    call = cg.GraphedCall(0, lambda: None, torch.zeros(1), torch.zeros(1), ())
    assert graphs.get(8, "state", 0) is None and graphs.has_room(8)
    graphs.put(8, call, cpu)
    assert graphs.get(8, "state", 0) is call and graphs.get(8, "state", 1) is None
    assert graphs.has_room(8) and not graphs.has_room(9)
    with pytest.raises(RuntimeError, match="no room"):
        graphs.put(9, call, cpu)
    graphs.put(8, call, cpu)  # replaces: after the queued work
    assert recorder.syncs == 1
    graphs.clock += cg.STALE_CALLS  # 8 unused that long: 9 may take its place, after the queued work
    assert graphs.has_room(9)
    graphs.put(9, call, cpu)
    assert list(graphs.calls) == [9] and recorder.syncs == 2
    assert not graphs.has_room(8)  # 9 just recorded: not stale
    assert graphs.get(9, "other state", 0) is None and not graphs.calls and recorder.syncs == 3
    for m in range(cg.MAX_SEEN_COUNTS + 5):
        graphs.first_call(1000 + m)
    assert len(graphs.seen) == cg.MAX_SEEN_COUNTS


def test_static_buffers_are_shared_while_held_and_writable_in_inference_mode():
    with torch.inference_mode():
        a = cg.static_buffer("x", (4, 8), torch.float32, torch.device("cpu"), 0)
        assert cg.static_buffer("x", (4, 8), torch.float32, torch.device("cpu"), 0) is a
        assert cg.static_buffer("out", (4, 8), torch.float32, torch.device("cpu"), 0) is not a
        assert not a.is_inference()
    a.copy_(torch.ones(4, 8))  # outside inference mode too
    key = ("x", (4, 8), torch.float32, "cpu", 0)
    assert cg._STATIC.get(key) is a
    del a  # no recording holds it: gone from the shared buffers
    assert cg._STATIC.get(key) is None
    b = cg.static_buffer("x", (4, 8), torch.float32, torch.device("cpu"), 0)
    assert b.shape == (4, 8) and cg._STATIC.get(key) is b


# ------------------------------------------------------------------ GPU: real CUDA graphs


def _gpu_layer(seed: int, n_inputs: int, m: int = 4096) -> tuple[SparseGatedMLP, list[torch.Tensor]]:
    """A default-policy bf16 layer of d=2048, F=5632 (synthetic weights, l0 28), recording 2 counts, and ``n_inputs``
    batches of ``m`` tokens: below the default's eager floor at this shape (8937 tokens), sparse by the tables."""
    from twell.nn import DEFAULT_POLICY
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    d, f = 2048, 5632
    assert DEFAULT_POLICY.eager_floor_tokens((d, f)) > m
    gen = torch.Generator(device="cuda").manual_seed(seed)
    p = synthetic_ffn_problem(n_inputs * m, d, f, SparsityProfile(mean_l0=28.0), generator=gen, device="cuda")
    layer = SparseGatedMLP.from_weights(p["w_gate"], p["w_up"], p["w_down"], eager_graphs=2).eval()
    return layer, [p["x"][i * m:(i + 1) * m].clone() for i in range(n_inputs)]


@pytest.mark.gpu
def test_gpu_recorded_calls_give_the_splits_bits_on_new_inputs():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    layer, xs = _gpu_layer(seed=21, n_inputs=4)
    res = torch.randn_like(xs[0])
    with torch.no_grad():
        layer(xs[0])  # no l0 estimate yet (density 1: dense by the tables): measures l0
        layer(xs[0])  # the count's first call on the tables' sparse path: dense, as without recordings
        layer(xs[1])  # the split eagerly, then recorded
        assert list(layer._graphs.calls) == [4096]
        call = layer._graphs.calls[4096]
        call.out.fill_(float("nan"))  # poisoned: a replay must write every element
        outs = [layer(x) for x in xs]
        with_res = layer(xs[2], residual=res)
        torch.cuda.synchronize()
        for x, out in zip(xs, outs, strict=True):
            assert torch.equal(out, _split(layer, x))
            assert rel_error(out, _want(layer, x)) <= REL_TOL[torch.bfloat16]
        assert torch.equal(with_res, _split(layer, xs[2], residual=res))
    assert len(layer._graphs.calls) == 1


@pytest.mark.gpu
def test_gpu_recordings_follow_weight_updates_and_streams():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    layer, (x, x2) = _gpu_layer(seed=22, n_inputs=2)
    with torch.no_grad():
        for _ in range(4):  # l0 (dense), the count's first (dense), recorded, replayed
            layer(x)
        first = layer._graphs.calls[4096]
        layer.up_proj.weight.mul_(-1.0)
        layer(x2)  # recorded again for the new weights
        assert layer._graphs.calls[4096] is not first
        out = layer(x2)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(x2)  # another stream: recorded there
            on_side = layer(x2)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        assert torch.equal(out, _split(layer, x2)) and torch.equal(on_side, out)
        assert rel_error(out, _want(layer, x2)) <= REL_TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_layers_of_one_shape_share_buffers_and_pool():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    first, xs = _gpu_layer(seed=23, n_inputs=2)
    second, _ = _gpu_layer(seed=24, n_inputs=1)
    with torch.no_grad():
        for _ in range(3):  # l0 (dense), the count's first (dense), recorded
            for layer in (first, second):
                layer(xs[0])
        a, b = first._graphs.calls[4096], second._graphs.calls[4096]
        assert a.x is b.x and a.out is b.out
        got = [first(xs[1]), second(xs[1])]  # one shared input and output, read back between the replays
        torch.cuda.synchronize()
    assert torch.equal(got[0], _split(first, xs[1])) and torch.equal(got[1], _split(second, xs[1]))
