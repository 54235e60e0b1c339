"""GPU time of the small-batch (decode) FFN kernels against the dense F.linear chain, without host overhead.

Per point (d, F, M tokens, density %) on the synthetic problem of ``twell bench ffn``: each callable is
captured in a CUDA graph (after a warm-up on a side stream) and the graph replayed between CUDA events,
so the times are GPU time only.  The graph cycles over copies of the weights (at least ~200 MB in all,
4x the H200's L2) so that each call reads its weights from DRAM as a decode step does (the other layers
evict them).  Columns: dense chain, hidden kernel alone, down kernel alone (Wd^T as the ``.t()`` view that
decode_gated_ffn passes, and as a contiguous unit-major copy), the whole op (what decode_gated_ffn
dispatches to: the one-pass kernel at one token), the dense/op ratio; the gate through cuBLAS; the one-pass
kernel (1-8 tokens; also with x = 0, when nothing fires: its gate pass and an empty column sum); then eager
times (twell.bench.timing.time_ms, host overhead included) of the dense chain and the op and their ratio;
the union of firing units; the op's error against an fp32 reference (Frobenius relative, and max |err| /
max |ref|).  Usage:

    PYTHONPATH=src python3 scripts/decode_probe.py                      # GPU machine
    TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/decode_probe.py --device cpu --tiny   # smoke test
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from twell.bench.timing import time_ms
from twell.ops import decode_kernels
from twell.ops.decode import decode_gated_ffn
from twell.ops.decode_batch_kernels import (
    BATCH_MAX_TOKENS,
    launch_batch_down,
    launch_batch_ffn,
    launch_batch_up,
)
from twell.ops.decode_kernels import launch_decode_down, launch_decode_hidden
from twell.ops.decode_onepass_kernel import (
    ONEPASS_MAX_TOKENS,
    launch_column_sum,
    launch_decode_onepass,
    launch_onepass_partials,
)
from twell.reference import inference as ref
from twell.synthetic import SparsityProfile, synthetic_ffn_problem
from twell.tolerances import rel_error

FLUSH_BYTES = 200 * 2**20  # weights cycled per graph: ~4x an H200's 50 MB L2


def dense(x, wg, wu, wd):  # noqa: ANN001, ANN201 - a script
    return F.linear(torch.relu(F.linear(x, wg)) * F.linear(x, wu), wd)


def graph_ms(fns, reps: int) -> float:  # noqa: ANN001 - a script
    """GPU ms per call of the callables ``fns`` (run in turn), captured once in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (reps * len(fns))


def eager_ms(fns, device: torch.device, rep_ms: float) -> float:  # noqa: ANN001 - a script
    return time_ms(lambda: [fn() for fn in fns], device=device, rep_ms=rep_ms) / len(fns)


def probe(d: int, f: int, m: int, dens: float, args: argparse.Namespace) -> str:
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(1000 * m + f)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=dens / 100 * f), generator=gen, device=device)
    x = p["x"]
    w = (p["w_gate"], p["w_up"], p["w_down"])
    n_sets = max(1, min(16, math.ceil(FLUSH_BYTES / sum(t.numel() * t.element_size() for t in w))))
    if device.type != "cuda":
        n_sets = 1
    sets = [w] + [tuple(t.clone() for t in w) for _ in range(n_sets - 1)]
    # per set: (wg, wu, wd, Wd^T unit-major copy, h, fires) with h and fires from the hidden kernel
    sets = [(*s, s[2].t().contiguous(), *launch_decode_hidden(x, s[0], s[1], match=True)[:2]) for s in sets]
    fns = {
        "dense": [lambda s=s: dense(x, *s[:3]) for s in sets],
        "hidden": [lambda s=s: launch_decode_hidden(x, s[0], s[1], match=True) for s in sets],
        "down": [lambda s=s: launch_decode_down(s[4], s[5], s[2].t(), x.dtype) for s in sets],
        "down_um": [lambda s=s: launch_decode_down(s[4], s[5], s[3], x.dtype) for s in sets],
        "op": [lambda s=s: decode_gated_ffn(x, *s[:3], backend="triton") for s in sets],
        # the gate through cuBLAS, the hidden kernel reading g (decode_kernels.GATE_BY_GEMM)
        "gate_gemm": [lambda s=s: torch.nn.functional.linear(x, s[0]) for s in sets],
        "hidden_g": [lambda s=s: launch_decode_hidden(x, s[0], s[1], match=True, gate_by_gemm=True) for s in sets],
        "op_g": [lambda s=s: launch_decode_down(*launch_decode_hidden(x, s[0], s[1], match=True, gate_by_gemm=True)[:2],
                                                s[2].t(), x.dtype) for s in sets],
    }
    if m <= BATCH_MAX_TOKENS:  # cuBLAS gate, up kernel writing h^T, down split over unit ranges, partial sum
        g0 = F.linear(x, w[0])
        up0 = launch_batch_up(x, g0, w[1], match=True)
        fns["batch"] = [lambda s=s: launch_batch_ffn(x, s[0], s[1], s[3], match=True) for s in sets]
        fns["batch_view"] = [lambda s=s: launch_batch_ffn(x, s[0], s[1], s[2].t(), match=True) for s in sets]
        fns["batch_up"] = [lambda s=s: launch_batch_up(x, g0, s[1], match=True) for s in sets]
        fns["batch_down"] = [lambda s=s: launch_batch_down(up0[0], up0[1], s[3], x.dtype) for s in sets]
    if m <= ONEPASS_MAX_TOKENS:  # gate, up and down in one kernel + a column sum (decode_onepass_kernel)
        # with the unit-major Wd^T that SparseGatedMLP passes (one token: the firing units row by row)
        fns["op_1p"] = [lambda s=s: launch_decode_onepass(x, s[0], s[1], s[3], match=True) for s in sets]
        # the [BU, BK] tile path for the firing blocks (the Wd^T view: what one token took before session 7)
        fns["op_1p_tiles"] = [lambda s=s: launch_decode_onepass(x, s[0], s[1], s[2].t(), match=True) for s in sets]
        # x = 0: no unit fires, so this is the gate's matrix-vector pass and a column sum that reads no row
        x0 = torch.zeros_like(x)
        fns["op_1p_idle"] = [lambda s=s: launch_decode_onepass(x0, s[0], s[1], s[3], match=True) for s in sets]
        # its two launches alone: the one-pass kernel, and the column sum over this problem's partials
        fns["1p_partials"] = [lambda s=s: launch_onepass_partials(x, s[0], s[1], s[3], match=True) for s in sets]
        parts = launch_onepass_partials(x, *w[:2], sets[0][3], match=True)[:2]
        fns["1p_colsum"] = [lambda: launch_column_sum(*parts, x.dtype)]
    if device.type == "cuda":
        ms = {k: graph_ms(v * max(1, 16 // n_sets), args.reps) for k, v in fns.items()}
    else:
        ms = {k: eager_ms(v, device, args.rep_ms) for k, v in fns.items()}
    eager = {k: eager_ms(fns[k], device, args.rep_ms) for k in ("dense", "op")}

    out = decode_gated_ffn(x, *w, backend="triton")
    want = ref.dense_gated_ffn(x.float(), *(t.float() for t in w))
    rel = rel_error(out, want)
    maxrel = float((out.float() - want).abs().max() / want.abs().max().clamp_min(1e-30))
    union = int((sets[0][5] != 0).sum())
    again = torch.equal(decode_gated_ffn(x, *w, backend="triton"), out)
    timing = "graph" if device.type == "cuda" else "eager"
    return (f"d={d:5d} F={f:6d} M={m:3d} dens={dens:4.1f}% | {timing} ms: dense {ms['dense']:.4f} "
            f"hidden {ms['hidden']:.4f} down {ms['down']:.4f} down_um {ms['down_um']:.4f} op {ms['op']:.4f} "
            f"dense/op {ms['dense'] / ms['op']:.2f} | cuBLAS gate: gate {ms['gate_gemm']:.4f} hidden+gate "
            f"{ms['hidden_g']:.4f} op {ms['op_g']:.4f} dense/op {ms['dense'] / ms['op_g']:.2f} | "
            + (f"one pass: op {ms['op_1p']:.4f} (nothing firing {ms['op_1p_idle']:.4f}; one-pass kernel "
               f"{ms['1p_partials']:.4f}, column sum {ms['1p_colsum']:.4f}; tile path {ms['op_1p_tiles']:.4f}) "
               f"dense/op {ms['dense'] / ms['op_1p']:.2f} rel "
               f"{rel_error(launch_decode_onepass(x, *w[:2], sets[0][3], match=True)[0], want):.2e} | "
               if "op_1p" in ms else "")
            + (f"batch kernels: op {ms['batch']:.4f} (Wd^T view {ms['batch_view']:.4f}; up {ms['batch_up']:.4f}, "
               f"down {ms['batch_down']:.4f}) dense/op {ms['dense'] / ms['batch']:.2f} rel "
               f"{rel_error(launch_batch_ffn(x, *w[:2], sets[0][3], match=True)[0], want):.2e} | "
               if "batch" in ms else "")
            + f"eager ms: dense {eager['dense']:.4f} op {eager['op']:.4f} "
            f"dense/op {eager['dense'] / eager['op']:.2f} | union {union} | rel {rel:.2e} maxrel {maxrel:.2e} "
            f"reproducible {again} sets {n_sets}")


#: ``--hidden-variants``: hidden-kernel K-loop configurations (BK, stages, warps, fused up) timed per token-count class.
HIDDEN_VARIANTS = {
    "small": [(512, 3, 4, False), (128, 3, 4, False), (256, 3, 4, False), (512, 3, 4, True), (256, 3, 4, True),
              (128, 3, 4, True)],
    "large": [(128, 3, 4, False), (64, 4, 4, False), (128, 3, 4, True), (64, 4, 4, True)],
}


def _config_sweep(module: object, attr: str, configs: list[tuple], d: int, f: int, m: int, seed: int,
                  args: argparse.Namespace, launch: Callable[..., object], op: Callable[..., torch.Tensor],
                  clear: Callable[[], None] | None = None) -> tuple[torch.Tensor, list[str]]:
    """Graph-timed ``launch(x, wg, wu, wd)`` (eager on the CPU) with ``module.<attr>`` set to each of
    ``configs`` in turn (its ``_meta`` cache cleared, or ``clear()`` called), at 0.5 % density, and
    ``op(x, wg, wu, wd)``'s error against the fp32 dense FFN; a configuration that fails is reported and the
    sweep goes on.  The module's configuration is restored afterwards.  ``(x, one "cfg: ms rel" entry per
    configuration)``."""
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(seed)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=0.005 * f), generator=gen, device=device)
    x, w = p["x"], (p["w_gate"], p["w_up"], p["w_down"])
    n_sets = max(1, min(16, math.ceil(FLUSH_BYTES / sum(t.numel() * t.element_size() for t in w))))
    sets = [w] + [tuple(t.clone() for t in w) for _ in range(n_sets - 1)] if device.type == "cuda" else [w]
    want = ref.dense_gated_ffn(x.float(), *(t.float() for t in w))
    default = getattr(module, attr)
    parts = []
    try:
        for cfg in configs:
            setattr(module, attr, cfg)
            (clear or module._meta.cache_clear)()  # type: ignore[attr-defined]
            fns = [lambda s=s: launch(x, *s) for s in sets]
            try:
                ms = graph_ms(fns * max(1, 16 // len(sets)), args.reps) if device.type == "cuda" else eager_ms(
                    fns, device, args.rep_ms)
                parts.append(f"{cfg}: {ms:.4f} ms rel {rel_error(op(x, *w), want):.1e}")
            except Exception as exc:  # noqa: BLE001 - a configuration that does not build: report, go on
                parts.append(f"{cfg}: FAILED {type(exc).__name__}: {str(exc)[:80]}")
    finally:
        setattr(module, attr, default)
        (clear or module._meta.cache_clear)()  # type: ignore[attr-defined]
    return x, parts


def hidden_variants(d: int, f: int, m: int, args: argparse.Namespace) -> str:
    """Graph-timed hidden kernel per K-loop configuration at 0.5 % density, and the whole op's error with it."""
    attr = "_HIDDEN_SMALL_M" if m <= 16 else "_HIDDEN_LARGE_M"
    default = getattr(decode_kernels, attr)
    x, parts = _config_sweep(decode_kernels, attr, HIDDEN_VARIANTS["small" if m <= 16 else "large"], d, f, m,
                             7 * m + f, args, lambda x, wg, wu, wd: launch_decode_hidden(x, wg, wu, match=True),
                             lambda x, wg, wu, wd: decode_gated_ffn(x, wg, wu, wd, backend="triton"))
    wg_mb = f * d * x.element_size() / 2**20
    return f"hidden d={d} F={f} M={m} (Wg {wg_mb:.0f} MiB) default {default} | " + " | ".join(parts)


#: ``--onepass-variants``: configurations ``(BK, warps, column-sum BD, BP, warps, unrolled gate, up/down
#: chunks at once)`` of the one-pass kernel (twell.ops.decode_onepass_kernel._ONEPASS_CONFIG).
ONEPASS_VARIANTS = [(1024, 8, 16, 1024, 4, False, 1), (512, 8, 16, 1024, 4, False, 1), (256, 8, 16, 1024, 4, False, 1),
                    (512, 4, 16, 1024, 4, False, 1), (256, 4, 16, 1024, 4, False, 1), (512, 8, 16, 1024, 4, True, 1),
                    (1024, 16, 16, 1024, 4, False, 2), (2048, 8, 16, 1024, 4, False, 1)]


def onepass_registers(d: int, f: int, m: int) -> str:
    """ptxas's registers and spill bytes per ONEPASS_VARIANTS configuration (sm_90a, no GPU needed), and
    the programs an H200 SM then holds (65,536 registers, 64 warps): the kernel's gate pass is bound by
    how many of its loads are in flight."""
    from triton.backends.compiler import GPUTarget

    from twell.ops import compile_check, decode_onepass_kernel

    default = decode_onepass_kernel._ONEPASS_CONFIG
    parts = []
    try:
        for cfg in ONEPASS_VARIANTS:
            decode_onepass_kernel._ONEPASS_CONFIG = cfg
            decode_onepass_kernel._meta.cache_clear()
            kernel, warps, n_blocks = compile_check.onepass_kernel(m, d, f, GPUTarget("cuda", 90, 32))
            use = compile_check._usage(kernel.asm["ptx"], 90)
            regs = (use["registers"] + 7) // 8 * 8
            per_sm = min(65536 // (regs * 32 * warps), 64 // warps)
            parts.append(f"{cfg}: {use['registers']} regs, spill {use['spill_bytes']} B, {per_sm} programs/SM "
                         f"({n_blocks} programs)")
    finally:
        decode_onepass_kernel._ONEPASS_CONFIG = default
        decode_onepass_kernel._meta.cache_clear()
    return f"onepass registers d={d} F={f} M={m} | " + " | ".join(parts)


def onepass_variants(d: int, f: int, m: int, args: argparse.Namespace) -> str:
    """Graph-timed one-pass op (both launches) per configuration at 0.5 % density, with its error."""
    from twell.ops import decode_onepass_kernel

    def onepass(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
        return launch_decode_onepass(x, wg, wu, wd.t(), match=True)[0]

    default = decode_onepass_kernel._ONEPASS_CONFIG
    _, parts = _config_sweep(decode_onepass_kernel, "_ONEPASS_CONFIG", ONEPASS_VARIANTS, d, f, m, 13 * m + f, args,
                             onepass, onepass)
    return f"onepass d={d} F={f} M={m} default {default} | " + " | ".join(parts)


#: ``--batch-variants``: (module attribute, values) of twell.ops.decode_batch_kernels, each timed alone
#: (the others at their defaults) through the whole batch op.  Session 33's calls 1, 2 and 5 also swept
#: _DOWN_CONFIG, _UP_CONFIG and _SUM_BLOCK (decode_probe_*_call{1,2,5}_session33.log).
BATCH_VARIANTS = [
    ("PDL", [True, False]),
    ("PDL_EARLY", [False, True]),
    ("_MAX_PARTIAL_BYTES", [4 * 2**20, 1 * 2**20, 2**19]),
]


def batch_variants(d: int, f: int, m: int, args: argparse.Namespace) -> str:
    """Graph-timed batch op per configuration of BATCH_VARIANTS at 0.5 % density, with its error."""
    from twell.ops import decode_batch_kernels as dbk

    def op(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
        return launch_batch_ffn(x, wg, wu, wd.t(), match=True)[0]

    def clear() -> None:
        dbk.down_split.cache_clear()

    out = []
    for attr, values in BATCH_VARIANTS:
        _, parts = _config_sweep(dbk, attr, values, d, f, m, 17 * m + f, args, op, op, clear)
        out.append(f"{attr}: " + " | ".join(parts))
    return f"batch d={d} F={f} M={m} || " + " || ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small shapes (CPU interpreter smoke test)")
    ap.add_argument("--reps", type=int, default=50, help="graph replays per point")
    ap.add_argument("--rep-ms", type=float, default=100.0, help="eager timing budget per callable")
    ap.add_argument("--hidden-variants", action="store_true",
                    help="also time the hidden kernel's K-loop configurations (HIDDEN_VARIANTS)")
    ap.add_argument("--onepass-variants", action="store_true",
                    help="also time the one-pass kernel's configurations (ONEPASS_VARIANTS), 1-8 tokens")
    ap.add_argument("--batch-variants", action="store_true",
                    help="also time the batch kernels' configurations (BATCH_VARIANTS) at the token counts")
    ap.add_argument("--variant-ms", default="8,64", help="token counts of --batch-variants")
    ap.add_argument("--registers", action="store_true",
                    help="only print ptxas's registers per one-pass configuration (no GPU needed), then exit")
    ap.add_argument("--ms", default="1,8,64", help="token counts, comma-separated")
    args = ap.parse_args()
    shapes, dens_ = [(2048, 5632), (4096, 14336)], (0.5, 2.0)
    ms_ = tuple(int(v) for v in args.ms.split(","))
    if args.tiny:
        shapes, ms_, dens_, args.rep_ms = [(64, 1100)], (1, 8), (0.5, 2.0), 1.0
    if args.registers:
        for d, f in shapes:
            for m in (mm for mm in ms_ if mm <= ONEPASS_MAX_TOKENS):
                print(onepass_registers(d, f, m), flush=True)
        return
    if torch.cuda.is_available() and args.device == "cuda":
        print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for d, f in shapes:
        for m in ms_:
            for dens in dens_:
                try:
                    print(probe(d, f, m, dens, args), flush=True)
                except Exception as exc:  # noqa: BLE001 - report every point, keep going
                    print(f"d={d} F={f} M={m} dens={dens}%: FAILED {type(exc).__name__}: {exc}", flush=True)
    if args.onepass_variants:
        for d, f in shapes:
            for m in (mm for mm in ms_ if mm <= ONEPASS_MAX_TOKENS):
                try:
                    print(onepass_variants(d, f, m, args), flush=True)
                except Exception as exc:  # noqa: BLE001 - report every point, keep going
                    print(f"onepass d={d} F={f} M={m}: FAILED {type(exc).__name__}: {exc}", flush=True)
    if args.batch_variants:
        for d, f in shapes:
            for m in (int(v) for v in args.variant_ms.split(",")):
                try:
                    print(batch_variants(d, f, m, args), flush=True)
                except Exception as exc:  # noqa: BLE001 - report every point, keep going
                    print(f"batch d={d} F={f} M={m}: FAILED {type(exc).__name__}: {exc}", flush=True)
    if args.hidden_variants:
        for d, f in shapes:
            for m in ms_:
                try:
                    print(hidden_variants(d, f, m, args), flush=True)
                except Exception as exc:  # noqa: BLE001 - report every point, keep going
                    print(f"hidden d={d} F={f} M={m}: FAILED {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
