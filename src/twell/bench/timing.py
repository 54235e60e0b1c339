"""Timing of device work: CUDA events through ``triton.testing.do_bench`` on the GPU, a host clock on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..ops._runtime import interpreting


def time_ms(fn: Callable[[], object], *, device: torch.device, warmup_ms: float = 25.0, rep_ms: float = 100.0) -> float:
    """Median milliseconds per call of ``fn`` (warm-up first; inputs are whatever ``fn`` closes over)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    if interpreting():  # TRITON_INTERPRET=1 (the probes' CPU smoke tests): no figure means anything there, so
        # one call, timed; the warm-up and three samples were ~3x the interpreted work of each probe's test
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    fn()  # warm-up (first-call allocations, autotuning)
    samples = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while True:
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() > deadline and len(samples) >= 3:
            break
    return statistics.median(samples)


#: Rounds of :func:`time_ms_interleaved`: its samples are reported in this many consecutive groups (the
#: ``*_rounds_ms`` fields of the benchmarks), each group's median kept, so that a disturbed stretch shows.
INTERLEAVED_ROUNDS = 5

#: Most alternation cycles :func:`time_ms_interleaved` runs: a bound on the events it records (two per
#: call) when the callables are tiny, e.g. on the CPU test problems.
MAX_CYCLES = 2000

#: Bytes written before every timed call on CUDA to flush the L2 cache (50-60 MB on H100/H200), as
#: ``triton.testing.do_bench`` does, so that every callable starts from cold weights alike.
L2_FLUSH_BYTES = 256 * 1024 * 1024

#: SM clock cycles per millisecond that :func:`time_ms_interleaved`'s ``hold_ms`` converts with
#: (``torch.cuda._sleep`` spins for a number of cycles): the H200's top SM clock, 1980 MHz, so a hold is
#: at least as long as asked.
SLEEP_CYCLES_PER_MS = 1.98e6

#: Default ``hold_ms`` of :func:`time_ms_interleaved` on CUDA.  Measured (H200, session 10,
#: bench_results/h200/timing_probe_session10.log): without a hold, at M=1024, 5 % the dispatched module,
#: which runs the dense module's very kernels there, read 0.82x of it because the hot/cold op in the same
#: cycle is host-bound (0.385 ms a call by do_bench, 0.126 ms of device time) and the device waited at
#: every start event; with 0.5 ms or 2 ms held it read 1.00x and 0.99x.  2 ms covers the slowest host
#: side seen (~0.4 ms) with room.
DEFAULT_HOLD_MS = 2.0

_now = time.perf_counter  # the host clock of time_ms_interleaved (a module global, so tests can drive it)


def time_ms_interleaved(
    fns: dict[str, Callable[[], object]], *, device: torch.device, warmup_ms: float = 25.0, rep_ms: float = 100.0,
    rounds: int = INTERLEAVED_ROUNDS, samples_out: dict[str, list[float]] | None = None,
    hold_ms: float = DEFAULT_HOLD_MS,
) -> dict[str, float]:
    """Median ms per call of each callable, the callables alternating call by call (A B C, B C A, C A B,
    ...) so that a drift of the GPU's clocks or of the host's speed lands on every callable alike.

    Until session 8 the callables took turns in five rounds of ``rep_ms / 5`` each; at M=256 / 5 % the
    module path, which runs the very same dense kernels as the plain dense FFN there, read 0.79-0.81x of it
    because three of the five rounds were disturbed and the disturbance fell unevenly between the
    callables (bench_results/h200/ffn_small_m_session8.json: dense 0.053-0.066 ms, the module 0.052-0.088).
    Call by call, a disturbance longer than one cycle (4 calls, < 1 ms at small M) hits all of them.

    Each callable gets about ``rep_ms`` of timed calls (the slowest one sets the number of cycles, at least
    ``rounds``, at most :data:`MAX_CYCLES`).  On CUDA every call is timed by its own pair of events after
    an L2 flush (what ``triton.testing.do_bench`` does), so a call's time is its device time; elsewhere by
    the host clock.  ``samples_out``, when given, receives each callable's medians over ``rounds``
    consecutive groups of cycles (what the spread of the timing was).

    ``hold_ms`` (CUDA): the device spins that long after each flush, before the call's start event, so
    that the host has queued the call's kernels by the time the event is reached: a call's interval then
    holds its device time only, not host time during which the device waited for its kernels (which it
    does when some callable in the cycle is host-bound; :data:`DEFAULT_HOLD_MS`).  Host time per call is
    then not in these figures: ``back_to_back_ms`` and scripts/module_overhead.py measure it."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if hold_ms < 0:
        raise ValueError(f"hold_ms must be >= 0, got {hold_ms}")
    names = list(fns)
    if not names:
        return {}
    est = {name: _warm_up_ms(fns[name], device=device, warmup_ms=warmup_ms) for name in names}
    cycles = int(min(MAX_CYCLES, max(rounds, rep_ms / max(max(est.values()), 1e-3))))
    samples = _alternate(fns, names, cycles, device, hold_ms)
    if samples_out is not None:
        samples_out.update({name: _group_medians(s, min(rounds, cycles)) for name, s in samples.items()})
    return {name: statistics.median(s) for name, s in samples.items()}


def _warm_up_ms(fn: Callable[[], object], *, device: torch.device, warmup_ms: float) -> float:
    """Call ``fn`` for about ``warmup_ms`` (at least twice); return its mean ms per call over the last
    calls, the estimate that sizes the timed loop."""
    fn()  # first call: compilation, autotuning, allocations
    synchronize(device)
    calls, t0 = 0, _now()
    while True:
        fn()
        calls += 1
        synchronize(device)
        elapsed = (_now() - t0) * 1e3
        if elapsed >= warmup_ms and calls >= 2:
            return elapsed / calls


def _alternate(fns: dict[str, Callable[[], object]], names: list[str], cycles: int,
               device: torch.device, hold_ms: float = 0.0) -> dict[str, list[float]]:
    """``cycles`` cycles of one call of each callable, the order rotated by one every cycle; ms per call."""
    n = len(names)
    order = [[names[(c + k) % n] for k in range(n)] for c in range(cycles)]
    samples: dict[str, list[float]] = {name: [] for name in names}
    if device.type == "cuda":
        flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
        events = []
        for cycle in order:
            for name in cycle:
                flush.zero_()
                if hold_ms:
                    torch.cuda._sleep(int(hold_ms * SLEEP_CYCLES_PER_MS))
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[name]()
                end.record()
                events.append((name, start, end))
        synchronize(device)
        for name, start, end in events:
            samples[name].append(float(start.elapsed_time(end)))
        return samples
    for cycle in order:
        for name in cycle:
            t0 = _now()
            fns[name]()
            samples[name].append((_now() - t0) * 1e3)
    return samples


def _group_medians(values: list[float], groups: int) -> list[float]:
    """Medians of ``groups`` consecutive, near-equal slices of ``values`` (in order)."""
    bounds = [round(i * len(values) / groups) for i in range(groups + 1)]
    return [statistics.median(values[bounds[i]:bounds[i + 1]]) for i in range(groups)]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def back_to_back_ms(fn: Callable[[], object], *, device: torch.device, calls: int, rounds: int,
                    wait: bool = True) -> float:
    """Median over ``rounds`` of the wall milliseconds per call of ``calls`` calls issued back to back.

    ``wait``: the clock stops after a synchronisation, so a round measures the slower of host and device
    (what a loop of such calls sees); without it the clock stops once the calls are issued, which is the
    host time per call as long as the device's launch queue does not fill (keep ``calls`` small then)."""
    samples = []
    for _ in range(rounds):
        synchronize(device)
        t0 = _now()
        for _ in range(calls):
            fn()
        if wait:
            synchronize(device)
        samples.append((_now() - t0) / calls * 1e3)
    synchronize(device)
    return statistics.median(samples)


#: Most calls :func:`eager_ms_interleaved` issues back to back in one round (a bound when the callables are tiny).
MAX_EAGER_CALLS = 200


def eager_ms_interleaved(fns: dict[str, Callable[[], object]], *, device: torch.device, rep_ms: float = 100.0,
                         rounds: int = INTERLEAVED_ROUNDS, warmup_ms: float = 10.0) -> dict[str, float]:
    """Median wall ms per call of each callable issued back to back from Python, as eager code issues them: no hold,
    no L2 flush, the clock stopped after a synchronisation (:func:`back_to_back_ms`), so a call costs the slower of
    its host issuing and its device work.  :func:`time_ms_interleaved` times the device alone; the two differ where
    the host is the bottleneck (session 40: the hot/cold op's host time 442-957 us a call on the H100 machine, the
    dense chain's 76-119 us).  ``rounds`` rounds, the callables' order rotated each round, each callable about
    ``rep_ms / rounds`` ms a round (at most :data:`MAX_EAGER_CALLS` calls)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(fns)
    est = {name: _warm_up_ms(fns[name], device=device, warmup_ms=warmup_ms) for name in names}
    calls = {name: int(max(1, min(MAX_EAGER_CALLS, rep_ms / rounds / max(est[name], 1e-3)))) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            samples[name].append(back_to_back_ms(fns[name], device=device, calls=calls[name], rounds=1))
    return {name: statistics.median(s) for name, s in samples.items()}
