"""Why the 1.5B model's eager forward at 8192 tokens ran slower than both its host and its GPU on the H200 machine
(session 44, ``eager_floor_probe_callverify_session44.json``: the tables alone 53.7 ms a forward at 8192 tokens
against 36.8 at 4096 and 66.6 at 16,384; dense 42.1 ms; an eager layer alone at 8192 tokens 1.08x of dense in
``dispatch_eager_2048x5632_calleagertune_session44.json``).

For each token count: the median wall-clock forward of the dense and the sparse set (the tables without the eager
floor), then one sparse forward under ``torch.profiler`` whose host-side CUDA runtime calls that can stall the host
(stream/device/event synchronise, cudaMalloc, cudaFree, memcpy device-to-host) are counted with their total time,
and the caching allocator's counters (``num_alloc_retries``, cudaMalloc and cudaFree counts) before and after the
timed forwards; and the sparse set's forwards back to back, without the dense set's between them.  A stall that
grows with the token count shows as a synchronising call or an allocator retry.

    PYTHONPATH=src:scripts python3 scripts/eager_stall_probe.py --out $OUT/run            # GPU machine, ~1-2 min
    PYTHONPATH=src python3 scripts/eager_stall_probe.py --device cpu --tiny               # CPU smoke test
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from eager_floor_probe import forward_of, probe_model  # scripts/ (the script's own directory is on sys.path)

from twell.bench.model_measure import time_interleaved
from twell.bench.probe import probe_device, probe_parser

STALL_MARKERS = ("Synchronize", "cudaMalloc", "cudaFree", "Memcpy", "cudaEventQuery", "cuMemAlloc", "cuMemFree")


def allocator_counters(device: torch.device) -> dict[str, int]:
    """The caching allocator's counters that reveal cudaMalloc / cudaFree traffic (empty on the CPU)."""
    if device.type != "cuda":
        return {}
    s = torch.cuda.memory_stats(device)
    keys = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")
    return {k: int(s.get(k, 0)) for k in keys}


def profiled_calls(fn: Callable[[], object], device: torch.device, markers: tuple[str, ...]) -> list[dict]:
    """The events of one ``fn()`` under ``torch.profiler`` whose names contain one of ``markers``, with count and total
    host us, largest first."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    rows = []
    for ev in prof.key_averages():
        if any(m in ev.key for m in markers):
            rows.append({"name": ev.key, "count": int(ev.count), "cpu_us": float(ev.cpu_time_total)})
    return sorted(rows, key=lambda r: -r["cpu_us"])


def stall_events(fn: Callable[[], object], device: torch.device) -> list[dict]:
    """The host-side runtime calls of one ``fn()`` whose names mark a possible stall, with count and total us."""
    return profiled_calls(fn, device, STALL_MARKERS)


def main() -> None:
    p = probe_parser(__doc__)  # --device, --tiny
    p.set_defaults(device="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 6144, 8192, 12288, 16384])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--policy", default="tables")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    device = probe_device(a.device)
    preset, tokens, seq, policy = "1.5b", sorted(set(a.tokens)), a.seq, a.policy
    if a.tiny:
        preset, tokens, seq, policy = "tiny", [16, 32, 64], 32, "always-sparse"
    bench = probe_model(preset, device, tokens, seq, [policy])
    sparse = f"sparse:{policy}"
    rows = []
    with torch.inference_mode():
        for n in tokens:
            call = forward_of(bench, n, seq)
            before = allocator_counters(device)
            t = time_interleaved({name: (lambda name=name: call(name)) for name in ("dense", sparse)},
                                 device=device, warmup=a.warmup, reps=a.reps)
            after = allocator_counters(device)
            # the sparse set alone, back to back: whether alternating with the dense set's buffers costs the sparse one
            alone = time_interleaved({sparse: lambda: call(sparse)}, device=device, warmup=1, reps=a.reps)
            row = {"tokens": n, "errors": t.errors,
                   "dense_ms": statistics.median(t.samples["dense"]) if t.samples["dense"] else None,
                   "sparse_ms": statistics.median(t.samples[sparse]) if t.samples[sparse] else None,
                   "sparse_samples_ms": t.samples[sparse],
                   "sparse_alone_ms": statistics.median(alone.samples[sparse]) if alone.samples[sparse] else None,
                   "allocator_delta": {k: after[k] - before.get(k, 0) for k in after},
                   "stalls_sparse": stall_events(lambda: call(sparse), device),
                   "stalls_dense": stall_events(lambda: call("dense"), device)}
            rows.append(row)
            stalls = ", ".join(f"{r['name']} x{r['count']} {r['cpu_us']:.0f} us" for r in row["stalls_sparse"][:5])
            dstalls = ", ".join(f"{r['name']} x{r['count']} {r['cpu_us']:.0f} us" for r in row["stalls_dense"][:3])
            print(f"tokens={n:6d} dense {row['dense_ms']:.3f} ms sparse {row['sparse_ms']:.3f} ms "
                  f"(alone {row['sparse_alone_ms']:.3f} ms) samples {[round(s, 1) for s in row['sparse_samples_ms']]} "
                  f"alloc {row['allocator_delta']}\n"
                  f"   sparse stalls: {stalls or 'none'}\n   dense stalls: {dstalls or 'none'}", flush=True)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "eager_stall_probe.json").write_text(json.dumps({"preset": preset, "policy": policy, "rows": rows},
                                                                indent=1) + "\n")


if __name__ == "__main__":
    main()
