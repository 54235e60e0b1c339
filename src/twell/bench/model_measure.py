"""Timing and memory measurement for ``twell bench model``: interleaved variants, errors kept per variant.

Whole-model calls take 0.1 to 2 s, so each call is timed by itself with the host clock between two device
synchronisations (launch latency is microseconds against that), and the variants are interleaved
(a, b, c, a, b, c, ...) so that clock or temperature drift during the run affects them alike.  A variant
that raises is recorded with its error and dropped from the remaining rounds; the others go on.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .timing import synchronize

__all__ = [
    "PROFILE_TOP",
    "Timings",
    "compile_backend",
    "describe_error",
    "kernel_lines",
    "peak_memory",
    "profile_kernels",
    "synchronize",
    "time_compiled_variants",
    "time_interleaved",
]

#: Kernels listed per variant by the parts' ``profile`` options (largest total GPU time first).
PROFILE_TOP = 25


def describe_error(exc: BaseException) -> str:
    """``Type: message`` plus the innermost frames, short enough for a JSON field."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(frames[-3:]).strip()
    return f"{type(exc).__name__}: {exc}\n{tail[-1500:]}"


def free_device_memory(device: torch.device) -> None:
    """Return cached blocks after an out-of-memory error or between parts (peak figures stay comparable)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class Timings:
    """Milliseconds per call of each variant, its last return value, and the error of each failed variant."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def median_ms(self, name: str) -> float | None:
        values = self.samples.get(name)
        return statistics.median(values) if values else None


def time_interleaved(
    fns: dict[str, Callable[[], Any]],
    *,
    device: torch.device,
    warmup: int,
    reps: int,
    on_call: Callable[[str, Any], None] | None = None,
) -> Timings:
    """``warmup`` untimed then ``reps`` timed rounds over ``fns`` in order; see the module docs.

    ``on_call(name, result)`` runs after each call, outside the timed region (e.g. to release outputs).
    """
    out = Timings(samples={name: [] for name in fns})
    for round_index in range(warmup + reps):
        for name, fn in fns.items():
            if name in out.errors:
                continue
            try:
                synchronize(device)
                t0 = time.perf_counter()
                result = fn()
                synchronize(device)
                elapsed = (time.perf_counter() - t0) * 1e3
            except Exception as exc:  # noqa: BLE001 - recorded, the other variants go on
                out.errors[name] = describe_error(exc)
                out.last.pop(name, None)
                free_device_memory(device)
                continue
            if round_index >= warmup:
                out.samples[name].append(elapsed)
            out.last[name] = result
            if on_call is not None:
                on_call(name, result)
    return out


def peak_memory(fn: Callable[[], Any], device: torch.device) -> dict[str, float] | None:
    """Peak allocated device memory of one call of ``fn``: ``peak_gb`` (absolute, 1e9 bytes, weights and
    everything else alive included) and ``above_start_gb`` (peak minus what was allocated before the call).
    None off CUDA (no allocator statistics)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"peak_gb": peak / 1e9, "above_start_gb": (peak - start) / 1e9}


def profile_kernels(fn: Callable[[], Any], device: torch.device, top: int, calls: int = 1) -> dict[str, Any]:
    """``calls`` calls of ``fn`` under ``torch.profiler`` (CUDA): per call, the GPU time by kernel (the ``top``
    largest), the kernels' total and the wall time (host time shows as the difference)."""
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        wall_ms = (time.perf_counter() - t0) * 1e3 / calls
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = ev.cuda_time_total
        if t > 0 and ev.device_type == torch.autograd.DeviceType.CUDA:
            rows.append({"kernel": ev.key, "ms": t / 1e3 / calls, "calls": ev.count // calls})
    rows.sort(key=lambda r: -r["ms"])
    return {"wall_ms": wall_ms, "kernel_ms": sum(r["ms"] for r in rows), "kernels": rows[:top]}


def kernel_lines(profile: dict[str, Any]) -> str:
    """The kernel table of :func:`profile_kernels`, one ``ms  calls  name`` line per kernel."""
    return "\n".join(f"  {r['ms']:9.3f} {r['calls']:5d}  {r['kernel'][:100]}" for r in profile["kernels"])


def compile_backend(device: torch.device) -> str:
    """The torch.compile backend of the benchmarks' compiled variants: inductor on CUDA, ``aot_eager``
    elsewhere (the CPU tests: the eager ops, traced)."""
    return "inductor" if device.type == "cuda" else "aot_eager"


def time_compiled_variants(fns: dict[str, Callable[[], Any]], device: torch.device, reps: int,
                           warmup: int = 1) -> Timings:
    """All reps of one variant, then the next, each after a dynamo reset and ``warmup`` untimed calls.

    For compiled variants of one model whose MLP modules are swapped (``bench.sets.use``): a compiled
    step guards on those modules, so interleaving variants recompiled it at every swap (the first
    static-cache decode run on the H200 was killed at its 180 s limit while timing four variants at
    batch 1, bench_results/h200/model/model_1.5b_session4_lr1e-6.log).  Here each variant compiles once."""
    out = Timings(samples={name: [] for name in fns})
    for name, fn in fns.items():
        torch._dynamo.reset()
        one = time_interleaved({name: fn}, device=device, warmup=warmup, reps=reps)
        out.samples[name] = one.samples.get(name, [])
        if name in one.last:
            out.last[name] = one.last[name]
        if name in one.errors:
            out.errors[name] = one.errors[name]
    return out
