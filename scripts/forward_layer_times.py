"""Per-layer FFN time of ``twell bench model``'s forward, dense against sparse, with each sparse layer's hot set
and overflowing cold tiles.

Why (session 21): the 1.5B forward reads 1.337x of dense against the 1.35x goal, while the synthetic FFN at
131,072 tokens and l0=28 reads ~2x.  The model's per-layer sparsity (``model_forward_lazy_l0_session21.json``)
has the first 8 positions of each sequence far denser in the first layers (l0 874 at layer 0, 458 at layer 1,
224 at layer 2, against 20-44 for the other positions); their cold tiles may overflow the container's slots,
and the row kernel recomputes an overflowing tile densely on CUDA cores.  This says, per layer, what each FFN
takes and how many (token, cold tile) pairs overflow.

Builds the preset as ``twell bench model`` does (calibrated sparsity, fused RMSNorms and rotary), warms each
variant up, then times every layer's MLP call with CUDA events over ``--reps`` forwards (medians).
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/forward_layer_times.py [--preset 1.5b]``; ``--device cpu
--tiny`` (the tiny preset, host clock) is the smoke test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import triton

from twell.bench.model_setup import DEFAULT_L0, POLICIES, PRESETS, BenchModel, prepare
from twell.bench.model_sparsity import SparsityTarget
from twell.bench.probe import probe_device, probe_parser
from twell.bench.timing import SLEEP_CYCLES_PER_MS
from twell.format.twell import default_capacity
from twell.nn import DispatchPolicy, SparseGatedMLP, hot_cold_cache


def _stamp(dev: torch.device) -> Callable[[], object]:
    """A time stamp: a recorded CUDA event on the GPU, the host clock elsewhere."""
    if dev.type == "cuda":
        def event() -> torch.cuda.Event:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return event
    return time.perf_counter


def _elapsed_ms(a: object, b: object) -> float:
    if isinstance(a, torch.cuda.Event):
        return a.elapsed_time(b)
    return (b - a) * 1e3  # type: ignore[operator]


def layer_times(model: torch.nn.Module, mlps: list[torch.nn.Module], ids: torch.Tensor, reps: int,
                dev: torch.device, *, first_layer: torch.nn.Module | None = None, hold_ms: float = 0.0) -> list[float]:
    """Median ms of each layer's MLP call over ``reps`` forwards of ``model.model`` on ``ids``.

    ``hold_ms`` (CUDA, with ``first_layer``, the first decoder layer): the GPU spins that long as the first layer
    starts, so the forward's kernels queue behind it while the host issues them and each span is GPU time alone.
    Without it a span includes the host's issuing wherever the host falls behind (session 45, H100 machine: every
    sparse layer 1.05-2.07 ms at 8192 tokens, 0.93 on average at 16,384, ``bench_results/h100/session45_runs.md``)."""
    stamp = _stamp(dev)
    marks: list[list[tuple[object, object]]] = [[] for _ in mlps]
    starts: dict[int, object] = {}
    handles = []
    if hold_ms > 0 and first_layer is not None and dev.type == "cuda":
        cycles = int(hold_ms * SLEEP_CYCLES_PER_MS)
        handles.append(first_layer.register_forward_pre_hook(lambda _m, _a: torch.cuda._sleep(cycles)))
    for i, mlp in enumerate(mlps):
        handles.append(mlp.register_forward_pre_hook(lambda _m, _a, i=i: starts.__setitem__(i, stamp())))
        handles.append(mlp.register_forward_hook(lambda _m, _a, _o, i=i: marks[i].append((starts[i], stamp()))))
    try:
        for _ in range(reps):
            model.model(input_ids=ids, use_cache=False)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    finally:
        for h in handles:
            h.remove()
    return [statistics.median(_elapsed_ms(a, b) for a, b in m) for m in marks]


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The model options the forward probes share: ``--preset``, ``--batch``, ``--seq``."""
    ap.add_argument("--preset", default="1.5b", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=2048)


def prepare_forward(preset: str, batch: int, seq: int, dev: torch.device, *, fused: bool = True) -> BenchModel:
    """The preset as ``twell bench model`` builds it (calibrated sparsity; bf16 on CUDA, fp32 elsewhere), with the
    fused RMSNorms and, on CUDA, the fused rotary (``fused=False``: the transformers modules)."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    return prepare(preset, device=dev, dtype=dtype, batch=batch, seq=seq,
                   target=SparsityTarget(mean_l0=DEFAULT_L0[preset]), policies=("default",),
                   fused_norms=fused, fused_rope=fused and dev.type == "cuda")


def hold_sparse(mlps: list[torch.nn.Module]) -> None:
    """Send every call of ``mlps`` sparse (the CPU takes the dense path under the default policy)."""
    for mlp in mlps:
        mlp.policy = DispatchPolicy.always_sparse()


def cold_counts(mlp: SparseGatedMLP) -> tuple[int, torch.Tensor | None]:
    """The hot count of the layer's plan and its last sparse call's per-(token, cold tile) counts (None when no
    counts are kept: a dense or decode call, or l0 already read)."""
    plan = mlp._hot_cold._plan
    n_hot = plan.n_hot if plan is not None else 0
    counts = mlp._state.l0_counts  # the last sparse call's counts, kept until last_l0 is read
    if counts is None:
        return n_hot, None
    return n_hot, counts[:, :triton.cdiv(mlp.intermediate_size - n_hot, mlp.tile)]


def overflow_stats(mlp: torch.nn.Module) -> str:
    """The hot count and the overflowing (token, cold tile) pairs of a sparse layer's last call."""
    if not isinstance(mlp, SparseGatedMLP):
        return ""
    n_hot, cold = cold_counts(mlp)
    if cold is None:
        return "no counts kept (dense or decode call, or l0 already read)"
    cap = mlp.capacity or default_capacity(mlp.tile)
    over = cold > cap
    rows = int(over.any(1).sum())
    budget = mlp._hot_cold.dense_rows(cold.shape[0])
    return f"H={n_hot:4d} overflowing cold tiles {int(over.sum()):7d} in {rows:6d} tokens, dense-row budget {budget:5d}"


def main() -> None:
    ap = probe_parser(__doc__)
    add_model_args(ap)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hold-ms", type=float, default=150.0,
                    help="GPU hold as the first decoder layer starts (CUDA; 0: none, spans then include host time): "
                         "longer than the host takes to issue one forward (32-43 ms sparse at 4096-16,384 tokens on "
                         "the H100 machine's host, session 45)")
    ap.add_argument("--no-dense-rows", action="store_true",
                    help="every overflowing row in the row kernel (hot_cold_cache.DENSE_OVERFLOW_ROWS off)")
    a = ap.parse_args()
    if a.no_dense_rows:
        hot_cold_cache.DENSE_OVERFLOW_ROWS = False
    dev = probe_device(a.device)
    preset, batch, seq, reps = a.preset, a.batch, a.seq, a.reps
    if a.tiny:
        preset, batch, seq, reps = "tiny", 2, 16, 2
    bench = prepare_forward(preset, batch, seq, dev)
    dtype, ids = bench.dtype, bench.tokens
    if a.tiny:
        hold_sparse(bench.sets.sets["sparse:default"])
    else:  # these are eager calls: the default's eager floor (8937 tokens at 2048 x 5632) would send smaller ones dense
        for mlp in bench.sets.sets["sparse:default"]:
            mlp.policy = POLICIES["tables"]
    times = {}
    with torch.inference_mode():
        for name in ("dense", "sparse:default"):
            mlps = bench.sets.use(name)
            for _ in range(2):  # the sparse set's first call measures l0 (dense path), the second builds plans
                bench.model.model(input_ids=ids, use_cache=False)
            times[name] = layer_times(bench.model, mlps, ids, reps, dev, first_layer=bench.sets.layers[0],
                                      hold_ms=a.hold_ms)
        sparse = bench.sets.use("sparse:default")
        hold = f"GPU held {a.hold_ms:g} ms at the first layer" if a.hold_ms > 0 and dev.type == "cuda" else "no hold"
        print(f"{preset}, {batch} x {seq} tokens, {dtype}, {hold}; per layer: dense ms, sparse ms, dense / sparse, "
              f"the sparse layer's hot units, overflowing cold tiles and dense-row budget (last call; dense rows "
              f"{'on' if hot_cold_cache.DENSE_OVERFLOW_ROWS else 'off'})", flush=True)
        for i, (t_d, t_s) in enumerate(zip(times["dense"], times["sparse:default"], strict=True)):
            print(f"layer {i:2d}: dense {t_d:8.3f} ms, sparse {t_s:8.3f} ms, {t_d / t_s:5.2f}x | "
                  f"{overflow_stats(sparse[i])}", flush=True)
        tot_d, tot_s = sum(times["dense"]), sum(times["sparse:default"])
        print(f"all layers: dense {tot_d:.3f} ms, sparse {tot_s:.3f} ms, {tot_d / tot_s:.3f}x", flush=True)


if __name__ == "__main__":
    main()
