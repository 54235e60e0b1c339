"""A hot set per size class of a layer's calls (``twell.nn.hot_cold_cache``: ``HotColdCache(max_sets=...)``,
``MAX_HOT_SETS``): a set chosen on a call of one class is not used by calls of another."""

from __future__ import annotations

import pytest
import torch
from _helpers import hot_cold_test_layer, hot_cold_test_tokens
from test_nn_call_graphs import ReplayingRecorder

from twell.nn import DispatchPolicy, SparseGatedMLP, hot_cold_cache
from twell.nn import call_graphs as cg
from twell.nn.hot_cold_cache import HotColdCache
from twell.ops import hot_cold_plan
from twell.reference.inference import dense_gated_ffn
from twell.tolerances import REL_TOL, rel_error

SMALL, LARGE = 40, 56  # token counts of the two classes below (under / from 48 tokens)


@pytest.fixture
def two_classes(monkeypatch) -> None:  # noqa: ANN001
    """The default bound rule's small class under 48 tokens, with a bound tight enough to make ~every unit that fires
    hot (the test layer's rare units leave ~1-2 cold pairs a token), and no bound from there (the threshold's 64)."""
    monkeypatch.setattr(hot_cold_plan, "HOT_SMALL_TOKENS", 48)
    monkeypatch.setattr(hot_cold_plan, "HOT_MAX_COLD_L0_SMALL", 0.05)
    monkeypatch.setattr(hot_cold_plan, "HOT_MAX_COLD_L0", 1000.0)
    monkeypatch.setattr(hot_cold_plan, "HOT_DENSE_DENSITY", 1.0)


def _layer(**kw) -> SparseGatedMLP:
    """The split's 32 x 256 test layer, sparse at every count, no l0 refresh during a test."""
    kw.setdefault("l0_refresh_every", 1000)
    return hot_cold_test_layer(DispatchPolicy(table=((1, 1.0),), force=True), **kw)


def _count_refreshes(layer: SparseGatedMLP) -> list[int]:
    """The token counts of the layer's cache refreshes from now on."""
    seen: list[int] = []
    original = layer._hot_cold.refresh
    layer._hot_cold.refresh = lambda x, *a, **k: (seen.append(x.shape[0]), original(x, *a, **k))[1]
    return seen


def _check_exact(layer: SparseGatedMLP, x: torch.Tensor, out: torch.Tensor) -> None:
    want = dense_gated_ffn(x, layer.gate_proj.weight, layer.up_proj.weight, layer.down_proj.weight)
    assert rel_error(out, want) <= REL_TOL[torch.float32]


def test_each_class_chooses_its_set_once_and_calls_use_their_own(two_classes):
    layer = _layer()
    layer._hot_cold = HotColdCache(min_frequency=0.5)  # the large class: the 64 frequent units alone
    refreshes = _count_refreshes(layer)
    with torch.no_grad():
        for i, m in enumerate((SMALL, LARGE, SMALL, LARGE, LARGE, SMALL)):
            x = hot_cold_test_tokens(m, seed=i)
            _check_exact(layer, x, layer(x))
            assert layer._hot_cold.n_hot == layer._hot_cold.set_for(m).n_hot  # the call's class is the active one
    assert refreshes == [SMALL, LARGE]  # the first call of each class, none after
    cache = layer._hot_cold
    small, large = cache.set_for(SMALL), cache.set_for(LARGE)
    assert small is not large and len(cache.classes) == 2
    assert large.n_hot == 64 and small.n_hot > large.n_hot  # the tight bound makes more units hot
    assert set(large.hot.tolist()) <= set(small.hot.tolist())


def test_one_set_serves_every_class_until_a_refresh(two_classes):
    """``max_sets=1`` (the behaviour until session 59): the set chosen on the first call serves the other class."""
    layer = _layer()
    layer._hot_cold = HotColdCache(max_sets=1)
    refreshes = _count_refreshes(layer)
    with torch.no_grad():
        for i, m in enumerate((SMALL, LARGE, SMALL)):
            x = hot_cold_test_tokens(m, seed=i)
            _check_exact(layer, x, layer(x))
    assert refreshes == [SMALL]
    cache = layer._hot_cold
    assert cache.set_for(LARGE) is cache.set_for(SMALL) and len(cache.classes) == 1


def test_refresh_calls_rechoose_their_own_class_only(two_classes):
    layer = _layer(l0_refresh_every=4)  # calls 0 and 4 refresh
    refreshes = _count_refreshes(layer)
    with torch.no_grad():
        for i, m in enumerate((SMALL, LARGE, LARGE, LARGE, LARGE, SMALL)):
            x = hot_cold_test_tokens(m, seed=i)
            _check_exact(layer, x, layer(x))
    assert refreshes == [SMALL, LARGE, LARGE]  # call 0, the large class's first call, the refresh call 4
    assert len(layer._hot_cold.classes) == 2


def test_the_class_used_longest_ago_gives_its_place():
    """Three classes (a bound rule of the call size), two places: the third class's refresh drops the first's set,
    which its next call chooses again; ``set_for`` looks without moving the active set."""
    wg, wu, wd = (torch.randn(64, 8, generator=torch.Generator().manual_seed(s)) for s in (0, 1, 2))
    wd = wd.T.contiguous()
    bounds = {8: 1.0, 16: 2.0, 24: 3.0}
    cache = HotColdCache(min_frequency=0.5, max_cold_l0=lambda n, density: bounds[n], max_sets=2)
    x = torch.randn(24, 8, generator=torch.Generator().manual_seed(3))
    assert not cache.select(8) and cache.set_for(8) is None and cache.classes == []  # nothing chosen yet
    for n in (8, 16):
        cache.refresh(x[:n], wg, wu, wd)
    assert cache.classes == [1.0, 2.0]
    first = cache.set_for(8)
    assert cache.select(8) and cache._hot is first.hot and cache.classes == [2.0, 1.0]
    assert cache.set_for(16) is not first and cache._hot is first.hot  # looked up, not made active
    cache.refresh(x, wg, wu, wd)  # 24 tokens: a third class; 2.0, used longest ago, gives its place
    assert cache.classes == [1.0, 3.0]
    assert cache.set_for(16, fallback=False) is None
    assert cache.set_for(16) is cache.set_for(24)  # the active set where the class has none
    assert not cache.select(16) and not cache.chosen  # an empty set, active until the caller's refresh fills it
    cache.refresh(x[:16], wg, wu, wd)
    assert cache.classes == [3.0, 2.0] and cache.chosen
    cache.clear()
    assert cache.classes == [] and cache.set_for(24) is None and cache.density is None


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_max_sets_is_refused(bad):
    with pytest.raises(ValueError, match="max_sets must be an int >= 1"):
        HotColdCache(max_sets=bad)


def test_the_shipped_number_of_sets_is_read_when_a_cache_is_made(monkeypatch):
    assert HotColdCache().max_sets == hot_cold_cache.MAX_HOT_SETS == 3
    monkeypatch.setattr(hot_cold_cache, "MAX_HOT_SETS", 1)
    assert HotColdCache().max_sets == 1


def test_recordings_of_two_classes_keep_their_own_plans(two_classes, monkeypatch):
    """Counts of two classes alternate: each records once with its class's plan and replays after (a recording's
    plan is part of its count's key, not of the layer's state, so the other class's plan does not drop it)."""
    rec = ReplayingRecorder()
    monkeypatch.setattr(cg, "RECORDER", rec)
    monkeypatch.setattr(cg, "RECORD_MIN_FLOPS", 0)
    layer = hot_cold_test_layer(DispatchPolicy(table=((1, 1.0),), force=True, eager_min_tokens=64),
                                eager_graphs=2, l0_refresh_every=1000)
    with torch.no_grad():
        for i in range(8):
            m = (SMALL, LARGE)[i % 2]
            x = hot_cold_test_tokens(m, seed=i)
            _check_exact(layer, x, layer(x))
    assert rec.records == 2 and rec.replays == 4  # calls 1-2 of each count: eager then recorded; 3-4 replayed
    plans = {m: layer._graphs.calls[m].keep[0] for m in (SMALL, LARGE)}
    assert plans[SMALL] is layer._hot_cold.set_for(SMALL).plan and plans[LARGE] is layer._hot_cold.set_for(LARGE).plan
    assert plans[SMALL].n_hot > plans[LARGE].n_hot


def test_snapshot_and_restore_keep_every_set_apart_from_later_refreshes():
    wg, wu, wd = (torch.randn(64, 8, generator=torch.Generator().manual_seed(s)) for s in (0, 1, 2))
    wd = wd.T.contiguous()
    cache = HotColdCache(min_frequency=0.5, max_cold_l0=lambda n, density: float(n))
    x = torch.randn(24, 8, generator=torch.Generator().manual_seed(3))
    cache.refresh(x[:8], wg, wu, wd)
    cache.refresh(x[:16], wg, wu, wd)
    kept = cache.snapshot()
    hot16 = cache._hot
    cache.clear()
    cache.refresh(x, wg, wu, wd)
    assert cache.classes == [24.0]
    cache.restore(kept)
    assert cache.classes == [8.0, 16.0] and cache._hot is hot16 and cache.density == kept[3]
    cache.set_for(16).overflow_fraction = 0.5  # the restored sets are copies: the snapshot stays as taken
    assert kept[1].overflow_fraction != 0.5


def test_copies_and_pickles_keep_the_sets_and_the_empty_class(two_classes):
    import copy
    import pickle

    fresh = _layer()
    for clone in (copy.deepcopy(fresh), pickle.loads(pickle.dumps(fresh))):
        assert clone._hot_cold._class is hot_cold_cache._NO_CLASS and not clone._hot_cold.select(SMALL)
    layer = _layer()
    with torch.no_grad():
        for i, m in enumerate((SMALL, LARGE)):
            layer(hot_cold_test_tokens(m, seed=i))
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        cache = clone._hot_cold
        assert cache.classes == layer._hot_cold.classes
        assert [s.n_hot for s in cache.sets()] == [s.n_hot for s in layer._hot_cold.sets()]
        refreshes = _count_refreshes(clone)
        with torch.no_grad():
            for i, m in enumerate((SMALL, LARGE)):
                x = hot_cold_test_tokens(m, seed=10 + i)
                _check_exact(clone, x, clone(x))
        assert refreshes == []  # both classes' sets came along


def test_prepare_static_weights_builds_every_class_plan(two_classes):
    layer = _layer()
    with torch.no_grad():
        for i, m in enumerate((SMALL, LARGE)):
            layer(hot_cold_test_tokens(m, seed=i))
        old = [s.plan for s in layer._hot_cold.sets()]
        layer.up_proj.weight.mul_(2.0)  # both plans' copies are stale now
        assert layer.prepare_static_weights()
    new = [s.plan for s in layer._hot_cold.sets()]
    assert len(new) == 2 and all(n is not None and n is not o for n, o in zip(new, old, strict=True))
    for plan in new:
        assert torch.equal(plan.w_gemm[-plan.n_hot:], layer.up_proj.weight[plan.hot])
