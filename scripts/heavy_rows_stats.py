"""Where the row kernel's work lies in the 1.5B forward's layers: per layer, the rows the dense-row pass takes and
the heaviest rows it leaves to the row kernel (cold pairs, overflowing tiles), under the small-call hot-set bounds.

Why (session 48): the recorded 1.5B forward at 2048 tokens ran 0.83x of recorded dense on an H100 (16.06 vs 13.42
ms; bench_results/h100/recorded_forward_probe_bound3_2048_session48.json) with the row kernel at 3.67 ms over 28
layers, 0.131 ms a layer, while the synthetic layer's whole op took 0.158 ms at 2048 tokens and 0.5 % (bound 3,
dispatch_2048x5632_session48_small_bound3.json); at 4096 tokens it took 4.21 ms, so it barely grows with the tokens:
a tail of a few long rows, each one program's serial work, is the suspect.  The model's first 8 positions fire 360-830
units a layer against 14-42 for the rest (model_forward_recorded_b2_session48.json, ``layers``).  This counts, on the
CPU (fp32; ``--device cuda``: bf16 on the GPU), what each layer hands the row kernel.

    PYTHONPATH=src:scripts python3 scripts/heavy_rows_stats.py --tokens 2048 --bounds 3 10
    PYTHONPATH=src:scripts python3 scripts/heavy_rows_stats.py --tiny   # smoke test

The split is the shipped one unless told: ``--heavy-pairs K`` sets the heavy-row bound at every call size (rows with
more than K cold pairs into the pass's spare budget slots; 0: none), ``--[no-]count-heavy``
hot_cold_cache.DENSE_ROWS_COUNT_HEAVY (budgets that count those rows): what a GPU A/B of either should find, predicted
on the CPU (session 49).  Session 48's log is ``--tokens 2048 --bounds 3 10 --heavy-pairs 0 --no-count-heavy``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from eager_floor_probe import probe_model

from twell.bench.probe import add_long_row_args, apply_long_row_args, probe_device, probe_parser
from twell.format.twell import DEFAULT_TILE, default_capacity
from twell.nn import SparseGatedMLP, hot_cold_cache
from twell.nn.hot_cold_cache import HotColdCache
from twell.ops.hot_cold_dense_rows import heavy_row_pairs, select_overflow_rows_torch
from twell.ops.hot_cold_plan import sample_active
from twell.ops.twell_ffn_kernel import default_sb
from twell.ops.twell_list_kernel import LIST_MAX
from twell.reference.inference import tile_counts

#: Cold-pair counts above which the rows left to the row kernel are counted (candidate heavy-row bounds; rows past
#: the list pass's LIST_MAX are searched tile by tile).
HEAVY_BOUNDS = (16, 32, 64, 128)


def layer_rows(mlp: SparseGatedMLP, x: torch.Tensor, active: torch.Tensor, bound: float, tile: int, cap: int,
               step: int) -> dict:
    """One layer's split at cold-pairs bound ``bound`` as its cache makes it (hot set and dense-row budget from the
    call's own sample), the pass's rows as the shipped selection takes them (with the heavy-row bound that
    ``hot_cold_dense_rows`` holds for a call of n tokens), and what the row kernel keeps; ``active``: the call's firing
    units, bool [n, F] on the CPU."""
    n = active.shape[0]
    cache = HotColdCache(max_cold_l0=bound)
    cache.refresh(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, tile=tile, capacity=cap)
    hot = cache._hot.cpu()
    budget = cache.dense_rows(n)
    is_hot = torch.zeros(active.shape[1], dtype=torch.bool)
    is_hot[hot] = True
    counts = tile_counts(active[:, ~is_hot].to(torch.int8), tile)  # the split's cold tiles
    over_tiles = (counts > cap).sum(1)
    over = over_tiles > 0
    taken = select_overflow_rows_torch(counts, cap, budget, heavy_row_pairs(n))[0].bool()
    pairs = torch.where(counts <= cap, counts, 0).sum(1)  # what the row kernel gathers (overflowing tiles recomputed)
    # one program's serial steps: its pairs in ``step``-entry steps (the row kernel's SB), each overflowing tile
    # tile / step steps of three weight rows
    steps = -(-pairs // step) + over_tiles * (tile // step) * 3
    left = ~taken
    order = torch.argsort(torch.where(left, steps, -1), descending=True)[:5]
    return {"bound": bound, "hot": int(hot.numel()), "cold_pairs_per_row": float(pairs[left].float().mean()),
            "overflow_rows": int(over.sum()), "budget": budget, "taken": int(taken.sum()),
            "left_overflow_rows": int((over & left).sum()),
            "left_searched_rows": int((left & (pairs > LIST_MAX)).sum()),
            "left_rows_over": {str(k): int((left & (pairs > k)).sum()) for k in HEAVY_BOUNDS},
            "heaviest_left": [{"row": int(r), "pairs": int(pairs[r]), "over_tiles": int(over_tiles[r]),
                               "steps": int(steps[r])} for r in order if left[r]],
            "mean_steps": float(steps[left].float().mean())}


def main() -> None:
    p = probe_parser(__doc__)  # --device (here: cpu unless told), --tiny
    p.set_defaults(device="cpu")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--bounds", type=float, nargs="+", default=[3.0, 10.0])
    add_long_row_args(p)
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    a = p.parse_args()
    apply_long_row_args(p, a)
    count_heavy = hot_cold_cache.DENSE_ROWS_COUNT_HEAVY
    preset, tokens, seq = ("tiny", 32, 32) if a.tiny else ("1.5b", a.tokens, a.seq)
    torch.manual_seed(0)
    bench = probe_model(preset, probe_device(a.device), [tokens], seq, ["default"])
    bench.sets.use("sparse:default")
    inputs: list[torch.Tensor] = []
    mlps = [m for m in bench.model.modules() if isinstance(m, SparseGatedMLP)]

    def keep_input(_module: torch.nn.Module, args: tuple) -> None:
        inputs.append(args[0].detach().reshape(-1, args[0].shape[-1]))

    hooks = [m.register_forward_pre_hook(keep_input) for m in mlps]
    ids = bench.tokens[:1, :tokens] if tokens <= seq else bench.tokens[: tokens // seq]
    with torch.no_grad():
        bench.model.model(ids)
    for h in hooks:
        h.remove()
    tile = mlps[0].tile or DEFAULT_TILE
    cap = mlps[0].capacity or default_capacity(tile)
    rows = []
    for i, (m, x) in enumerate(zip(mlps, inputs, strict=True)):
        active = sample_active(x.float(), m.gate_proj.weight.float(), max_tokens=x.shape[0]).cpu()
        l0 = active.sum(1)
        for bound in a.bounds:
            r = {"layer": i, "tokens": x.shape[0], "l0_mean": float(l0.float().mean()), "l0_max": int(l0.max()),
                 "heavy_pairs": heavy_row_pairs(x.shape[0]), "count_heavy": count_heavy,
                 **layer_rows(m, x, active, bound, tile, cap, default_sb(x.shape[1]))}
            rows.append(r)
            heavy = ", ".join(f"{h['row']}:{h['pairs']}p/{h['over_tiles']}t" for h in r["heaviest_left"])
            rule = (f" heavy {r['heavy_pairs']}" if r["heavy_pairs"] else "") + (" counted" if count_heavy else "")
            print(f"layer {i:2d} bound {bound:4.1f}{rule}: l0 {r['l0_mean']:5.1f} (max {r['l0_max']:4d}) "
                  f"hot {r['hot']:4d} "
                  f"pairs/row {r['cold_pairs_per_row']:5.1f} overflow rows {r['overflow_rows']:3d} budget "
                  f"{r['budget']:3d} left overflowing {r['left_overflow_rows']:3d} searched "
                  f"{r['left_searched_rows']:3d} mean steps {r['mean_steps']:4.1f}; left rows over "
                  f"{'/'.join(str(k) for k in HEAVY_BOUNDS)} pairs: "
                  f"{'/'.join(str(n) for n in r['left_rows_over'].values())}; heaviest left (row:pairs/tiles) "
                  f"{heavy}")
    if a.out:
        a.out.write_text(json.dumps({"preset": preset, "tokens": tokens, "tile": tile, "capacity": cap,
                                     "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
