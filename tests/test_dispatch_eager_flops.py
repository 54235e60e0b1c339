"""``DispatchPolicy.eager_min_flops``: the eager floor in dense FFN work, the default's value and its provenance.

The default policy sends eager calls whose dense FFN would take fewer than :data:`twell.nn.EAGER_MIN_FLOPS`
floating-point operations dense; the eager points measured so far are where that value comes from, and these tests
derive it from them again: ``twell tune-dispatch --eager`` at five layer shapes on an H100 (session 43,
``bench_results/h100/dispatch_eager_*_session43.json``) and at 2048 x 5632 on the H200 (session 44,
``bench_results/h200/dispatch_eager_*_session44.json``), and the 1.5B model's eager forward under the tables without a
floor on both machines (``scripts/eager_floor_probe.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from twell.bench import ffn as bench_ffn
from twell.bench.model_setup import POLICIES
from twell.bench.tune_dispatch import eager_outcomes
from twell.nn import DEFAULT_POLICY, EAGER_MIN_FLOPS, DispatchPolicy
from twell.nn.dispatch import HOPPER
from twell.nn.dispatch_summary import inference_summary
from twell.nn.dispatch_tuning import derive_eager_min_flops

RESULTS = Path(__file__).resolve().parents[1] / "bench_results"
RUNS = (sorted(RESULTS.glob("h100/dispatch_eager_*_session43.json"))
        + sorted(RESULTS.glob("h200/dispatch_eager_*_session44.json")))
#: The model probe's runs and the policy in each that is the default tables without a floor (session 43 ran before the
#: floor, so its "default" was the tables alone).
MODEL_RUNS = ((RESULTS / "h100" / "eager_floor_probe_calleagerfwd_session43.json", "default"),
              (RESULTS / "h200" / "eager_floor_probe_callverify_session44.json", "tables"))
MODEL_SHAPE = (2048, 5632)  # the 1.5B preset's layers
SPARSE_EVERYWHERE = {"table": ((0, 1.0),), "shapes": None}


def work(tokens: int, shape: tuple[int, int]) -> int:
    return 6 * tokens * shape[0] * shape[1]


# ---------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan, True, "1e11", None])
def test_a_bad_work_floor_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"eager_min_flops must be a finite number >= 0 \(0: no floor for eager "):
        DispatchPolicy(eager_min_flops=value)


def test_the_floor_in_tokens_is_the_work_over_the_shapes_work_per_token_rounded_up():
    policy = DispatchPolicy(**SPARSE_EVERYWHERE, eager_min_flops=float(work(100, (64, 128))))
    assert policy.eager_floor_tokens((64, 128)) == 100
    assert policy.eager_floor_tokens((64, 256)) == 50
    assert policy.eager_floor_tokens((32, 100)) == math.ceil(work(100, (64, 128)) / work(1, (32, 100)))
    assert policy.eager_floor_tokens(None) == 0  # no shape: the work floor cannot apply
    both = DispatchPolicy(**SPARSE_EVERYWHERE, eager_min_tokens=70, eager_min_flops=float(work(100, (64, 128))))
    assert both.eager_floor_tokens((64, 128)) == 100 and both.eager_floor_tokens((64, 512)) == 70
    assert both.eager_floor_tokens(None) == 70
    assert DispatchPolicy(eager_min_flops=7).eager_min_flops == 7.0  # an int is taken, stored as a float


def test_eager_calls_below_the_work_floor_run_dense_and_others_follow_the_table():
    shape = (64, 128)
    policy = DispatchPolicy(**SPARSE_EVERYWHERE, eager_min_flops=float(work(100, shape)))
    for n in (1, 99):
        assert not policy.use_sparse(n, 0.005, shape=shape, eager=True)
        assert policy.use_sparse(n, 0.005, shape=shape)  # not eager: the table's answer
    assert policy.use_sparse(100, 0.005, shape=shape, eager=True)
    assert policy.use_sparse(1, 0.005, eager=True)  # no shape given: the work floor does not apply
    small_batch = DispatchPolicy(**SPARSE_EVERYWHERE, decode_max_tokens=8, eager_min_flops=float(work(4, shape)))
    assert small_batch.use_decode(2, shape=shape) and not small_batch.use_decode(2, shape=shape, eager=True)
    assert small_batch.use_decode(4, shape=shape, eager=True)


def test_without_eager_floor_keeps_everything_else():
    lifted = DEFAULT_POLICY.without_eager_floor()
    assert lifted.eager_min_flops == 0.0 and lifted.eager_min_tokens == 0
    assert lifted.shape_tables == DEFAULT_POLICY.shape_tables and lifted.decode_tables == DEFAULT_POLICY.decode_tables
    assert lifted.capabilities == DEFAULT_POLICY.capabilities and lifted.other_shapes == DEFAULT_POLICY.other_shapes
    assert lifted.use_sparse(4096, 0.005, shape=(2048, 5632), capability=(9, 0), eager=True)
    assert not DEFAULT_POLICY.use_sparse(4096, 0.005, shape=(2048, 5632), capability=(9, 0), eager=True)


def test_the_summary_tells_the_work_floor_and_its_tokens():
    text = inference_summary(DEFAULT_POLICY, "cuda", (9, 0))
    assert text.endswith("; eager calls (also those compiled outside static_dispatch) whose dense FFN would take fewer "
                         "than 6.18e+11 FLOPs (eager_min_flops; in "
                         "tokens 2048x5632: 8937, 4096x14336: 1756, 1024x3072: 32768) run dense, but for those a "
                         "layer records in CUDA graphs (SparseGatedMLP eager_graphs, on by default: from 4096 tokens' "
                         "work at 2048x5632 below the floor, up to 12288 above it; twell.nn.call_graphs)")
    both = inference_summary(DispatchPolicy(eager_min_tokens=16, eager_min_flops=float(work(8192, (2048, 5632)))),
                             "cuda", (9, 0))
    assert ("; eager calls (also those compiled outside static_dispatch) of fewer than 16 tokens "
            "(eager_min_tokens) or whose dense FFN") in both


def test_the_benchmarks_time_the_tables_without_the_floor():
    """``twell bench ffn``'s dispatch column holds the GPU before each call, so it runs the tables alone; the model
    benchmark's ``tables`` policy is the default without the floor and its small-batch policies keep none (the floor
    would send every such call dense)."""
    source = Path(bench_ffn.__file__).read_text()
    assert "DEFAULT_POLICY.without_eager_floor() if cfg.dispatch_table is None" in source
    assert POLICIES["default"] is DEFAULT_POLICY and POLICIES["tables"] == DEFAULT_POLICY.without_eager_floor()
    for name in ("decode", "decode-1"):
        assert POLICIES[name].eager_min_flops == 0.0 and POLICIES[name].eager_min_tokens == 0


# ---------------------------------------------------------------------------------------- derivation
def test_derive_eager_min_flops_takes_the_next_measured_work_above_the_largest_loss():
    a, b = (64, 128), (128, 256)  # b's work per token is 4x a's
    outcomes = [(*a, 10, True), (*a, 40, False), (*b, 5, True), (*b, 20, False), (*b, 8, False)]
    # losses at work(10, a) and work(5, b) = work(20, a); measured above them: work(8, b) = work(32, a), work(40, a)
    # and work(20, b)
    assert derive_eager_min_flops(outcomes) == float(work(8, b))
    assert derive_eager_min_flops([(*a, 10, True)]) == float(work(10, a) + 1)  # nothing larger measured
    assert derive_eager_min_flops([(*a, 10, False)]) == 0.0


@pytest.mark.parametrize("bad", [(0, 128, 10, True), (64, 128, 0, True), (64, 1.5, 10, True), (True, 128, 10, False)])
def test_derive_eager_min_flops_refuses_bad_points(bad):
    with pytest.raises(ValueError, match="must be an int >= 1"):
        derive_eager_min_flops([bad])


def test_derive_eager_min_flops_refuses_a_lost_flag_that_is_not_a_bool():
    with pytest.raises(TypeError, match="lost must be a bool"):
        derive_eager_min_flops([(64, 128, 10, 1)])


# ---------------------------------------------------------------------------------------- provenance
def _run(path: Path) -> dict:
    return json.loads(path.read_text())


def _layer_outcomes() -> list[tuple[int, int, int, bool]]:
    """Every eagerly timed layer point of the runs: lost where the default tables send it sparse on a Hopper and its
    eager call ran slower than dense."""
    tables = DEFAULT_POLICY.without_eager_floor()
    out = []
    for path in RUNS:
        run = _run(path)
        d, f = run["meta"]["shape"]
        pinned = DispatchPolicy(table=tables.table_for((d, f)), shapes=None, device_types=("cuda",))
        out += [(d, f, m, lost) for m, lost in eager_outcomes(run["rows"], pinned, d=d, f=f, bar=1.0)]
    return out


def _model_outcomes() -> list[tuple[int, int, int, bool]]:
    """The model's eager forwards as points of its layer shape: one per token count at which the tables send a layer
    sparse, lost where the forward ran slower than dense."""
    out = []
    for path, policy in MODEL_RUNS:
        for r in _run(path)["rows"]:
            if r[f"sparse:{policy}_sparse_layers"] > 0:
                out.append((*MODEL_SHAPE, r["tokens"], r[f"sparse:{policy}_speedup"] < 1.0))
    return out


def _outcomes() -> list[tuple[int, int, int, bool]]:
    return _layer_outcomes() + _model_outcomes()


def test_the_runs_are_the_layer_tunes_and_model_probes_of_sessions_43_and_44():
    shapes = {}
    for path in RUNS:
        meta = _run(path)["meta"]
        assert tuple(int(v) for v in meta["capability"].split(".")) in HOPPER
        shapes.setdefault(meta["device"], set()).add(tuple(meta["shape"]))
    assert shapes == {"NVIDIA H100 80GB HBM3": {(1024, 3072), (2048, 5632), (4096, 14336), (5120, 13824), (896, 4864)},
                      "NVIDIA H200": {(2048, 5632)}}
    assert [_run(path)["device"] for path, _ in MODEL_RUNS] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert all(_run(path)["preset"] == "1.5b" for path, _ in MODEL_RUNS)


def test_the_default_work_floor_is_what_the_runs_give():
    assert derive_eager_min_flops(_outcomes()) == EAGER_MIN_FLOPS == DEFAULT_POLICY.eager_min_flops
    assert EAGER_MIN_FLOPS == work(32768, (1024, 3072))
    # the layer runs alone gave session 43's value, 8192 tokens at 2048 x 5632: the model's forward moved it
    assert derive_eager_min_flops(_layer_outcomes()) == work(8192, MODEL_SHAPE)
    assert DEFAULT_POLICY.eager_floor_tokens(MODEL_SHAPE) == 8937


def test_above_the_floor_every_point_won_eagerly_and_each_shape_lost_below_it():
    outcomes = _outcomes()
    assert not [o for o in outcomes if work(o[2], o[:2]) >= EAGER_MIN_FLOPS and o[3]]
    for shape in {o[:2] for o in outcomes}:
        assert any(lost for d, f, m, lost in outcomes if (d, f) == shape and work(m, shape) < EAGER_MIN_FLOPS)
    largest_loss = max(work(m, (d, f)) for d, f, m, lost in outcomes if lost)
    assert largest_loss == work(8192, MODEL_SHAPE)
    assert (*MODEL_SHAPE, 8192, True) in _model_outcomes() and (*MODEL_SHAPE, 8192, True) not in _layer_outcomes()


def test_the_readme_figures_are_the_runs():
    """The "Host time" bullet's figures, rebuilt from the runs: the eager sparse call's time and the eager speedups
    below the default's floor (with the points that won there) and from it."""
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    below, above, below_ms = [], [], []
    for path in RUNS:
        run = _run(path)
        shape = tuple(run["meta"]["shape"])
        floor = DEFAULT_POLICY.eager_floor_tokens(shape)
        for r in run["rows"]:
            point = (r["eager_speedup"], shape, r["m"], r["density"])
            (below if r["m"] < floor else above).append(point)
            if r["m"] < floor:
                below_ms.append(r["eager_sparse_ms"])
    lost = [p[0] for p in below if p[0] < 1.0]
    won = sorted(p for p in below if p[0] >= 1.0)
    assert [(round(s, 2), shape, m) for s, shape, m, _ in won if shape != MODEL_SHAPE] == [
        (1.08, (4096, 14336), 1024), (1.19, (896, 4864), 16384), (1.26, (896, 4864), 16384)]
    at_8192 = [s for s, shape, m, _ in won if shape == MODEL_SHAPE]
    assert len(at_8192) == 6 and {m for _, shape, m, _ in won if shape == MODEL_SHAPE} == {8192}
    assert f"took {min(below_ms):.3f}-{max(below_ms):.3f} ms whatever its size" in readme
    assert f"ran {min(lost):.2f}-{max(lost):.2f}x of dense (nine points won: 1.08x at 4096x14336 / 1024" in readme
    assert "1.19x and 1.26x at 896x4864 / 16,384 tokens" in readme
    assert f"{min(at_8192):.2f}-{max(at_8192):.2f}x at 2048x5632 / 8192 tokens on both machines" in readme
    assert f"from it, {min(p[0] for p in above):.2f}-{max(p[0] for p in above):.2f}x at every point" in readme
