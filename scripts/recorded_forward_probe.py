"""Why the 1.5B backbone recorded under ``torch.compile(mode="reduce-overhead")`` ran slower sparse than dense.

Session 46 (H100 machine, ``bench_results/h100/session46_runs.md``): the recorded backbone, traced and called inside
``static_dispatch`` as the README's recipe says, took 35.45 ms sparse (the default policy's tables) against 27.90 ms
dense at 4096 tokens (0.787x) and 50.11 vs 52.98 at 8192 (1.057x), while session 45's eager decoder layers took
21.48 ms of GPU time sparse against 22.41 dense at 4096 tokens.  35.45 ms is what the host-bound compiled forward
without CUDA graphs took in session 45 (36.17): either inductor skipped the CUDA graphs of the sparse graph (a graph
break, a mutated input, a CPU tensor in the graph) or the traced sparse path does GPU work the eager one does not (the
weight copies it builds every call).  Neither, it turned out: no break or skip, one graph launch a call, and the
eager forward runs the same sparse kernels for as long; the row kernel's tail on rows that overflow many cold tiles
is the cost.  For each set the probe prints dynamo's graph breaks and inductor's CUDA-graph skips (counters, and the
``perf_hints`` log on stderr), the host ms to issue one call and the GPU ms of the call while ``torch.cuda._sleep``
holds the GPU ahead of it, the wall clock, the kernel and graph launches per call, and the kernels with the most
device time; and beside them the eager forward's kernels and its decoder layers' host and GPU ms, the GPU held from
the first layer on (``model_host_time.layers_host_and_gpu_ms``).

    PYTHONPATH=src:scripts python3 scripts/recorded_forward_probe.py --tokens 4096 8192 --out $OUT/run   # GPU
    PYTHONPATH=src:scripts python3 scripts/recorded_forward_probe.py --device cpu --tiny                 # smoke test

``--cached-weights`` records inside ``static_dispatch(cached_weights=True)`` after ``prepare_static_weights`` on every
layer (the split's weight copies read in place, not built in the graph each call).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from eager_floor_probe import probe_model  # scripts/ (the script's own directory is on sys.path)
from eager_stall_probe import profiled_calls
from model_host_time import layers_host_and_gpu_ms
from torch._dynamo.utils import counters

from twell.bench.model_measure import time_interleaved
from twell.bench.probe import add_long_row_args, apply_long_row_args, probe_device, probe_parser
from twell.bench.timing import SLEEP_CYCLES_PER_MS, synchronize
from twell.models import causal_mask
from twell.nn import SparseGatedMLP, hot_cold_cache, static_dispatch
from twell.ops import hot_cold_dense_rows, hot_cold_plan

#: GPU hold ahead of each held sample (ms): above the ~43 ms the slowest eager sparse forward took to issue on the
#: H100 machine (session 45), so the queue never drains while one call is issued
HOLD_MS = 100.0


def held_call_ms(fn: Callable[[], object], dev: torch.device, samples: int) -> tuple[float, float | None]:
    """Medians over ``samples`` calls of the host ms to issue ``fn()`` and (CUDA) its GPU ms, the GPU held ahead of
    it so that the GPU clock counts the call's work alone, not the host's gaps."""
    host, gpu = [], []
    for _ in range(samples):
        synchronize(dev)
        start = end = None
        if dev.type == "cuda":
            torch.cuda._sleep(int(HOLD_MS * SLEEP_CYCLES_PER_MS))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        if start is not None and end is not None:
            end.record()
            synchronize(dev)
            gpu.append(start.elapsed_time(end))
    return statistics.median(host), (statistics.median(gpu) if gpu else None)


def top_kernels(fn: Callable[[], object], dev: torch.device, top: int) -> list[dict]:
    """The ``top`` kernels of one ``fn()`` by device time (CUDA only), with count and total us."""
    if dev.type != "cuda":
        return []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(dev)
    rows = [{"name": ev.key[:90], "count": int(ev.count), "device_us": float(ev.self_device_time_total)}
            for ev in prof.key_averages() if ev.self_device_time_total > 0]
    return sorted(rows, key=lambda r: -r["device_us"])[:top]


def compile_counters() -> dict[str, object]:
    """Dynamo's graph breaks (reason -> count), its unique graphs and inductor's CUDA-graph skips since the last
    ``counters.clear()``."""
    return {"graph_breaks": dict(counters["graph_break"]), "unique_graphs": counters["stats"].get("unique_graphs", 0),
            "cudagraph_skips": counters["inductor"].get("cudagraph_skips", 0)}


def main() -> None:
    p = probe_parser(__doc__)  # --device, --tiny
    p.set_defaults(device="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--policy", default="default", help="the sparse set's policy (tables: without the eager floor, so "
                                                       "eager calls run sparse where the recorded ones do)")
    p.add_argument("--small-bound", type=float, default=None,
                   help="HOT_MAX_COLD_L0_SMALL for this run (the hot set's cold-pairs bound below HOT_SMALL_TOKENS)")
    p.add_argument("--min-expected", type=float, default=None,
                   help="DENSE_ROWS_MIN_EXPECTED for this run (the overflowing rows a call must be expected to hold "
                        "for a dense-row pass)")
    p.add_argument("--severe-tiles", type=int, default=None,
                   help="DENSE_ROWS_SEVERE_TILES for this run (0: no pass for rows that overflow several tiles unless "
                        "the row minimum is met)")
    p.add_argument("--severe-pairs", type=int, default=None,
                   help="DENSE_ROWS_SEVERE_PAIRS for this run (0: rows count as long by their overflowing tiles only)")
    p.add_argument("--fused-pass", action=argparse.BooleanOptionalAction, default=None,
                   help="hot_cold_dense_rows.FUSED_PASS for this run: the dense-row pass as its Triton kernels (8 "
                        "launches) or in PyTorch ops (~20); default: as shipped")
    p.add_argument("--batch-pass-rows", type=int, default=None,
                   help="hot_cold_dense_rows.BATCH_PASS_MAX_ROWS for this run (passes of up to this many rows through "
                        "the small-batch kernels; 0: the three GEMMs); default: as shipped")
    p.add_argument("--causal-skip", action=argparse.BooleanOptionalAction, default=None,
                   help="twell.models.causal_mask.SKIP_TRACED_CAUSAL_MASK for this run: SDPA's is_causal instead of a "
                        "materialised causal mask in the traced forward; default: as shipped")
    add_long_row_args(p)
    p.add_argument("--cached-weights", action="store_true",
                   help="record inside static_dispatch(cached_weights=True) after prepare_static_weights on each layer "
                        "(the split's weight copies read in place instead of built every call)")
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dev = probe_device(a.device)
    preset, tokens, seq, policy, samples = "1.5b", sorted(set(a.tokens)), a.seq, a.policy, a.samples
    if a.tiny:
        preset, tokens, seq, policy, samples = "tiny", [32], 32, "always-sparse", 2
    if a.small_bound is not None:
        hot_cold_plan.HOT_MAX_COLD_L0_SMALL = a.small_bound  # read at call time (default_max_cold_l0)
    if a.min_expected is not None:
        hot_cold_cache.DENSE_ROWS_MIN_EXPECTED = a.min_expected  # read at call time (HotColdCache.dense_rows)
    if a.severe_tiles is not None:
        hot_cold_cache.DENSE_ROWS_SEVERE_TILES = a.severe_tiles  # read on each refresh of the hot set
    if a.severe_pairs is not None:
        hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS = a.severe_pairs  # read on each refresh of the hot set
    if a.fused_pass is not None:
        hot_cold_dense_rows.FUSED_PASS = a.fused_pass  # read at call time (select_overflow_rows, dense_rows_ffn)
    if a.causal_skip is not None:
        causal_mask.SKIP_TRACED_CAUSAL_MASK = a.causal_skip  # read at call time (the twell configs' sdpa mask)
    if a.batch_pass_rows is not None:
        hot_cold_dense_rows.BATCH_PASS_MAX_ROWS = a.batch_pass_rows  # read at call time (dense_rows_ffn)
    apply_long_row_args(p, a)
    torch._logging.set_logs(perf_hints=True, graph_breaks=True)
    bench = probe_model(preset, dev, tokens, seq, [policy])
    backbone = bench.model.model
    mode = {"mode": "reduce-overhead"} if dev.type == "cuda" else {"backend": "aot_eager"}
    rows = []
    with torch.inference_mode():
        for n in tokens:
            ids = bench.tokens[:1, :n] if n <= seq else bench.tokens[: n // seq]
            for name in ("dense", f"sparse:{policy}"):
                mlps = bench.sets.use(name)
                for _ in range(3):  # eager calls measure l0 (calls inside static_dispatch leave it as it is)
                    backbone(input_ids=ids, use_cache=False)
                with static_dispatch():  # the recipe's warm-up call: hot units chosen where eager calls ran dense
                    backbone(input_ids=ids, use_cache=False)
                for m in mlps:  # no l0 refresh from here on: its host read would wait out a hold
                    if isinstance(m, SparseGatedMLP):
                        m.l0_refresh_every = 1 << 40

                def eager_fn() -> torch.Tensor:
                    return backbone(input_ids=ids, use_cache=False).last_hidden_state

                eager: dict[str, object] = {}
                # held from the first decoder layer on: the forward's causal-mask setup reads the device, so a hold
                # ahead of the call is waited out there and the GPU clock then counts the host's issuing
                # (session 46's first runs did that: eager "GPU" ms 28.84-80.10, host 113-180 ms behind 100 ms holds)
                eager["host_ms"], eager["gpu_ms"] = layers_host_and_gpu_ms(eager_fn, bench.sets.layers[0], dev,
                                                                           samples)
                eager["top_kernels"] = top_kernels(eager_fn, dev, a.top)
                t = time_interleaved({"eager": eager_fn}, device=dev, warmup=1, reps=samples)
                eager["wall_ms"] = statistics.median(t.samples["eager"])
                ready = [m.prepare_static_weights() if a.cached_weights and isinstance(m, SparseGatedMLP) else None
                         for m in mlps]
                torch._dynamo.reset()
                counters.clear()
                compiled = torch.compile(backbone, **mode)

                def fn() -> torch.Tensor:
                    with static_dispatch(cached_weights=a.cached_weights):
                        return compiled(input_ids=ids, use_cache=False).last_hidden_state.clone()

                for _ in range(3):  # inductor records its CUDA graph on the second call
                    fn()
                row: dict[str, object] = {"tokens": n, "set": name, **compile_counters(), "eager": eager,
                                          "cached_weights_ready": ready}
                row["hot_units"] = [len(m._hot_cold._plan.hot) if isinstance(m, SparseGatedMLP)
                                    and m._hot_cold._plan is not None else None for m in mlps]
                row["dense_rows"] = [m._hot_cold.dense_rows(n) if isinstance(m, SparseGatedMLP) else None
                                     for m in mlps]
                row["l0"] = [round(float(m.last_l0), 1) if isinstance(m, SparseGatedMLP) and m.last_l0 is not None
                             else None for m in mlps]
                t = time_interleaved({"call": fn}, device=dev, warmup=0, reps=samples)
                row["wall_ms"] = statistics.median(t.samples["call"])
                row["host_ms"], row["gpu_ms"] = held_call_ms(fn, dev, samples)
                row["launches"] = {r["name"]: r["count"] for r in profiled_calls(fn, dev, ("LaunchKernel",
                                                                                          "GraphLaunch"))}
                row["top_kernels"] = top_kernels(fn, dev, a.top)
                rows.append(row)
                gpu = "-" if row["gpu_ms"] is None else f"{row['gpu_ms']:.2f}"
                print(f"tokens={n} {name}: hot units {row['hot_units']}, dense rows {row['dense_rows']}, l0 "
                      f"{row['l0']}", flush=True)
                print(f"tokens={n} {name}: wall {row['wall_ms']:.2f} ms, held call host {row['host_ms']:.2f} gpu "
                      f"{gpu}; graph breaks {sum(row['graph_breaks'].values())}, unique graphs "
                      f"{row['unique_graphs']}, cudagraph skips {row['cudagraph_skips']}; launches {row['launches']}",
                      flush=True)
                for k in row["top_kernels"]:
                    print(f"    {k['device_us']:9.1f} us {k['count']:4d}x {k['name']}", flush=True)
                gpu = "-" if eager["gpu_ms"] is None else f"{eager['gpu_ms']:.2f}"
                print(f"tokens={n} {name} eager: wall {eager['wall_ms']:.2f} ms; decoder layers held, host "
                      f"{eager['host_ms']:.2f} gpu {gpu}", flush=True)
                for k in eager["top_kernels"]:
                    print(f"    {k['device_us']:9.1f} us {k['count']:4d}x {k['name']}", flush=True)
                for reason, count in row["graph_breaks"].items():
                    print(f"    graph break x{count}: {reason[:200]}", flush=True)
            torch._dynamo.reset()
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "recorded_forward_probe.json").write_text(json.dumps({"preset": preset, "policy": policy,
                                                                     "small_bound": hot_cold_plan.HOT_MAX_COLD_L0_SMALL,
                                                                     "min_expected":
                                                                         hot_cold_cache.DENSE_ROWS_MIN_EXPECTED,
                                                                     "severe_tiles":
                                                                         hot_cold_cache.DENSE_ROWS_SEVERE_TILES,
                                                                     "severe_pairs":
                                                                         hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS,
                                                                     "cached_weights": a.cached_weights,
                                                                     "fused_pass": hot_cold_dense_rows.FUSED_PASS,
                                                                     "causal_skip":
                                                                         causal_mask.SKIP_TRACED_CAUSAL_MASK,
                                                                     "batch_pass_rows":
                                                                         hot_cold_dense_rows.BATCH_PASS_MAX_ROWS,
                                                                     "heavy_pairs": hot_cold_dense_rows.HEAVY_ROW_PAIRS,
                                                                     "heavy_pairs_large":
                                                                         hot_cold_dense_rows.HEAVY_ROW_PAIRS_LARGE,
                                                                     "heavy_large_tokens":
                                                                         hot_cold_dense_rows.HEAVY_ROWS_LARGE_TOKENS,
                                                                     "count_heavy":
                                                                         hot_cold_cache.DENSE_ROWS_COUNT_HEAVY,
                                                                     "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
