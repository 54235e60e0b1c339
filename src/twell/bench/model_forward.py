"""``twell bench model`` forward part: the backbone forward, dense ReLU FFN vs the sparse FFN.

The backbone (embeddings, decoder layers, final norm; no LM head, as in the published tokens/ms) runs
on the benchmark batch (``--batch`` x ``--seq`` tokens, default 64 x 2048 = 131,072) under
``torch.inference_mode`` with ``use_cache=False``.  Variants: ``dense`` (the same weights with
:class:`~twell.nn.DenseReluGatedMLP`, cuBLAS) and one sparse variant per dispatch policy
(``sparse:default`` = what a user of :class:`~twell.nn.SparseGatedMLP` gets, ``sparse:always-sparse`` =
the TwELL kernels in every layer).  Attention and everything else are the same modules.

Per variant: median ms over interleaved reps, tokens/ms, speedup, peak memory of one call, energy per
token (board energy over back-to-back calls), and which layers the policy sent to the sparse kernels.
Correctness: the final hidden states vs the dense variant (relative L2 and max-abs relative), and both
against a float32 copy of the model on the first ``--check-seqs`` sequences, so the sparse error can be
read against the dense bf16 error (a sparse error within ``1.5x`` the dense one, or within the bf16
tolerance, is ``ok``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..nn import SparseGatedMLP, prepare_static_weights, static_dispatch
from ..tolerances import MODEL_DENSE_ERROR_FACTOR, within_tolerance
from .model_energy import EnergyMeter
from .model_measure import (
    PROFILE_TOP,
    Timings,
    compile_backend,
    describe_error,
    free_device_memory,
    kernel_lines,
    peak_memory,
    profile_kernels,
    time_compiled_variants,
    time_interleaved,
)
from .model_setup import GRAPHED, BenchModel
from .model_sparsity import measure_layers

__all__ = ["COMPILE_MODES", "ForwardConfig", "run_forward"]

#: ``ForwardConfig.compile_mode`` values: torch.compile modes the compiled forward is timed under.  Under
#: "reduce-overhead" a graph compiled outside ``static_dispatch`` would count as eager for the default policy's floor
#: (session 45), so the variants are traced and called inside it; their compiled calls then follow the tables.
COMPILE_MODES = ("default", "reduce-overhead")


@dataclass(frozen=True)
class ForwardConfig:
    warmup: int = 2
    reps: int = 5
    energy_seconds: float = 3.0
    check_seqs: int = 2
    policies: tuple[str, ...] = ("default", "default+graphs", "always-sparse")
    profile: bool = False  # one more forward per variant under torch.profiler: its largest GPU kernels
    #: also time every variant's backbone under torch.compile (inductor, default mode: the elementwise
    #: work outside the FFN fused, the sparse FFN as its custom ops), one variant after another
    compile: bool = False
    #: the compiled backbone's torch.compile mode (:data:`COMPILE_MODES`): "default", or "reduce-overhead" (inductor's
    #: CUDA graphs; traced and called inside static_dispatch, as the README's recipe for recorded calls says)
    compile_mode: str = "default"
    #: under "reduce-overhead": record inside ``static_dispatch(cached_weights=True)`` after
    #: ``SparseGatedMLP.prepare_static_weights`` on every layer of the set (the split's weight copies read in place)
    cached_weights: bool = False

    def __post_init__(self) -> None:
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}; got {self.compile_mode!r}")
        if self.cached_weights and self.compile_mode != "reduce-overhead":
            raise ValueError("cached_weights applies to recorded calls: it needs compile_mode 'reduce-overhead', got "
                             f"{self.compile_mode!r}")



def _rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.float(), ref.float()
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))


def _max_rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.float(), ref.float()
    return float((o - r).abs().max() / r.abs().max())


def _fp32_reference(bench: BenchModel, ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states of a float32 copy of the backbone with the dense FFN (freed on return)."""
    bench.sets.use("dense")
    ref_model = copy.deepcopy(bench.model.model).float()
    try:
        return ref_model(input_ids=ids, use_cache=False).last_hidden_state
    finally:
        del ref_model
        free_device_memory(bench.device)


def _store_timings(result: dict[str, Any], names: list[str], timings: Timings, n_tokens: int,
                   prefix: str = "") -> None:
    """``<prefix>ms``, ``<prefix>ms_samples``, ``<prefix>tokens_per_ms``, ``<prefix>speedup`` (vs dense) or
    ``<prefix>error`` of each variant."""
    dense_ms = timings.median_ms("dense")
    for name in names:
        entry = result["variants"][name]
        if name in timings.errors:
            entry[f"{prefix}error"] = timings.errors[name]
            continue
        ms = timings.median_ms(name)
        entry.update({f"{prefix}ms": ms, f"{prefix}ms_samples": timings.samples[name],
                      f"{prefix}tokens_per_ms": n_tokens / ms})
        if dense_ms is not None:
            entry[f"{prefix}speedup"] = dense_ms / ms


def _time_compiled(bench: BenchModel, ids: torch.Tensor, runnable: list[str], result: dict[str, Any],
                   cfg: ForwardConfig, log: Callable[[str], None]) -> None:
    """``compiled_ms``, ``compiled_speedup`` (vs the compiled dense backbone) and ``compiled_rel_l2_vs_eager``
    per variant: the backbone under torch.compile (inductor; ``aot_eager`` off CUDA, for tests) in
    ``cfg.compile_mode``.

    Under "reduce-overhead" each sparse set first makes the recipe's warm-up call, one eager forward inside
    ``static_dispatch`` (it chooses the hot units of layers whose eager calls ran dense below the policy's eager floor),
    then every variant is traced and called inside ``static_dispatch``, three untimed calls first (inductor records its
    CUDA graph on the second), and each call's output is cloned (a replay overwrites the last one's): a copy of the
    [tokens, hidden] output in every variant's time alike.  With ``cfg.cached_weights`` each sparse set's layers
    prepare their weight copies after the warm-up (``prepare_static_weights``; ``cached_weights_ready`` per layer) and
    the calls run inside ``static_dispatch(cached_weights=True)``."""
    backbone = bench.model.model
    backend = compile_backend(bench.device)
    recorded = cfg.compile_mode == "reduce-overhead"
    mode = {"mode": cfg.compile_mode} if recorded and backend == "inductor" else {}
    compiled = torch.compile(backbone, backend=backend, **mode)
    names = [n for n in runnable if "error" not in result["variants"][n]]
    result["compile_mode"] = cfg.compile_mode
    log(f"forward: timing {', '.join(names)} compiled ({backend}, mode {cfg.compile_mode}; {cfg.reps} reps, one "
        f"variant after another)")
    if recorded:
        for name in names:
            mlps = [m for m in bench.sets.use(name) if isinstance(m, SparseGatedMLP)]
            if mlps:
                with static_dispatch():
                    backbone(input_ids=ids, use_cache=False)
                if cfg.cached_weights:
                    result["variants"][name]["cached_weights_ready"] = prepare_static_weights(backbone)
    result["cached_weights"] = cfg.cached_weights

    def call(name: str) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            bench.sets.use(name)
            if not recorded:
                return compiled(input_ids=ids, use_cache=False).last_hidden_state
            with static_dispatch(cached_weights=cfg.cached_weights):
                return compiled(input_ids=ids, use_cache=False).last_hidden_state.clone()

        return fn

    timings = time_compiled_variants({n: call(n) for n in names}, bench.device, cfg.reps, warmup=3 if recorded else 1)
    _store_timings(result, names, timings, ids.numel(), prefix="compiled_")
    for name in names:
        entry = result["variants"][name]
        if "compiled_ms" not in entry:
            continue
        bench.sets.use(name)
        eager = backbone(input_ids=ids, use_cache=False).last_hidden_state
        entry["compiled_rel_l2_vs_eager"] = _rel_l2(timings.last[name], eager)
        del eager
    del timings
    torch._dynamo.reset()
    free_device_memory(bench.device)


def run_forward(bench: BenchModel, cfg: ForwardConfig, log: Callable[[str], None],
                update: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run the forward part; ``update(result)`` is called whenever a piece is done (partial results survive)."""
    ids = bench.tokens
    n_tokens = ids.numel()
    device = bench.device
    backbone = bench.model.model
    names = ["dense", *(f"sparse:{p}" for p in cfg.policies)]
    result: dict[str, Any] = {"batch": ids.shape[0], "seq": ids.shape[1], "tokens": n_tokens,
                              "variants": {n: {} for n in names}}

    def call(name: str) -> Callable[[], None]:
        def fn() -> None:
            bench.sets.use(name)
            backbone(input_ids=ids, use_cache=False)

        return fn

    with torch.inference_mode():
        log(f"forward: per-layer sparsity of the benchmark batch ({n_tokens} tokens)")
        result["layers"] = measure_layers(bench.model, bench.sets.use("dense"), ids)
        update(result)

        log("forward: outputs of each variant vs dense and vs a float32 copy")
        dense_out = backbone(input_ids=ids, use_cache=False).last_hidden_state
        k = min(cfg.check_seqs, ids.shape[0])
        ref = None
        if k > 0:
            try:
                ref = _fp32_reference(bench, ids[:k])
                result["variants"]["dense"]["rel_err_vs_fp32"] = _rel_l2(dense_out[:k], ref)
            except Exception as exc:  # noqa: BLE001 - the check is optional; the timing goes on
                result["fp32_reference_error"] = describe_error(exc)
        for name in names[1:]:
            entry = result["variants"][name]
            try:
                bench.sets.use(name)
                backbone(input_ids=ids, use_cache=False)  # first call measures l0 (dense path) per layer
                if name.endswith(GRAPHED):  # the count's first call (dense), then the recording: the check replays
                    for _ in range(2):
                        backbone(input_ids=ids, use_cache=False)
                out = backbone(input_ids=ids, use_cache=False).last_hidden_state
                entry["rel_l2_vs_dense"] = _rel_l2(out, dense_out)
                entry["max_rel_vs_dense"] = _max_rel(out, dense_out)
                if ref is not None:
                    err = _rel_l2(out[:k], ref)
                    entry["rel_err_vs_fp32"] = err
                    dense_err = result["variants"]["dense"]["rel_err_vs_fp32"]
                    entry["ok"] = within_tolerance(err, bench.dtype, dense_err, MODEL_DENSE_ERROR_FACTOR)
                mlps = bench.sets.sets[name]
                entry["sparse_layers"] = [
                    i for i, m in enumerate(mlps)
                    if isinstance(m, SparseGatedMLP) and m._use_sparse(n_tokens, device.type, eager=True)
                ]
                if name.endswith(GRAPHED):
                    entry["recorded_layers"] = [i for i, m in enumerate(mlps) if n_tokens in m._graphs.calls]
                del out
            except Exception as exc:  # noqa: BLE001 - recorded; the variant is then skipped
                entry["error"] = describe_error(exc)
                free_device_memory(device)
        del dense_out, ref
        free_device_memory(device)
        update(result)

        runnable = [n for n in names if "error" not in result["variants"][n]]
        log(f"forward: timing {', '.join(runnable)} ({cfg.warmup} warm-up + {cfg.reps} interleaved reps)")
        timings = time_interleaved({n: call(n) for n in runnable}, device=device, warmup=cfg.warmup, reps=cfg.reps)
        _store_timings(result, runnable, timings, n_tokens)
        update(result)

        if cfg.compile:
            _time_compiled(bench, ids, runnable, result, cfg, log)
            update(result)

        if cfg.profile and device.type == "cuda":
            # Where the time goes, attention included: the dense model's non-FFN time at 1.5B, 64 x 2048
            # tokens (~650 of 1040 ms) is ~2x its FLOP count.
            for name in runnable:
                entry = result["variants"][name]
                if "error" not in entry:
                    entry["profile"] = profile_kernels(call(name), device, PROFILE_TOP)
                    log(f"forward: {name}: kernels of one forward (ms, calls):\n" + kernel_lines(entry["profile"]))
            update(result)

        meter = EnergyMeter(device)
        result["energy_method"] = meter.method or f"unavailable ({meter.reason})"
        for name in runnable:
            entry = result["variants"][name]
            if "error" in entry:
                continue
            try:
                entry["memory"] = peak_memory(call(name), device)
                if meter.method is not None and cfg.energy_seconds > 0:
                    energy = meter.measure(call(name), min_seconds=cfg.energy_seconds)
                    energy["mJ_per_token"] = energy["joules"] * 1e3 / (energy["calls"] * n_tokens)
                    entry["energy"] = energy
            except Exception as exc:  # noqa: BLE001 - timing stands; memory/energy marked failed
                entry["memory_energy_error"] = describe_error(exc)
                free_device_memory(device)
            update(result)
        for name in names[1:]:
            entry = result["variants"][name]
            entry["layer_l0_sparse_path"] = [
                None if getattr(m, "last_l0", None) is None else float(m.last_l0) for m in bench.sets.sets[name]
            ]
            # each layer's hot set and the dense-row budget it gives a call of this size (None: no hot set chosen):
            # what decides the row kernel's tail (session 46, bench_results/h100/session46_runs.md)
            caches = [m._hot_cold.set_for(n_tokens, fallback=False) if isinstance(m, SparseGatedMLP) else None
                      for m in bench.sets.sets[name]]
            entry["layer_hot_units"] = [None if c is None else c.n_hot for c in caches]
            entry["layer_dense_rows"] = [None if c is None else c.dense_rows(n_tokens) for c in caches]
    return result


def forward_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat CSV/table rows of a forward result."""
    rows = []
    layers = result.get("layers") or []
    l0 = sum(r["l0_mean"] for r in layers) / len(layers) if layers else None
    for name, v in result.get("variants", {}).items():
        mem = v.get("memory") or {}
        energy = v.get("energy") or {}
        rows.append({
            "part": "forward", "variant": name, "batch": result.get("batch"), "tokens": result.get("tokens"),
            "ms": v.get("ms"), "tokens_per_ms": v.get("tokens_per_ms"), "speedup": v.get("speedup"),
            "peak_gb": mem.get("peak_gb"), "mJ_per_token": energy.get("mJ_per_token"), "l0_mean": l0,
            "sparse_layers": None if "sparse_layers" not in v else len(v["sparse_layers"]),
            "recorded_layers": None if "recorded_layers" not in v else len(v["recorded_layers"]),
            "rel_err_vs_fp32": v.get("rel_err_vs_fp32"), "rel_l2_vs_dense": v.get("rel_l2_vs_dense"),
            "max_rel_vs_dense": v.get("max_rel_vs_dense"),
            "compiled_ms": v.get("compiled_ms"), "compiled_speedup": v.get("compiled_speedup"),
            "ok": v.get("ok"), "error": (v.get("error") or "").split("\n")[0] or None,
        })
    return rows
