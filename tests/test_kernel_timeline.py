"""``twell.bench.kernel_timeline``: a call's span, busy time, overlap and gaps from its intervals."""

from __future__ import annotations

import time

import pytest
import torch

from twell.bench.kernel_timeline import Interval, call_timelines, outermost, timeline_lines, timeline_of


def test_span_busy_overlap_and_gaps_of_overlapping_intervals():
    # offsets from the first start: A 0-10 and B 5-12 overlap by 5, then C 20-25 and D 40-41 after gaps of 8 and 15
    ivs = [Interval("C", 120, 125), Interval("A", 100, 110), Interval("D", 140, 141), Interval("B", 105, 112)]
    t = timeline_of(ivs)
    assert [iv.name for iv in t.intervals] == ["A", "B", "C", "D"]
    assert t.intervals[0].start_us == 0 and t.intervals[-1].end_us == 41
    assert t.span_us == 41 and t.busy_us == 18 and t.idle_us == 23 and t.overlap_us == 5
    assert t.gaps == ((15, "C", "D"), (8, "B", "C"))


def test_a_nested_interval_is_overlap_and_no_gap():
    t = timeline_of([Interval("outer", 0, 10), Interval("inner", 2, 3)])
    assert (t.span_us, t.busy_us, t.overlap_us, t.gaps) == (10, 10, 1, ())
    # the gap after a segment is named by the interval that ended it last
    t = timeline_of([Interval("long", 0, 10), Interval("short", 1, 2), Interval("next", 12, 13)])
    assert t.gaps == ((2, "long", "next"),)


def test_bad_intervals_are_refused():
    with pytest.raises(ValueError, match="no intervals"):
        timeline_of([])
    with pytest.raises(ValueError, match="end at or after their start"):
        timeline_of([Interval("backwards", 5, 4)])
    with pytest.raises(ValueError, match="no timelines"):
        timeline_lines([])


def test_outermost_keeps_what_no_other_interval_holds():
    ivs = [Interval("linear", 0, 10), Interval("mm", 1, 9), Interval("twin", 0, 10), Interval("tail", 5, 15),
           Interval("later", 20, 21)]
    assert [iv.name for iv in outermost(ivs)] == ["linear", "tail", "later"]


def test_call_timelines_on_the_cpu_see_the_gap_between_two_operators():
    a = torch.randn(64, 64)

    def fn() -> None:
        torch.mm(a, a)
        time.sleep(0.02)
        torch.mm(a, a)

    timelines = call_timelines(fn, torch.device("cpu"), calls=2)
    assert len(timelines) == 2
    for t in timelines:
        assert [iv.name for iv in t.intervals] == ["aten::mm", "aten::mm"]
        (gap, before, after), = t.gaps
        assert gap >= 15_000 and before == after == "aten::mm"
        assert t.busy_us < t.span_us and t.idle_us == pytest.approx(gap)
    text = timeline_lines(timelines)
    assert text.startswith("  2 calls, medians: span ") and "gap " in text and "aten::mm" in text
    with pytest.raises(ValueError, match="calls must be >= 1"):
        call_timelines(fn, torch.device("cpu"), calls=0)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="hold_ms must be >= 0"):
            call_timelines(fn, torch.device("cpu"), calls=1, hold_ms=bad)
    held, = call_timelines(fn, torch.device("cpu"), calls=1, hold_ms=2.0)  # off CUDA a hold does nothing
    assert [iv.name for iv in held.intervals] == ["aten::mm", "aten::mm"]


@pytest.mark.gpu
def test_gpu_held_calls_leave_out_the_hold_and_its_wait():
    """On the GPU, with a hold before each call: the hold's kernel is not in the timeline, and two matmuls issued
    while the GPU spins run back to back (the host's time between them is hidden behind the hold)."""
    dev = torch.device("cuda")
    a = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)

    def fn() -> None:
        torch.mm(a, a)
        time.sleep(0.005)  # 5 ms of host time between the two launches, inside the 20 ms hold
        torch.mm(a, a)

    fn()
    held = call_timelines(fn, dev, calls=2, hold_ms=20.0)
    idle = call_timelines(fn, dev, calls=2)
    for t in held:
        assert len(t.intervals) == 2 and not any("spin_kernel" in iv.name for iv in t.intervals)
        assert t.idle_us < 1000, t  # back to back: no 5 ms wait for the host
    assert all(t.idle_us > 4000 for t in idle), idle  # without the hold the GPU waits for the second launch
