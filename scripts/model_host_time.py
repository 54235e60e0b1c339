"""Host time against GPU time of the 1.5B model's eager forward, dense and sparse, per token count, and where the
sparse forward's host time goes.

Why (session 45, ``bench_results/h100/session45_runs.md``): on the H100 machine every sparse layer of the model's
eager forward at 8192 tokens read 1.05-2.07 ms by CUDA events (dense 0.84 ms) while the same layers at 16,384 tokens
averaged 0.93 ms, and no synchronising call or allocator traffic showed (``eager_stall_probe``).  A span that
shrinks when the call doubles is the host's issuing, not the GPU's work.  This measures both sides apart for each
token count: the host milliseconds to issue one forward while ``torch.cuda._sleep`` holds the GPU (the queue never
drains, so the host clock counts the issuing alone), the GPU milliseconds of the forward queued behind a hold (CUDA
events, no host gap inside), the wall clock, and the kernel launches per forward; then a cProfile of the sparse
forward behind a hold (which Python functions its host time is).  Every sparse layer's l0 refresh is off here: its
host read would wait out the whole hold.

    PYTHONPATH=src:scripts python3 scripts/model_host_time.py --tokens 4096 8192 16384 --out $OUT/run   # GPU
    PYTHONPATH=src:scripts python3 scripts/model_host_time.py --device cpu --tiny                        # smoke test
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from eager_floor_probe import forward_of, probe_model  # scripts/ (the script's own directory is on sys.path)

from twell.bench.timing import SLEEP_CYCLES_PER_MS, synchronize
from twell.nn import SparseGatedMLP

#: GPU hold before each sample (ms): above the slowest forward's host time seen (~54 ms at 8192 tokens on the
#: H200 machine, session 44) with room to spare, so the queue never drains while one forward is issued
HOLD_MS = 150.0


def _hold(dev: torch.device) -> None:
    synchronize(dev)
    if dev.type == "cuda":
        torch.cuda._sleep(int(HOLD_MS * SLEEP_CYCLES_PER_MS))


def host_and_gpu_ms(fn: Callable[[], object], dev: torch.device, samples: int) -> tuple[float, float | None]:
    """Medians over ``samples`` of the host ms to issue ``fn()`` behind a GPU hold and of its GPU ms (CUDA only)."""
    host, gpu = [], []
    for _ in range(samples):
        _hold(dev)
        start = end = None
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        if end is not None:
            end.record()
        synchronize(dev)
        if start is not None:
            gpu.append(start.elapsed_time(end))
    return statistics.median(host), (statistics.median(gpu) if gpu else None)


def wall_ms(fn: Callable[[], object], dev: torch.device, samples: int) -> float:
    out = []
    for _ in range(samples):
        synchronize(dev)
        t0 = time.perf_counter()
        fn()
        synchronize(dev)
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def launches(fn: Callable[[], object], dev: torch.device) -> int:
    """Kernel launches (runtime and driver API) of one ``fn()``, by ``torch.profiler``."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        synchronize(dev)
    return sum(int(ev.count) for ev in prof.key_averages() if "LaunchKernel" in ev.key)


def profile_text(fn: Callable[[], object], dev: torch.device, top: int) -> str:
    """cProfile of one ``fn()`` behind a GPU hold: the ``top`` functions by own time, then by cumulative time."""
    _hold(dev)
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    synchronize(dev)
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--policy", default="tables", help="the sparse set's policy (tables: the default without its "
                                                      "eager floor, so every count runs sparse where the tables say)")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--profile-tokens", type=int, default=None, help="the count to cProfile (default: the second)")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--device", default=None)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    preset, tokens, seq, policy, samples = "1.5b", sorted(set(a.tokens)), a.seq, a.policy, a.samples
    if a.tiny:
        preset, tokens, seq, policy, samples = "tiny", [16, 32], 32, "always-sparse", 2
    bench = probe_model(preset, dev, tokens, seq, [policy])
    sparse = f"sparse:{policy}"
    prof_n = a.profile_tokens or tokens[min(1, len(tokens) - 1)]
    rows, prof_out = [], ""
    with torch.inference_mode():
        for n in tokens:
            call = forward_of(bench, n, seq)
            row: dict[str, object] = {"tokens": n}
            for name in ("dense", sparse):
                fn = functools.partial(call, name)
                for _ in range(3):  # the sparse set's first call measures l0, the next build the hot/cold plans
                    fn()
                for mlp in bench.sets.sets[name]:
                    if isinstance(mlp, SparseGatedMLP):
                        mlp.l0_refresh_every = 1 << 40
                host, gpu = host_and_gpu_ms(fn, dev, samples)
                key = "sparse" if name != "dense" else "dense"
                row[f"{key}_host_ms"], row[f"{key}_gpu_ms"] = host, gpu
                row[f"{key}_wall_ms"] = wall_ms(fn, dev, samples)
                row[f"{key}_launches"] = launches(fn, dev)
                if name != "dense" and n == prof_n:
                    prof_out = profile_text(fn, dev, a.top)
            rows.append(row)
            g = {k: "-" if row[f"{k}_gpu_ms"] is None else f"{row[f'{k}_gpu_ms']:.2f}" for k in ("dense", "sparse")}
            print(f"tokens={n:6d} | dense host {row['dense_host_ms']:.2f} ms gpu {g['dense']} wall "
                  f"{row['dense_wall_ms']:.2f} launches {row['dense_launches']} | sparse host "
                  f"{row['sparse_host_ms']:.2f} ms gpu {g['sparse']} wall {row['sparse_wall_ms']:.2f} launches "
                  f"{row['sparse_launches']}", flush=True)
    print(f"cProfile of one sparse forward at {prof_n} tokens (GPU held):\n{prof_out}", flush=True)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model_host_time.json").write_text(json.dumps({"preset": preset, "policy": policy, "rows": rows,
                                                              "profile_tokens": prof_n}, indent=1) + "\n")
        (out / "model_host_time_profile.txt").write_text(prof_out)


if __name__ == "__main__":
    main()
