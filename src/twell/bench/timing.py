"""Timing of device work: CUDA events through ``triton.testing.do_bench`` on the GPU, a host clock on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def time_ms(fn: Callable[[], object], *, device: torch.device, warmup_ms: float = 25.0, rep_ms: float = 100.0) -> float:
    """Median milliseconds per call of ``fn`` (warm-up first; inputs are whatever ``fn`` closes over)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
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


#: Rounds of :func:`time_ms_interleaved`.  Five since session 8: with three, the small-M points of the
#: 2048x5632 sweep (0.04-0.08 ms a call, launch-bound) had two disturbed rounds of three at times (the
#: same dense work read 0.041-0.081 ms, bench_results/h200/ffn_sweep_session8.json: *_rounds_ms).
INTERLEAVED_ROUNDS = 5


def time_ms_interleaved(
    fns: dict[str, Callable[[], object]], *, device: torch.device, warmup_ms: float = 25.0, rep_ms: float = 100.0,
    rounds: int = INTERLEAVED_ROUNDS, samples_out: dict[str, list[float]] | None = None,
) -> dict[str, float]:
    """Median ms per call of each callable, timed in ``rounds`` interleaved rounds (each callable once per
    round, ``rep_ms / rounds`` each; the median over its rounds), so that a drift of the GPU's clocks or
    of the host's speed lands on every callable alike.  Timed one after the other, the module paths of
    ``twell bench ffn`` at M <= 256 and 10 % density read 0.53-0.61x of dense while the plain dense
    module timed right after them read as slow (bench_results/h200/ffn_small_m_session4.log).
    ``samples_out``, when given, receives each callable's per-round times (what the median came from)."""
    n = rounds if len(fns) > 1 else 1
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            samples[name].append(time_ms(fn, device=device, warmup_ms=warmup_ms, rep_ms=rep_ms / n))
    if samples_out is not None:
        samples_out.update(samples)
    return {name: statistics.median(s) for name, s in samples.items()}


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
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if wait:
            synchronize(device)
        samples.append((time.perf_counter() - t0) / calls * 1e3)
    synchronize(device)
    return statistics.median(samples)

