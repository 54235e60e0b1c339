"""nn.HotColdCache: hot units re-chosen on refresh, plan rebuilt when the weights change."""

from __future__ import annotations

import pytest
import torch

from twell.nn.hot_cold_cache import HotColdCache
from twell.ops.hot_cold_plan import HOT_MAX_COLD_L0, choose_hot_units, default_max_cold_l0, unit_frequency


def _weights(f: int = 64, d: int = 8):
    gen = torch.Generator().manual_seed(0)
    wg = torch.randn(f, d, generator=gen)
    wg[:, 0] = -3.0  # rare units ...
    wg[:4, 0] = 3.0  # ... except units 0-3, which fire on nearly every token
    return wg, torch.randn(f, d, generator=gen), torch.randn(d, f, generator=gen)


def _tokens(m: int = 512, d: int = 8):
    x = torch.randn(m, d, generator=torch.Generator().manual_seed(1))
    x[:, 0] = 1.0
    return x


def test_refresh_chooses_frequent_units_and_plan_follows_weight_updates():
    wg, wu, wd = _weights()
    cache = HotColdCache(min_frequency=0.5, max_cold_l0=None)  # the threshold alone (the bound: below)
    assert cache.plan(wg, wu, wd) is None  # nothing chosen yet
    cache.refresh(_tokens(), wg, wu, wd)
    # 4 frequent units, rounded down to a multiple of 64 -> none: no plan
    assert cache.plan(wg, wu, wd) is None
    wg2 = torch.cat([wg, wg[:60]])  # 124 units, all made frequent: 124 rounds down to 64 hot
    wg2[:, 0] = 3.0
    wu2, wd2 = torch.cat([wu, wu[:60]]), torch.cat([wd, wd[:, :60]], 1)
    cache.refresh(_tokens(), wg2, wu2, wd2)
    plan = cache.plan(wg2, wu2, wd2)
    assert plan is not None and plan.n_hot == 64 * (124 // 64)
    assert cache.plan(wg2, wu2, wd2) is plan  # cached while the weights are unchanged
    with torch.no_grad():
        wu2.mul_(2.0)  # in-place update (an optimizer step) bumps the version counter
    rebuilt = cache.plan(wg2, wu2, wd2)
    assert rebuilt is not plan
    assert torch.equal(rebuilt.w_gemm[-plan.n_hot:], wu2[rebuilt.hot])
    cache.clear()
    assert cache.plan(wg2, wu2, wd2) is None


def test_bad_min_frequency_and_bound():
    with pytest.raises(ValueError, match="min_frequency"):
        HotColdCache(min_frequency=0.0)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="max_cold_l0"):
            HotColdCache(max_cold_l0=bad)


def test_refresh_bounds_the_cold_pairs_per_token():
    """The default cache makes more units hot where its threshold alone would leave more than ``max_cold_l0``
    expected cold pairs per token, as ``choose_hot_units`` does with the same arguments."""
    wg, wu, wd = _weights()
    x = _tokens()
    freq = unit_frequency(x, wg)
    assert freq.sum() > 3.0  # the rare units fire on other channels: their pairs add up
    bounded = HotColdCache(min_frequency=0.5, max_cold_l0=3.0)
    bounded.refresh(x, wg, wu, wd)
    plan = bounded.plan(wg, wu, wd)
    want = choose_hot_units(freq, min_frequency=0.5, max_cold_l0=3.0)
    assert want.numel() > 0 and plan is not None and torch.equal(plan.hot, want)
    assert float(freq.sum() - freq[plan.hot].sum()) <= 3.0
    assert HotColdCache().max_cold_l0 is default_max_cold_l0


def test_the_default_bound_follows_the_call_size(monkeypatch):
    """The default cache bounds the cold pairs by ``HOT_MAX_COLD_L0_SMALL`` below ``HOT_SMALL_TOKENS`` tokens, by
    ``HOT_MAX_COLD_L0`` from there to ``HOT_LARGE_TOKENS`` and by ``HOT_MAX_COLD_L0_LARGE`` from there on, read at
    refresh time; a fixed bound applies at every size."""
    from twell.ops import hot_cold_plan

    small_tokens, large_tokens = hot_cold_plan.HOT_SMALL_TOKENS, hot_cold_plan.HOT_LARGE_TOKENS
    assert default_max_cold_l0(1) == default_max_cold_l0(small_tokens - 1) == hot_cold_plan.HOT_MAX_COLD_L0_SMALL
    assert default_max_cold_l0(small_tokens) == default_max_cold_l0(large_tokens - 1) == HOT_MAX_COLD_L0
    assert default_max_cold_l0(large_tokens) == hot_cold_plan.HOT_MAX_COLD_L0_LARGE
    assert hot_cold_plan.HOT_MAX_COLD_L0_SMALL < HOT_MAX_COLD_L0 < hot_cold_plan.HOT_MAX_COLD_L0_LARGE
    # the middle tier on a denser layer (the density known from the refresh sample): a tighter bound
    dense = hot_cold_plan.HOT_DENSE_DENSITY
    assert default_max_cold_l0(small_tokens, dense) == default_max_cold_l0(large_tokens - 1, 8 * dense) \
        == hot_cold_plan.HOT_MAX_COLD_L0_DENSE
    assert default_max_cold_l0(small_tokens, 0.99 * dense) == HOT_MAX_COLD_L0
    assert default_max_cold_l0(small_tokens - 1, dense) == hot_cold_plan.HOT_MAX_COLD_L0_SMALL
    assert default_max_cold_l0(large_tokens, dense) == hot_cold_plan.HOT_MAX_COLD_L0_LARGE
    assert hot_cold_plan.HOT_MAX_COLD_L0_SMALL < hot_cold_plan.HOT_MAX_COLD_L0_DENSE < HOT_MAX_COLD_L0
    # a density, not an l0: 0.5 % of 4096 x 14336's F is l0 72, which session 29's l0 split (70) put in the dense
    # rule (1.57x against 1.69x with bound 10 at 16,384 tokens, session 30); 2048 x 5632 splits where it did (l0 70)
    assert default_max_cold_l0(16384, 71.7 / 14336) == HOT_MAX_COLD_L0
    assert default_max_cold_l0(16384, 56.0 / 5632) == HOT_MAX_COLD_L0
    assert default_max_cold_l0(16384, 84.0 / 5632) == hot_cold_plan.HOT_MAX_COLD_L0_DENSE
    monkeypatch.setattr(hot_cold_plan, "HOT_DENSE_DENSITY", float("inf"))  # the size tiers alone until the last step
    wg, wu, wd = _weights(f=256)
    x = _tokens()
    freq = unit_frequency(x, wg)
    # bounds that take 64 and 128 hot units here (the count is rounded up to a multiple of 64): a little above
    # the pairs left cold by the 64 most frequent units, and half-way between those and the 128 most frequent's
    ranked = freq.sort(descending=True).values.double()
    after_64, after_128 = float(ranked[64:].sum()), float(ranked[128:].sum())
    large, small = after_64 * 1.05, (after_64 + after_128) / 2
    assert after_128 < small < after_64 < large < float(ranked[4:].sum())
    # shrink the size switches to this sample so that both bounds are exercised on a small problem (the small
    # calls' bound is the middle one's below one token: never)
    monkeypatch.setattr(hot_cold_plan, "HOT_SMALL_TOKENS", 1)
    monkeypatch.setattr(hot_cold_plan, "HOT_LARGE_TOKENS", x.shape[0])
    monkeypatch.setattr(hot_cold_plan, "HOT_MAX_COLD_L0", small)
    monkeypatch.setattr(hot_cold_plan, "HOT_MAX_COLD_L0_LARGE", large)
    cache = HotColdCache(min_frequency=0.5)
    cache.refresh(x, wg, wu, wd)
    assert cache._hot.numel() == 64
    assert torch.equal(cache._hot, choose_hot_units(freq, min_frequency=0.5, max_cold_l0=large))
    cache = HotColdCache(min_frequency=0.5)
    cache.refresh(x[:-1], wg, wu, wd)  # one token fewer than HOT_LARGE_TOKENS: the smaller bound
    assert cache._hot.numel() == 128
    assert torch.equal(cache._hot, choose_hot_units(unit_frequency(x[:-1], wg), min_frequency=0.5,
                                                    max_cold_l0=small))
    fixed = HotColdCache(min_frequency=0.5, max_cold_l0=small)  # a fixed bound holds at every size
    fixed.refresh(x, wg, wu, wd)
    assert fixed._hot.numel() == 128
    # the small calls' bound: below HOT_SMALL_TOKENS the smaller bound again, from there the middle one
    monkeypatch.setattr(hot_cold_plan, "HOT_SMALL_TOKENS", x.shape[0])
    monkeypatch.setattr(hot_cold_plan, "HOT_LARGE_TOKENS", 10**9)
    monkeypatch.setattr(hot_cold_plan, "HOT_MAX_COLD_L0_SMALL", small)
    monkeypatch.setattr(hot_cold_plan, "HOT_MAX_COLD_L0", large)
    cache = HotColdCache(min_frequency=0.5)
    cache.refresh(x[:-1], wg, wu, wd)
    assert cache._hot.numel() == 128
    cache = HotColdCache(min_frequency=0.5)
    cache.refresh(x, wg, wu, wd)
    assert cache._hot.numel() == 64
    # the middle tier's bound for dense layers, chosen by the sample's density
    density = float(freq.mean())
    monkeypatch.setattr(hot_cold_plan, "HOT_MAX_COLD_L0_DENSE", small)
    monkeypatch.setattr(hot_cold_plan, "HOT_DENSE_DENSITY", 0.99 * density)
    cache = HotColdCache(min_frequency=0.5)
    cache.refresh(x, wg, wu, wd)
    assert cache._hot.numel() == 128
    monkeypatch.setattr(hot_cold_plan, "HOT_DENSE_DENSITY", 1.01 * density)
    cache = HotColdCache(min_frequency=0.5)
    cache.refresh(x, wg, wu, wd)
    assert cache._hot.numel() == 64


def test_a_bound_rule_takes_tokens_and_density():
    """A callable ``max_cold_l0`` gets the refresh call's token count and its sample's density (l0 over F); one that
    cannot take both is refused when the cache is made, not at its first refresh."""
    with pytest.raises(TypeError, match="two positional arguments"):
        HotColdCache(max_cold_l0=lambda n_tokens: 3.0)
    seen = []
    wg, wu, wd = _weights()
    x = _tokens()
    cache = HotColdCache(min_frequency=0.5, max_cold_l0=lambda n, density: seen.append((n, density)) or 3.0)
    cache.refresh(x, wg, wu, wd)
    assert seen == [(x.shape[0], pytest.approx(float(unit_frequency(x, wg).sum()) / wg.shape[0]))]
    assert torch.equal(cache._hot, choose_hot_units(unit_frequency(x, wg), min_frequency=0.5, max_cold_l0=3.0))


def test_small_changes_of_the_hot_set_keep_the_plan():
    d, f = 8, 256
    gen = torch.Generator().manual_seed(3)
    wg, wu, wd = torch.randn(f, d, generator=gen), torch.randn(f, d, generator=gen), torch.randn(d, f, generator=gen)
    cache = HotColdCache(min_frequency=0.5, max_cold_l0=None)
    x = _tokens(256, d)
    wg[:, 0] = -3.0
    wg[:128, 0] = 3.0  # units 0-127 frequent
    cache.refresh(x, wg, wu, wd)
    plan = cache.plan(wg, wu, wd)
    assert plan is not None and plan.n_hot == 128
    wg[:4, 0] = -3.0  # 4 of 128 drop out, 4 others come in: 97 % overlap, same size
    wg[128:132, 0] = 3.0
    cache.refresh(x, wg, wu, wd)
    assert set(cache.plan(wg, wu, wd).hot.tolist()) == set(range(128))  # kept (rebuilt only for the new weights)
    wg[:64, 0] = -3.0  # half of them change: a new set
    wg[128:192, 0] = 3.0
    cache.refresh(x, wg, wu, wd)
    assert set(cache.plan(wg, wu, wd).hot.tolist()) == set(range(64, 192))
