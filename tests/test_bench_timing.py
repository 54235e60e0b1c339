"""``time_ms_interleaved``: the callables alternate call by call, so a disturbed stretch lands on all of them.

Driven by a fake host clock (each callable advances it by its own cost), so nothing here depends on the
speed of the machine running the tests."""

from __future__ import annotations

import pytest
import torch

from twell.bench import timing

CPU = torch.device("cpu")


class FakeClock:
    def __init__(self) -> None:
        self.ms = 0.0

    def __call__(self) -> float:
        return self.ms / 1e3


def _costed(clock: FakeClock, calls: list[str], name: str, cost_ms: float, disturbed: range):
    """A callable costing ``cost_ms`` on the fake clock, 5 ms more while its global call index is in
    ``disturbed`` (a slow stretch of the machine, whoever runs then)."""
    def fn() -> None:
        clock.ms += cost_ms + (5.0 if len(calls) in disturbed else 0.0)
        calls.append(name)
    return fn


def test_alternates_call_by_call_and_a_disturbance_hits_every_callable(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timing, "_now", clock)
    # warm-up: 3 calls each (first + 2, warmup_ms=0) -> the timed loop starts at global call 9
    disturbed = range(9 + 30, 9 + 60)  # 10 cycles of 3 calls, in the middle of the timed loop
    fns = {name: _costed(clock, calls, name, cost, disturbed) for name, cost in (("a", 2.0), ("b", 1.0), ("c", 1.0))}
    groups: dict[str, list[float]] = {}
    ms = timing.time_ms_interleaved(fns, device=CPU, warmup_ms=0.0, rep_ms=100.0, rounds=5, samples_out=groups)
    timed = calls[9:]
    cycles = len(timed) // 3
    assert cycles == 50 and len(timed) == 150  # rep_ms / slowest estimate (2 ms)
    for c in range(3):  # A B C, B C A, C A B, A B C ...
        assert timed[3 * c:3 * c + 3] == [["a", "b", "c"][(c + k) % 3] for k in range(3)]
    assert all(timed.count(name) == cycles for name in fns)
    # the disturbance (20 % of the loop) is on every callable alike: the medians are the undisturbed costs
    assert ms == pytest.approx({"a": 2.0, "b": 1.0, "c": 1.0})
    assert {name: len(g) for name, g in groups.items()} == {"a": 5, "b": 5, "c": 5}
    assert groups["a"][0] == pytest.approx(2.0) and max(groups["a"]) == pytest.approx(7.0)  # the disturbed group shows


def test_fewer_cycles_than_rounds_are_not_possible_and_bad_rounds_are_refused(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timing, "_now", clock)
    fns = {name: _costed(clock, calls, name, cost, range(0)) for name, cost in (("slow", 1000.0), ("fast", 1.0))}
    groups: dict[str, list[float]] = {}
    ms = timing.time_ms_interleaved(fns, device=CPU, warmup_ms=0.0, rep_ms=10.0, rounds=4, samples_out=groups)
    assert calls[6:].count("slow") == 4  # at least `rounds` cycles even when rep_ms is shorter than one call
    assert ms == pytest.approx({"slow": 1000.0, "fast": 1.0}) and len(groups["fast"]) == 4
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        timing.time_ms_interleaved(fns, device=CPU, rounds=0)
    assert timing.time_ms_interleaved({}, device=CPU) == {}


def test_cycles_are_capped(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timing, "_now", clock)
    monkeypatch.setattr(timing, "MAX_CYCLES", 7)
    ms = timing.time_ms_interleaved({"x": _costed(clock, calls, "x", 0.5, range(0))}, device=CPU,
                                    warmup_ms=0.0, rep_ms=1000.0, rounds=3)
    assert calls[3:].count("x") == 7 and ms == pytest.approx({"x": 0.5})


def test_group_medians_cover_every_sample_in_order():
    assert timing._group_medians([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], 3) == [1.5, 4.0, 6.5]
    assert timing._group_medians([4.0], 1) == [4.0]


def test_hold_is_checked_and_has_no_effect_off_cuda(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timing, "_now", clock)
    fns = {"x": _costed(clock, calls, "x", 0.5, range(0))}
    with pytest.raises(ValueError, match="hold_ms must be >= 0"):
        timing.time_ms_interleaved(fns, device=CPU, hold_ms=-1.0)
    assert timing.time_ms_interleaved(fns, device=CPU, warmup_ms=0.0, rep_ms=5.0, hold_ms=3.0) == pytest.approx(
        {"x": 0.5})


@pytest.mark.gpu
def test_gpu_hold_keeps_host_time_out_of_the_intervals():
    """A callable that spends 1 ms on the host before launching a tiny kernel: without the hold its interval
    holds that millisecond (the device waits at its start event), with the default hold it does not."""
    import time as host_time

    dev = torch.device("cuda")
    x = torch.zeros(1024, device=dev)

    def host_heavy() -> None:
        host_time.sleep(1e-3)
        x.add_(1.0)

    fns = {"host_heavy": host_heavy, "light": lambda: x.mul_(1.0)}
    unheld = timing.time_ms_interleaved(fns, device=dev, rep_ms=20.0, hold_ms=0.0)
    held = timing.time_ms_interleaved(fns, device=dev, rep_ms=20.0)
    assert unheld["host_heavy"] >= 0.5
    assert held["host_heavy"] < 0.5 and held["light"] < 0.5


def test_eager_timing_issues_calls_back_to_back_in_rotated_rounds(monkeypatch):
    """``eager_ms_interleaved``: each round issues one callable's calls back to back (as many as fill
    ``rep_ms / rounds`` at its warm-up cost), the callables' order rotated each round; the medians are per call."""
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timing, "_now", clock)
    fns = {name: _costed(clock, calls, name, cost, range(0)) for name, cost in (("dense", 1.0), ("sparse", 4.0))}
    ms = timing.eager_ms_interleaved(fns, device=CPU, rep_ms=40.0, rounds=2, warmup_ms=0.0)
    assert ms == pytest.approx({"dense": 1.0, "sparse": 4.0})
    timed = calls[6:]  # warm-up: 3 calls each
    # round 0: dense then sparse; round 1: sparse then dense; 20 ms a round each: 20 dense calls, 5 sparse calls
    assert timed == ["dense"] * 20 + ["sparse"] * 5 + ["sparse"] * 5 + ["dense"] * 20
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        timing.eager_ms_interleaved(fns, device=CPU, rounds=0)


def test_eager_timing_caps_the_calls_of_a_round(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timing, "_now", clock)
    fns = {"tiny": _costed(clock, calls, "tiny", 1e-4, range(0))}
    timing.eager_ms_interleaved(fns, device=CPU, rep_ms=100.0, rounds=1, warmup_ms=0.0)
    assert len(calls) - 3 == timing.MAX_EAGER_CALLS
