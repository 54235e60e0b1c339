"""Where the time of one inference FFN call goes: the GPU kernels of the hot/cold op and of ``SparseGatedMLP``.

Runs ``torch.profiler`` over 64 calls each (one l0-refresh call of the module among them) of the public
hot/cold op (``ops.hot_cold_gated_ffn``, the plan built once) and of the module with the default dispatch, on
the synthetic problem of ``twell bench ffn``, and prints per call each kernel's mean GPU time, largest
first, with the kernels' total and the wall time.  Why (session 21): the headline's dispatched module took
0.8351 ms at M=16384, 0.5 % against 0.8191 for the op it runs (bench_results/h200/ffn_headline_session21.json);
the table says which kernels the difference is.
``--timeline`` also prints, per function, where its calls leave the GPU idle (:mod:`twell.bench.kernel_timeline`:
each call profiled on its own, its span split into busy time, overlap and gaps named by the kernels around them):
session 32 measured 1024 x 3072 at 16,384 tokens / 1 % with kernels summing to 0.388 ms in a 0.462 ms call.
``--early-boost B --early-decay D`` give the synthetic sequences another head (session 52: the benchmark model's steep
one, 40 / 4, ran a 2048-token call at 0.70x of dense), ``--policy sparse`` holds the module sparse (``tables``: the
default without its eager floor), and each point first prints the refresh's hot set and dense-row budget and the
sample's longest rows; ``--severe-pairs N`` sets ``hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS`` for the run.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/infer_op_profile.py [--shape 2048x5632] [--points 16384:28 ...]
[--timeline] [--early-boost 40 --early-decay 4] [--policy sparse]``; ``--device cpu --tiny`` under TRITON_INTERPRET=1
is the smoke test (host time only; the timeline's intervals are then the host's operators).
"""

from __future__ import annotations

import torch
from hot_threshold_probe import parse_point  # scripts/ (the script's own directory is on sys.path)

from twell import ops
from twell.bench.kernel_timeline import call_timelines, timeline_lines
from twell.bench.model_measure import kernel_lines, profile_kernels
from twell.bench.probe import probe_device, probe_parser, run_points
from twell.bench.shape_arg import parse_shape
from twell.format.twell import default_capacity
from twell.nn import DEFAULT_POLICY, DispatchPolicy, SparseGatedMLP, hot_cold_cache
from twell.nn.hot_cold_cache import HotColdCache
from twell.ops import hot_cold_dense_rows
from twell.ops.hot_cold_plan import _cold_tile_counts, sample_active
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

CALLS = 64
#: ``--policy``: the module's dispatch.  "tables" drops the eager floor (the benchmarks' and a recorded model's
#: policy: below ~8937 tokens at 2048x5632 the default runs an eager call dense); "sparse" holds it sparse.
POLICIES = {"default": lambda: DEFAULT_POLICY, "tables": DEFAULT_POLICY.without_eager_floor,
            "sparse": DispatchPolicy.always_sparse}
#: Calls profiled one by one for ``--timeline`` (each its own profiler session, so fewer than CALLS)
TIMELINE_CALLS = 16


def longest_rows(x: torch.Tensor, wg: torch.Tensor, cache: HotColdCache, tile: int, capacity: int,
                 top: int = 6) -> list[tuple[int, int, int]]:
    """The ``top`` rows of the refresh's sample with the most cold pairs under the cache's hot set: (position, cold
    pairs, overflowing cold tiles), the row kernel's longest walks."""
    per_tile = _cold_tile_counts(sample_active(x, wg), cache._hot, tile)
    if per_tile is None:
        return []
    pairs, over = per_tile.sum(1), (per_tile > capacity).sum(1)
    order = torch.argsort(pairs, descending=True, stable=True)[:top].tolist()
    return [(i, int(pairs[i]), int(over[i])) for i in order]


def profile_point(m: int, l0: float, d: int, f: int, dev: torch.device, calls: int, timeline: bool,
                  hold_ms: float = 0.0, boost: float = SparsityProfile.early_boost,
                  decay: float = SparsityProfile.early_decay, policy: str = "default") -> None:
    gen = torch.Generator(device=dev).manual_seed(0)
    profile = SparsityProfile(mean_l0=l0, early_boost=boost, early_decay=decay)
    p = synthetic_ffn_problem(m, d, f, profile, generator=gen, device=dev)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    # eager_graphs=0: the profile is of the kernels an unrecorded call launches, not of a replay
    mlp = SparseGatedMLP.from_weights(wg, wu, wd, policy=POLICIES[policy](), eager_graphs=0).eval()
    print(f"M={m} l0={l0}: sequence head early_boost={boost:g} early_decay={decay:g}, policy {policy}", flush=True)
    wd_t = wd.t().contiguous().t()
    with torch.no_grad():
        for _ in range(2):  # the first call measures l0 on the dense path, the second builds the plan
            mlp(x)
        plan = mlp._hot_cold._plan
        cache = mlp._hot_cold
        if plan is not None:  # what the refresh chose: the hot set and the dense-row budget with what it counts
            heavy = {k: round(v * m, 1) for k, v in cache.heavy_row_fractions.items()}
            print(f"M={m} l0={l0}: {cache.n_hot} hot units, dense-row budget {cache.dense_rows(m)} rows; the sample's "
                  f"rows with an overflowing cold tile {cache.overflow_fraction * m:.1f}, with several "
                  f"{cache.severe_overflow_fraction * m:.1f}, heavy rows by bound {heavy}", flush=True)
            print(f"M={m} l0={l0}: the rows with the most cold pairs (position, cold pairs, overflowing tiles) "
                  f"{longest_rows(x, wg, cache, mlp.tile, mlp.capacity or default_capacity(mlp.tile))}", flush=True)
        if plan is None:
            print(f"M={m} l0={l0}: the module took no hot/cold plan (dense or decode at this point)", flush=True)
        fns = {"module": lambda: mlp(x)}
        if plan is not None:
            fns["hot/cold op"] = lambda: ops.hot_cold_gated_ffn(x, wg, wu, wd_t, plan)
        for name, fn in fns.items():
            fn()
            if timeline:
                print(f"M={m} l0={l0} {name} timeline (GPU held {hold_ms:g} ms before each call):", flush=True)
                print(timeline_lines(call_timelines(fn, dev, min(calls, TIMELINE_CALLS), hold_ms=hold_ms)), flush=True)
            if dev.type != "cuda":  # the smoke test: the calls run, there is no GPU kernel to profile
                print(f"M={m} l0={l0} {name}: ran (no CUDA profile on {dev})", flush=True)
                continue
            prof = profile_kernels(fn, dev, top=20, calls=calls)
            print(f"M={m} l0={l0} {name}: kernels {prof['kernel_ms']:.4f} ms/call, wall {prof['wall_ms']:.4f} ms/call",
                  flush=True)
            print(kernel_lines(prof), flush=True)


def main() -> None:
    ap = probe_parser(__doc__)
    ap.add_argument("--points", type=parse_point, nargs="+", default=[(16384, 28.0), (131072, 28.0)])
    ap.add_argument("--shape", type=parse_shape, default=(2048, 5632), help="HIDDENxFFN (default 2048x5632)")
    ap.add_argument("--timeline", action="store_true", help="also each call's kernel timeline: busy, idle, gaps")
    ap.add_argument("--hold-ms", type=float, default=0.0,
                    help="the timeline's GPU hold before each call (0: each call starts on an idle GPU, so its gaps "
                         "include the host's issuing; 2: the benchmarks' timing)")
    ap.add_argument("--early-boost", type=float, default=SparsityProfile.early_boost,
                    help="the synthetic sequence head (SparsityProfile.early_boost; default the profile's own)")
    ap.add_argument("--early-decay", type=float, default=SparsityProfile.early_decay,
                    help="positions over which the head decays by e (SparsityProfile.early_decay)")
    ap.add_argument("--policy", choices=sorted(POLICIES), default="default", help="the module's dispatch policy")
    ap.add_argument("--severe-pairs", type=int, default=hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS,
                    help="hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS for this run (default the shipped value)")
    ap.add_argument("--batch-pass-rows", type=int, default=hot_cold_dense_rows.BATCH_PASS_MAX_ROWS,
                    help="hot_cold_dense_rows.BATCH_PASS_MAX_ROWS for this run (default the shipped value)")
    a = ap.parse_args()
    hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS = a.severe_pairs  # read on each refresh of the hot set
    hot_cold_dense_rows.BATCH_PASS_MAX_ROWS = a.batch_pass_rows  # read at call time (dense_rows_ffn)
    dev = probe_device(a.device)
    (d, f), calls, points = a.shape, CALLS, a.points
    if a.tiny:
        d, f, calls, points = 64, 700, 2, [(300, 6.0)]
    run_points(points, lambda m, l0: profile_point(m, l0, d, f, dev, calls, a.timeline, a.hold_ms, a.early_boost,
                                                   a.early_decay, a.policy), dev)


if __name__ == "__main__":
    main()
