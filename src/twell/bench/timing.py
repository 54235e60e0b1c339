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
