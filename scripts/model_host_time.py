"""Host time against GPU time of the 1.5B model's eager forward, dense and sparse, per token count, and where the
sparse forward's host time goes.

Why (session 45, ``bench_results/h100/session45_runs.md``): on the H100 machine every sparse layer of the model's
eager forward at 8192 tokens read 1.05-2.07 ms by CUDA events (dense 0.84 ms) while the same layers at 16,384 tokens
averaged 0.93 ms, and no synchronising call or allocator traffic showed (``eager_stall_probe``).  A span that
shrinks when the call doubles is the host's issuing, not the GPU's work.  This measures both sides apart for each
token count: the host milliseconds to issue the decoder layers while ``torch.cuda._sleep`` holds the GPU (the queue
never drains, so the host clock counts the issuing alone), the GPU milliseconds of those layers queued behind the
hold (CUDA events, no host gap inside), the forward's wall clock with the layers' l0 refresh as shipped and off, and
the kernel launches per forward; then a cProfile of the sparse forward behind a hold (which Python functions its host
time is).  The l0 refresh is off for the held forwards: its host read would wait out the whole hold.

    PYTHONPATH=src:scripts python3 scripts/model_host_time.py --tokens 4096 8192 16384 --out $OUT/run   # GPU
    PYTHONPATH=src:scripts python3 scripts/model_host_time.py --device cpu --tiny                        # smoke test
"""

from __future__ import annotations

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
from eager_stall_probe import profiled_calls

from twell.bench.model_measure import time_interleaved
from twell.bench.probe import probe_device, probe_parser
from twell.bench.timing import SLEEP_CYCLES_PER_MS, synchronize
from twell.nn import SparseGatedMLP

#: GPU hold before each sample (ms): above the slowest forward's host time seen (~54 ms at 8192 tokens on the
#: H200 machine, session 44) with room to spare, so the queue never drains while one forward is issued
HOLD_MS = 150.0


def _hold(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda._sleep(int(HOLD_MS * SLEEP_CYCLES_PER_MS))


def layers_host_and_gpu_ms(fn: Callable[[], object], first_layer: torch.nn.Module, dev: torch.device, samples: int
                           ) -> tuple[float, float | None]:
    """Medians over ``samples`` forwards ``fn()`` of the host ms to issue the decoder layers and of their GPU ms
    (CUDA only): a pre-hook on the first layer holds the GPU, then starts both clocks; they stop when the forward
    returns.  The hold sits after the forward's causal-mask setup, which reads the device (transformers'
    ``find_packed_sequence_indices``: session 45's first call found it waiting out a hold placed before the forward)."""
    host, gpu = [], []
    marks: dict[str, object] = {}

    def pre_hook(_module: torch.nn.Module, _args: object) -> None:
        _hold(dev)
        if dev.type == "cuda":
            marks["start"] = torch.cuda.Event(enable_timing=True)
            marks["start"].record()  # type: ignore[attr-defined]
        marks["t0"] = time.perf_counter()

    handle = first_layer.register_forward_pre_hook(pre_hook)
    try:
        for _ in range(samples):
            synchronize(dev)
            fn()
            host.append((time.perf_counter() - marks["t0"]) * 1e3)  # type: ignore[operator]
            if dev.type == "cuda":
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                synchronize(dev)
                gpu.append(marks["start"].elapsed_time(end))  # type: ignore[attr-defined]
    finally:
        handle.remove()
    return statistics.median(host), (statistics.median(gpu) if gpu else None)


def wall_ms(fn: Callable[[], object], dev: torch.device, samples: int) -> float:
    """Median wall-clock ms of ``samples`` calls ``fn()``, each between two synchronisations."""
    t = time_interleaved({"forward": fn}, device=dev, warmup=0, reps=samples)
    if t.errors:
        raise RuntimeError(t.errors["forward"])
    return statistics.median(t.samples["forward"])


def launches(fn: Callable[[], object], dev: torch.device) -> int:
    """Kernel launches (runtime and driver API) of one ``fn()``, by ``torch.profiler``."""
    return sum(r["count"] for r in profiled_calls(fn, dev, ("LaunchKernel",)))


def profile_text(fn: Callable[[], object], first_layer: torch.nn.Module, dev: torch.device, top: int) -> str:
    """cProfile of one ``fn()``, the GPU held from the first decoder layer on: the ``top`` functions by own time,
    then by cumulative time."""
    handle = first_layer.register_forward_pre_hook(lambda _m, _a: _hold(dev))
    prof = cProfile.Profile()
    try:
        synchronize(dev)
        prof.enable()
        fn()
        prof.disable()
        synchronize(dev)
    finally:
        handle.remove()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def main() -> None:
    p = probe_parser(__doc__)  # --device, --tiny
    p.set_defaults(device="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--policy", default="tables", help="the sparse set's policy (tables: the default without its "
                                                      "eager floor, so every count runs sparse where the tables say)")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--profile-tokens", type=int, default=None, help="the count to cProfile (default: the second)")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dev = probe_device(a.device)
    preset, tokens, seq, policy, samples = "1.5b", sorted(set(a.tokens)), a.seq, a.policy, a.samples
    if a.tiny:
        preset, tokens, seq, policy, samples = "tiny", [16, 32], 32, "always-sparse", 2
    bench = probe_model(preset, dev, tokens, seq, [policy])
    sparse = f"sparse:{policy}"
    prof_n = a.profile_tokens or tokens[min(1, len(tokens) - 1)]
    rows, prof_out = [], ""
    first = bench.sets.layers[0]
    with torch.inference_mode():
        for n in tokens:
            call = forward_of(bench, n, seq)
            row: dict[str, object] = {"tokens": n}
            for name in ("dense", sparse):
                fn = functools.partial(call, name)
                key = "sparse" if name != "dense" else "dense"
                for _ in range(3):  # the sparse set's first call measures l0, the next build the hot/cold plans
                    fn()
                row[f"{key}_wall_refresh_ms"] = wall_ms(fn, dev, samples)  # as eager_stall_probe times it
                for mlp in bench.sets.sets[name]:
                    if isinstance(mlp, SparseGatedMLP):
                        mlp.l0_refresh_every = 1 << 40
                host, gpu = layers_host_and_gpu_ms(fn, first, dev, samples)
                row[f"{key}_host_ms"], row[f"{key}_gpu_ms"] = host, gpu
                row[f"{key}_wall_ms"] = wall_ms(fn, dev, samples)
                row[f"{key}_launches"] = launches(fn, dev)
                if name != "dense" and n == prof_n:
                    prof_out = profile_text(fn, first, dev, a.top)
            rows.append(row)
            g = {k: "-" if row[f"{k}_gpu_ms"] is None else f"{row[f'{k}_gpu_ms']:.2f}" for k in ("dense", "sparse")}
            print(" | ".join([f"tokens={n:6d}"] + [
                f"{k} layers host {row[f'{k}_host_ms']:.2f} ms gpu {g[k]}, forward wall {row[f'{k}_wall_ms']:.2f} "
                f"(refresh on {row[f'{k}_wall_refresh_ms']:.2f}), launches {row[f'{k}_launches']}"
                for k in ("dense", "sparse")]), flush=True)
    print(f"cProfile of one sparse forward at {prof_n} tokens (GPU held):\n{prof_out}", flush=True)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model_host_time.json").write_text(json.dumps({"preset": preset, "policy": policy, "rows": rows,
                                                              "profile_tokens": prof_n}, indent=1) + "\n")
        (out / "model_host_time_profile.txt").write_text(prof_out)


if __name__ == "__main__":
    main()
