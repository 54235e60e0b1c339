"""A layer's hot set per size class against one set for every call size: large calls after a small call chose the set.

Until session 59 ``SparseGatedMLP`` kept one hot set, re-chosen on its l0 refresh calls from that call's tokens with
that call's cold-pairs bound (``hot_cold_plan.default_max_cold_l0``: 3 pairs per token under 8192 tokens, 10 to
131,071, 13 from there), so a set chosen on a small call served larger calls until the next refresh (64 calls later
by default).  Now each size class keeps its own (``twell.nn.hot_cold_cache.MAX_HOT_SETS``).  This probe times what
that changes on the synthetic layer of ``twell bench ffn`` (d x F, mean l0 ``--l0``): for each ``--hot-sets K`` a
layer (``HotColdCache(max_sets=K)``, the default policy without its eager floor as ``twell bench ffn`` times the
module, no recordings, l0 refreshes too rare to happen while timed) whose first call takes ``--small`` tokens (a
refresh call: it chooses that class's set), then each ``--large`` count's calls, timed interleaved with the dense bf16
FFN and each other with the GPU held (``time_ms_interleaved``).  Printed per count: each layer's hot units for the
call, ms, speedup against dense, relative error against an fp32 reference; JSON under ``--out``.

    PYTHONPATH=src python3 scripts/hot_sets_probe.py --out $OUT/run                     # GPU machine, ~1-2 minutes
    TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/hot_sets_probe.py --device cpu --tiny
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

from twell._io import write_json_atomic
from twell.bench.probe import probe_device, probe_parser
from twell.bench.shape_arg import parse_shape
from twell.bench.timing import time_ms_interleaved
from twell.nn import DEFAULT_POLICY, DispatchPolicy, SparseGatedMLP
from twell.nn.hot_cold_cache import HotColdCache
from twell.ops import hot_cold_plan
from twell.reference.inference import dense_gated_ffn
from twell.synthetic import SparsityProfile, synthetic_ffn_problem
from twell.tolerances import REL_TOL, rel_error


def dense_ffn(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    """The dense FFN as PyTorch computes it in the inputs' dtype, separate linears (the benchmarks' dense side)."""
    return F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd)


def main() -> None:
    ap = probe_parser(__doc__)
    ap.add_argument("--shape", type=parse_shape, default=parse_shape("2048x5632"), help="HIDDENxFFN")
    ap.add_argument("--l0", type=float, default=28.0, help="mean active units per token of the synthetic layer")
    ap.add_argument("--small", type=int, default=4096, help="tokens of the first call, which chooses the set")
    ap.add_argument("--large", type=int, nargs="+", default=[16384, 131072], help="token counts timed after it")
    ap.add_argument("--hot-sets", type=int, nargs="+", default=[1, 3], help="HotColdCache(max_sets=K) per layer")
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--out", default=None, help="folder for hot_sets_probe.json")
    a = ap.parse_args()
    device = probe_device(a.device)
    (d, f), small, large, l0, rep_ms = a.shape, a.small, a.large, a.l0, a.rep_ms
    policy, tile = DEFAULT_POLICY.without_eager_floor(), 128
    if a.tiny:  # the interpreter: a small layer, sparse at every count, the small class below 32 tokens
        (d, f), small, large, l0, rep_ms, tile = (32, 256), 16, [40], 6.0, 1.0, 32
        policy = DispatchPolicy(table=((1, 1.0),), force=True)
        hot_cold_plan.HOT_SMALL_TOKENS = 32
    if any(k < 1 for k in a.hot_sets) or small < 1 or any(m < 1 for m in large):
        raise SystemExit("--hot-sets, --small and --large must be >= 1")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    p = synthetic_ffn_problem(max(small, *large), d, f, SparsityProfile(mean_l0=l0), generator=gen, dtype=dtype,
                              device=device)
    x_all, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    layers = {}
    for k in a.hot_sets:
        layer = SparseGatedMLP.from_weights(wg, wu, wd, policy=policy, tile=tile, eager_graphs=0, backend="triton",
                                            l0_refresh_every=10**6).eval()
        layer._hot_cold = HotColdCache(max_sets=k)
        layers[f"sets{k}"] = layer
    print(f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'} torch {torch.__version__}; "
          f"{d}x{f}, l0 {l0}, first call {small} tokens, then {large}", flush=True)
    rows = []
    with torch.inference_mode():
        for layer in layers.values():
            layer(x_all[:small])  # call 0: the l0 refresh, which chooses the small class's set
        for m in large:
            x = x_all[:m]
            fns = {"dense": lambda x=x: dense_ffn(x, wg, wu, wd)}
            fns.update({name: (lambda x=x, layer=layer: layer(x)) for name, layer in layers.items()})
            want = dense_gated_ffn(x.float(), wg.float(), wu.float(), wd.float())
            row: dict = {"tokens": m}
            for name, layer in layers.items():
                out = layer(x)
                hot_set = layer._hot_cold.set_for(m)
                row[f"{name}_n_hot"] = None if hot_set is None else hot_set.n_hot
                row[f"{name}_classes"] = len(layer._hot_cold.classes)
                row[f"{name}_rel_error"] = rel_error(out.float(), want)
            row["dense_rel_error"] = rel_error(fns["dense"]().float(), want)
            ms = time_ms_interleaved(fns, device=device, rep_ms=rep_ms)
            for name, v in ms.items():
                row[f"{name}_ms"] = v
                if name != "dense":
                    row[f"{name}_speedup"] = ms["dense"] / v
            rows.append(row)
            cells = " | ".join(f"{name} {row[f'{name}_ms']:.3f} ms" + (
                f" {row[f'{name}_speedup']:.3f}x, {row[f'{name}_n_hot']} hot, err {row[f'{name}_rel_error']:.1e}"
                f" ok {row[f'{name}_rel_error'] <= REL_TOL[dtype]}"
                if name != "dense" else "") for name in fns)
            print(f"tokens={m:7d} | {cells}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(a.out) / "hot_sets_probe.json", {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "shape": [d, f], "l0": l0, "small": small, "hot_sets": a.hot_sets,
            "rows": rows})


if __name__ == "__main__":
    main()
