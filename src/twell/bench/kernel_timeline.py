"""Where a call leaves the GPU idle: its kernels' intervals from ``torch.profiler``, their union and the gaps.

Why (session 32, ``docs/performance.md``): at 1024 x 3072 and 16,384 tokens / 1 % the hot/cold op's kernels summed to
0.388 ms while the timed call took 0.462 ms, so the GPU sat idle for part of the call; Nsight Systems, which would
show where, does not run on the GPU machines (``.library/device/KINDS.md``).  ``torch.profiler`` records each
kernel's start and end on the GPU clock, and that is enough: each call is profiled on its own, after a synchronize,
and its span (first kernel start to last kernel end) splits into busy time (the union of the kernels' intervals),
time where kernels overlap (the sum of their durations less the union), and gaps, each named by the kernels on its
two sides.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .timing import SLEEP_CYCLES_PER_MS, synchronize

__all__ = ["CallTimeline", "Interval", "call_timelines", "events_of", "outermost", "timeline_lines", "timeline_of"]


@dataclass(frozen=True)
class Interval:
    """One kernel (or, off CUDA, one operator): its name and start / end in microseconds."""

    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class CallTimeline:
    """One call's intervals (sorted by start, offsets from the first start) and what they add up to."""

    intervals: tuple[Interval, ...]
    span_us: float
    busy_us: float
    overlap_us: float
    #: ``(gap us, the interval that ended before it, the one that starts after it)``, largest first
    gaps: tuple[tuple[float, str, str], ...]

    @property
    def idle_us(self) -> float:
        return self.span_us - self.busy_us


def timeline_of(intervals: list[Interval]) -> CallTimeline:
    """The span, busy time, overlap and gaps of one call's ``intervals`` (any order, possibly overlapping)."""
    if not intervals:
        raise ValueError("no intervals: the profiled call launched nothing on the profiled device")
    bad = [iv for iv in intervals if not iv.end_us >= iv.start_us]
    if bad:
        raise ValueError(f"intervals must end at or after their start; got {bad[:3]}")
    ivs = sorted(intervals, key=lambda iv: (iv.start_us, iv.end_us))
    t0 = ivs[0].start_us
    ivs = [Interval(iv.name, iv.start_us - t0, iv.end_us - t0) for iv in ivs]
    busy = 0.0
    gaps: list[tuple[float, str, str]] = []
    seg_start, seg_end, last = ivs[0].start_us, ivs[0].end_us, ivs[0].name
    for iv in ivs[1:]:
        if iv.start_us > seg_end:
            busy += seg_end - seg_start
            gaps.append((iv.start_us - seg_end, last, iv.name))
            seg_start, seg_end, last = iv.start_us, iv.end_us, iv.name
        elif iv.end_us >= seg_end:
            seg_end, last = iv.end_us, iv.name
    busy += seg_end - seg_start
    span = max(iv.end_us for iv in ivs)
    total = sum(iv.end_us - iv.start_us for iv in ivs)
    gaps.sort(key=lambda g: -g[0])
    return CallTimeline(tuple(ivs), span, busy, total - busy, tuple(gaps))


def outermost(intervals: list[Interval]) -> list[Interval]:
    """The intervals that no other one holds (host operators nest: ``aten::linear`` holds ``aten::mm``); of equal
    ones, the first."""
    out: list[Interval] = []
    reach = float("-inf")
    for iv in sorted(intervals, key=lambda iv: (iv.start_us, -iv.end_us)):
        if iv.end_us > reach:
            out.append(iv)
            reach = iv.end_us
    return out


def events_of(prof: Any, device_type: torch.autograd.DeviceType) -> list[Interval]:
    """The intervals of a finished ``torch.profiler.profile``'s events on ``device_type`` (CUDA: the kernels and
    memsets / copies on the GPU clock)."""
    return [Interval(ev.name, float(ev.time_range.start), float(ev.time_range.end))
            for ev in prof.events() if ev.device_type == device_type]


#: The kernel ``torch.cuda._sleep`` launches (ATen's Sleep.cu): a hold's interval, left out of the call's timeline
HOLD_KERNEL = "spin_kernel"


def call_timelines(fn: Callable[[], Any], device: torch.device, calls: int, *, hold_ms: float = 0.0
                   ) -> list[CallTimeline]:
    """``calls`` timelines of ``fn``, each call profiled on its own after a synchronize.  On CUDA the intervals are
    the GPU's kernels; elsewhere the host's top-level operators (the CPU tests' stand-in: nothing runs on a GPU).

    ``hold_ms`` (CUDA; >= 0): the GPU spins this long before each call (``torch.cuda._sleep``), so the host issues
    the call's launches while the GPU is busy, as in the benchmarks' timing (``bench.timing.DEFAULT_HOLD_MS``) and in
    a model whose host runs ahead; the hold's kernel is left out.  With 0 a call starts on an idle GPU and its gaps
    include the host's issuing: session 40 saw 450-560 us before the fused gate kernel that way
    (``bench_results/h100/timeline_*_calltimeline_session40.log``), about the op's host time a call."""
    from torch.profiler import ProfilerActivity, profile

    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    if not hold_ms >= 0:  # also refuses NaN
        raise ValueError(f"hold_ms must be >= 0, got {hold_ms}")
    cuda = device.type == "cuda"
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    out = []
    for _ in range(calls):
        synchronize(device)
        with profile(activities=[activity]) as prof:
            if cuda and hold_ms > 0:
                torch.cuda._sleep(int(hold_ms * SLEEP_CYCLES_PER_MS))
            fn()
            synchronize(device)
        ivs = [iv for iv in events_of(prof, kind) if HOLD_KERNEL not in iv.name]
        out.append(timeline_of(ivs if cuda else outermost(ivs)))
    return out


def timeline_lines(timelines: list[CallTimeline], *, gaps: int = 5, name_width: int = 70) -> str:
    """The medians over the calls (span, busy, idle, overlap), then the median-span call's kernels with their start
    offsets and durations, and its ``gaps`` largest gaps with the kernels around them."""
    if not timelines:
        raise ValueError("no timelines to print")
    med = {k: statistics.median(getattr(t, k) for t in timelines) for k in ("span_us", "busy_us", "idle_us",
                                                                             "overlap_us")}
    call = sorted(timelines, key=lambda t: t.span_us)[len(timelines) // 2]
    lines = [f"  {len(timelines)} calls, medians: span {med['span_us']:.1f} us, busy {med['busy_us']:.1f}, idle "
             f"{med['idle_us']:.1f} ({100 * med['idle_us'] / max(med['span_us'], 1e-9):.1f} %), overlap "
             f"{med['overlap_us']:.1f}",
             f"  the median call (span {call.span_us:.1f} us): start us, duration us, kernel"]
    lines += [f"    {iv.start_us:9.1f} {iv.end_us - iv.start_us:9.1f}  {iv.name[:name_width]}" for iv in call.intervals]
    lines += [f"  gap {g:7.1f} us after {a[:name_width // 2]} before {b[:name_width // 2]}" for g, a, b in
              call.gaps[:gaps]]
    return "\n".join(lines)
