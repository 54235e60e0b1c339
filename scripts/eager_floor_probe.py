"""Where eager sparse calls stop paying: the 1.5B-shaped model's eager forward, dense against the default policy, at
several token counts in one process, timed by the wall clock so that the host's issuing counts.

Why: the dispatch tables are timed with the GPU held, as in a model whose host runs ahead; issuing one hot/cold op call
took the host 442-957 us on the H100 machine against the dense chain's 76-119 us (session 40,
bench_results/h200/session40_runs.md), so an eager forward at small token counts may lose to dense where the tables
say sparse.  This probe builds and calibrates the model once (``twell.bench.model_setup.prepare``, the headline's
fused norms, rotary and residual adds), then times forwards of ``tokens`` tokens (one sequence up to ``--seq``, else
whole sequences) for each variant, interleaved (``time_interleaved``: a synchronize before and after each forward).
It prints per token count the medians, default / dense as a speedup, how many layers the default policy sends sparse
for an eager call, and last the smallest ``DispatchPolicy.eager_min_tokens`` that keeps every measured eager forward at
or above ``--bar`` of dense (0 when none falls below).

``--graphs N``: also each policy's layers with ``eager_graphs=N`` (``sparse:<policy>+graphs``: calls below the eager
floor that the tables send sparse are recorded in CUDA graphs per token count and replayed, ``twell.nn.call_graphs``);
the warm-up then needs 4 rounds (l0, the count's first call, the recording, a replay) and gets at least that.

    PYTHONPATH=src:scripts python3 scripts/eager_floor_probe.py --out $OUT/run            # GPU machine, ~2 minutes
    TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/eager_floor_probe.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from twell.bench.model_measure import time_interleaved
from twell.bench.model_setup import DEFAULT_L0, GRAPHED, POLICIES, BenchModel, prepare, set_policy
from twell.bench.model_sparsity import SparsityTarget
from twell.nn import SparseGatedMLP, call_graphs, hot_cold_cache
from twell.nn.dispatch import dense_ffn_flops
from twell.nn.dispatch_tuning import derive_eager_floor

TOKENS = (1024, 2048, 4096, 8192, 16384)


def suggested_floor(points: list[dict], bar: float) -> int:
    """The smallest eager floor under which every measured point at or above it holds ``speedup >= bar``
    (:func:`twell.nn.dispatch_tuning.derive_eager_floor`).  ``points``: dicts with ``tokens`` and ``speedup``, any
    order; a point without a speedup (a failed variant) counts as losing."""
    return derive_eager_floor((int(p["tokens"]), p.get("speedup") is None or p["speedup"] < bar) for p in points)


def probe_model(preset: str, device: torch.device, tokens: list[int], seq: int, policies: list[str]) -> BenchModel:
    """The preset built and calibrated once on as many ``seq``-token sequences as the largest count needs, with the
    headline's fused norms, rotary and residual adds, and a sparse set per policy (bf16 on CUDA, fp32 elsewhere);
    each count must be >= 1 and, above ``seq``, a multiple of it (:func:`forward_of` takes whole sequences there)."""
    for n in tokens:
        if n < 1 or (n > seq and n % seq):
            raise SystemExit(f"--tokens: each count must be >= 1 and, above --seq {seq}, a multiple of it; got {n}")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return prepare(preset, device=device, dtype=dtype, batch=max(1, max(tokens) // seq), seq=seq,
                   target=SparsityTarget(mean_l0=DEFAULT_L0[preset]), policies=policies,
                   fused_norms=True, fused_rope=device.type == "cuda", fused_residual=True)


def forward_of(bench: BenchModel, n: int, seq: int) -> Callable[[str], None]:
    """``call(name)``: one eager forward of the model's backbone under the MLP set ``name`` on ``n`` tokens of the
    benchmark batch (one sequence up to ``seq`` tokens, else ``n // seq`` whole sequences)."""
    ids = bench.tokens[:1, :n] if n <= seq else bench.tokens[: n // seq]
    backbone = bench.model.model

    def call(name: str) -> None:
        bench.sets.use(name)
        backbone(input_ids=ids, use_cache=False)

    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="1.5b")
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    p.add_argument("--seq", type=int, default=2048, help="sequence length above which calls take whole sequences")
    p.add_argument("--policies", nargs="+", default=["default"], help=f"sparse variants ({', '.join(POLICIES)})")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed rounds (the first measures l0, the next choose the hot sets)")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--bar", type=float, default=0.95, help="the speedup below which a point counts as a loss")
    p.add_argument("--graphs", type=int, default=0,
                   help="also each policy with eager_graphs=N (recorded eager calls below the floor; 0: not)")
    p.add_argument("--record-max-tokens", type=int, default=None,
                   help="with --graphs: also record calls at or above the eager floor up to this many tokens' work "
                        "(sets twell.nn.call_graphs.RECORD_MAX_FLOPS for the model's FFN shape; default: as shipped)")
    p.add_argument("--hot-sets", type=int, default=None,
                   help="how many size classes keep a hot set per layer (sets twell.nn.hot_cold_cache.MAX_HOT_SETS "
                        "before the model is built; 1: one set for every call size; default: as shipped)")
    p.add_argument("--device", default=None)
    p.add_argument("--tiny", action="store_true", help="the tiny preset, a few small token counts (interpreter test)")
    p.add_argument("--out", default=None, help="folder for eager_floor_probe.json")
    a = p.parse_args()
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    preset, tokens, seq, reps, policies = a.preset, sorted(set(a.tokens)), a.seq, a.reps, a.policies
    if a.tiny:  # on the CPU the default policy runs dense: always-sparse exercises the sparse path
        preset, tokens, seq, reps, policies = "tiny", [8, 32, 64], 32, 2, ["default", "always-sparse"]
    if a.hot_sets is not None:
        if a.hot_sets < 1:
            raise SystemExit(f"--hot-sets must be >= 1, got {a.hot_sets}")
        hot_cold_cache.MAX_HOT_SETS = a.hot_sets  # read when each layer's cache is made
    bench = probe_model(preset, device, tokens, seq, policies)
    warmup = a.warmup
    if a.graphs:
        first = bench.sets.sets["dense"][0]
        shape = (first.gate_proj.in_features, first.gate_proj.out_features)
        if a.record_max_tokens is not None:
            call_graphs.RECORD_MAX_FLOPS = dense_ffn_flops(a.record_max_tokens, shape)
        for pol in list(policies):
            if not (POLICIES[set_policy(pol)].eager_floor_tokens(shape) or call_graphs.RECORD_MAX_FLOPS):
                # no floor and nothing recorded above one (RECORD_MAX_FLOPS 0): no call to record
                print(f"--graphs: '{pol}' sets no eager floor at {shape[0]} x {shape[1]}, so no graphed variant")
                continue
            bench.sets.add_converted(f"sparse:{pol}{GRAPHED}", set_policy(pol), eager_graphs=a.graphs)
            policies.append(f"{pol}{GRAPHED}")
        warmup = max(warmup, 4)
    n_seqs = bench.tokens.shape[0]
    if device.type == "cuda":
        print(torch.cuda.get_device_name(device), "torch", torch.__version__, flush=True)
    print(f"{preset}: built in {bench.seconds['build_s']:.1f} s, calibrated on {n_seqs} x {seq} tokens in "
          f"{bench.seconds['calibrate_s']:.1f} s; eager forwards, wall clock, {warmup} warm-up + {reps} reps",
          flush=True)
    names = ["dense", *(f"sparse:{pol}" for pol in policies)]
    rows = []
    with torch.inference_mode():
        for n in tokens:
            call = forward_of(bench, n, seq)
            t = time_interleaved({name: (lambda name=name: call(name)) for name in names}, device=device,
                                 warmup=warmup, reps=reps)
            row: dict = {"tokens": n, "errors": t.errors}
            for name in names:
                if t.samples.get(name):
                    row[f"{name}_ms"] = statistics.median(t.samples[name])
            for pol in policies:
                name = f"sparse:{pol}"
                layers = [m for m in bench.sets.sets[name] if isinstance(m, SparseGatedMLP)]
                row[f"{name}_sparse_layers"] = sum(m._use_sparse(n, device.type, eager=True) for m in layers)
                if pol.endswith(GRAPHED):
                    row[f"{name}_recorded_layers"] = sum(n in m._graphs.calls for m in layers)
                # each layer's hot-set size after the count's calls (None: none chosen), to tell sets apart
                row[f"{name}_n_hot"] = [m._hot_cold.n_hot for m in layers]
                row[f"{name}_hot_classes"] = [len(m._hot_cold.classes) for m in layers]
                if f"{name}_ms" in row and "dense_ms" in row:
                    row[f"{name}_speedup"] = row["dense_ms"] / row[f"{name}_ms"]
            rows.append(row)
            cells = " | ".join(f"{k.removesuffix('_ms')} {v:.3f} ms" for k, v in row.items() if k.endswith("_ms"))
            extra = " | ".join(f"{k} {v:.3f}x" if k.endswith("speedup") else f"{k} {v}"
                               for k, v in row.items() if k.endswith(("speedup", "sparse_layers", "recorded_layers")))
            print(f"tokens={n:6d} | {cells} | {extra}" + (f" | errors {t.errors}" if t.errors else ""), flush=True)
    result = {"preset": preset, "device": str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "bar": a.bar, "graphs": a.graphs,
              "record_max_flops": call_graphs.RECORD_MAX_FLOPS, "max_hot_sets": hot_cold_cache.MAX_HOT_SETS,
              "rows": rows, "floors": {}}
    for pol in policies:
        pts = [{"tokens": r["tokens"], "speedup": r.get(f"sparse:{pol}_speedup")} for r in rows]
        floor = suggested_floor(pts, a.bar)
        result["floors"][pol] = floor
        print(f"eager floor for '{pol}' at bar {a.bar}: eager_min_tokens = {floor}"
              + (" (no eager forward below the bar)" if floor == 0 else ""), flush=True)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "eager_floor_probe.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
