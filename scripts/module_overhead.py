"""Per-call cost of ``SparseGatedMLP`` against the plain dense FFN: where the module's extra time goes.

At small token counts an FFN call is bound by the host: the GPU finishes a [1, 2048] x [2048, 5632]
GEMM faster than Python and the dispatcher can issue the next one, so every microsecond of Python
the module spends per call is a microsecond per layer per decode step.  This script times, per call:

* the plain dense chain ``F.linear(F.relu(F.linear(x, Wg)) * F.linear(x, Wu), Wd)``;
* ``SparseGatedMLP`` (eval, ``torch.no_grad`` and ``torch.inference_mode``) on its dense path
  (``DispatchPolicy.always_dense()``) and on its sparse paths (``DispatchPolicy.always_sparse()``,
  hot/cold and plain);
* the registered custom ops and the Python ops they wrap, called directly;

then a breakdown of the module's extra time: a cProfile of the module calls and micro-timers of the
pieces (input check, dispatch decision, attribute access, caches, the l0 reduction).

On the CPU the tensors are tiny (d=64, F=256), so the times are host overhead; the Triton backend
runs with its kernel launches replaced by no-ops (``TRITON_INTERPRET=1`` lets the Triton path run on
CPU tensors; the stubs make it return at once), so the sparse rows measure exactly the Python and
PyTorch host work around the kernels.  On CUDA (``--device cuda``) the shapes are the benchmark's
(d=2048, F=5632, bf16) with real kernels, and two times are given: ``wall`` = host time per call of
many calls issued back to back with one synchronisation (what a decode loop sees) and ``event`` =
``twell.bench.timing.time_ms`` (CUDA events, the method of ``twell bench ffn``).

Usage: ``python scripts/module_overhead.py [--device cpu|cuda] [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import types
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    # Before any twell kernel module is imported: @triton.jit reads it when it decorates.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from twell import ops  # noqa: E402 - after the environment variable
from twell.format.twell import default_capacity  # noqa: E402
from twell.nn import DispatchPolicy, SparseGatedMLP  # noqa: E402
from twell.ops.decode import launch_decode_ffn  # noqa: E402
from twell.synthetic import SparsityProfile, synthetic_ffn_problem  # noqa: E402

Fn = Callable[[], object]


# ---------------------------------------------------------------------------------------- timing
def per_call_us(fn: Fn, device: torch.device, *, calls: int, rounds: int) -> float:
    """Best over ``rounds`` of the mean wall time of ``calls`` back-to-back calls (one sync at the end), in us."""
    for _ in range(max(8, calls // 10)):  # warm-up: caches, allocator, autotuning
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def event_ms(fn: Fn, device: torch.device) -> float | None:
    """The benchmark's device time (CUDA events, L2 flushed), or None on the CPU."""
    if device.type != "cuda":
        return None
    from twell.bench.timing import time_ms

    return time_ms(fn, device=device)


# ---------------------------------------------------------------------------------------- CPU kernel stubs
class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](*args)`` does nothing."""

    def __getitem__(self, grid: object) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def twell_ops_modules() -> list[types.ModuleType]:
    """Every module of the ``twell.ops`` package, imported."""
    import importlib
    import pkgutil

    import twell.ops

    return [importlib.import_module(info.name) for info in pkgutil.iter_modules(twell.ops.__path__,
                                                                                 prefix="twell.ops.")]


def stub_triton_kernels() -> list[str]:
    """Replace every Triton kernel object of the ``twell.ops`` modules by a no-op launcher; return their names.

    All modules are imported first and all of them patched, since kernels call ``@triton.jit``
    helpers of other modules (a kernel left real would run into a stubbed helper).
    """
    from triton.runtime.jit import KernelInterface

    names = []
    for mod in twell_ops_modules():
        for name, value in list(vars(mod).items()):
            if isinstance(value, KernelInterface):
                setattr(mod, name, _NoLaunch())
                names.append(f"{mod.__name__}.{name}")
    return names


# ---------------------------------------------------------------------------------------- the cases
def make_problem(d: int, f: int, m_max: int, dtype: torch.dtype, device: torch.device, *,
                 n_always_on: int = 0) -> dict[str, torch.Tensor]:
    """Synthetic FFN inputs with a realistic sparse gate (0.5 % density, the issue's operating point).

    ``n_always_on`` units are made to fire on (nearly) every token, through the generator's bias
    channel ``x[:, 0] = 1``, so that the hot/cold split has hot units even at M = 1 (the layer rounds
    the hot count down to a multiple of 64).
    """
    gen = torch.Generator(device=device).manual_seed(0)
    p = synthetic_ffn_problem(m_max, d, f, SparsityProfile(mean_l0=max(1.0, 0.005 * f)), generator=gen,
                              dtype=dtype, device=device)
    p["w_gate"][:n_always_on, 0] = 4.0
    return p


def layer_for(p: dict[str, torch.Tensor], policy: DispatchPolicy, **kwargs: object) -> SparseGatedMLP:
    return SparseGatedMLP.from_weights(p["w_gate"], p["w_up"], p["w_down"], policy=policy, **kwargs).eval()


def cases(p: dict[str, torch.Tensor], x: torch.Tensor, backend: str, tile: int) -> list[tuple[str, Fn]]:
    """(label, zero-argument callable) for one token count; the layers are built once per call of this."""
    wg, wu, wd = p["w_gate"], p["w_up"], p["w_down"]
    wd_t = wd.t().contiguous().t()  # unit-major, as the module keeps it
    kw = {"backend": backend, "tile": tile}
    dense = layer_for(p, DispatchPolicy.always_dense(), **kw)
    baseline = dense.to_dense().eval()  # the dense MLP of `twell bench model`'s dense model
    default = layer_for(p, DispatchPolicy(), **kw)
    hot = layer_for(p, DispatchPolicy.always_sparse(), hot_cold=True, **kw)
    plain = layer_for(p, DispatchPolicy.always_sparse(), hot_cold=False, **kw)
    # the small-batch kernels (twell.ops.decode) for every call of up to 64 tokens, any shape or device
    decode = layer_for(p, DispatchPolicy(table=(), decode_max_tokens=ops.DECODE_MAX_TOKENS, force=True), **kw)
    plan = ops.build_hot_cold_plan(wg, wu, wd, ops.choose_hot_units(ops.unit_frequency(x, wg), multiple=16))
    hc_args = (x, wg, wu, wd_t, plan.hot, plan.cold, plan.w_gemm, plan.w_down_hot_t, tile, 0, backend)
    sp_args = (x, wg, wu, wd_t, tile, 0, "match", "auto", backend)
    unchecked = []
    if hasattr(torch.ops.twell, "hot_cold_gated_ffn_unchecked"):  # versions of twell that have them
        wdt = wd.t().contiguous()
        cap = default_capacity(tile)
        unchecked = [
            ("op twell::hot_cold_gated_ffn_unchecked", lambda: torch.ops.twell.hot_cold_gated_ffn_unchecked(
                x, wg, wu, wdt, plan.hot, plan.cold, plan.w_gemm, plan.w_down_hot_t, tile, cap, backend)),
            ("op twell::sparse_gated_ffn_unchecked", lambda: torch.ops.twell.sparse_gated_ffn_unchecked(
                x, wg, wu, wdt, tile, cap, "match", backend)),
        ]
    return [
        ("plain dense chain", lambda: F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd)),
        ("DenseReluGatedMLP (model baseline)", lambda: baseline(x)),
        ("module, dense path", lambda: dense(x)),
        ("module, default policy", lambda: default(x)),
        ("module, sparse hot/cold", lambda: hot(x)),
        ("module, sparse plain", lambda: plain(x)),
        *([("module, decode kernels", lambda: decode(x)),
           ("op twell::decode_gated_ffn_unchecked", lambda: torch.ops.twell.decode_gated_ffn_unchecked(
               x, wg, wu, wd.t(), "match", backend)),
           ("launch_decode_ffn (Python)", lambda: launch_decode_ffn(x, wg, wu, wd.t()))]
          if x.shape[0] <= ops.DECODE_MAX_TOKENS else []),
        ("op twell::hot_cold_gated_ffn", lambda: torch.ops.twell.hot_cold_gated_ffn(*hc_args)),
        ("ops.hot_cold_gated_ffn (Python)",
         lambda: ops.hot_cold_gated_ffn(x, wg, wu, wd_t, plan, tile=tile, backend=backend, return_counts=True)),
        ("op twell::sparse_gated_ffn", lambda: torch.ops.twell.sparse_gated_ffn(*sp_args)),
        ("ops.sparse_gated_ffn (Python)",
         lambda: ops.sparse_gated_ffn(x, wg, wu, wd_t, tile=tile, backend=backend, return_counts=True)),
        *unchecked,
    ]


MODES: dict[str, Callable[[], AbstractContextManager]] = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


def main_table(p: dict[str, torch.Tensor], ms: tuple[int, ...], device: torch.device, backend: str, tile: int,
               calls: int, rounds: int) -> None:
    print("\n## per-call time (us); the module's extra over the plain chain in brackets")
    head = f"{'case':34s} {'M':>6s}" + "".join(f" {m:>22s}" for m in MODES)
    if device.type == "cuda":
        head += f" {'event ms (no_grad)':>19s}"
    print(head)
    for m in ms:
        x = p["x"][:m].contiguous()
        rows = cases(p, x, backend, tile)
        base: dict[str, float] = {}
        for label, fn in rows:
            line = f"{label:34s} {m:6d}"
            for mode, ctx in MODES.items():
                with ctx():
                    us = per_call_us(fn, device, calls=calls, rounds=rounds)
                if label == "plain dense chain":
                    base[mode] = us
                    line += f" {us:22.2f}"
                else:
                    line += f" {us:13.2f} ({us - base[mode]:+7.2f})"
            if device.type == "cuda":
                with torch.no_grad():
                    line += f" {event_ms(fn, device):19.4f}"
            print(line, flush=True)


# ---------------------------------------------------------------------------------------- breakdown
def profile_calls(fn: Fn, n: int, top: int) -> None:
    """cProfile of ``n`` calls: the functions with the most own time, in us per call (profiler overhead included)."""
    fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
    for (path, line, name), (_cc, ncalls, tottime, _cum, _callers) in rows:
        where = f"{os.path.basename(path)}:{line}" if path != "~" else "(builtin)"
        print(f"    {tottime / n * 1e6:7.2f} us  {ncalls / n:5.1f}x  {name}  [{where}]")


def components(p: dict[str, torch.Tensor], x: torch.Tensor, backend: str, tile: int) -> list[tuple[str, Fn]]:
    """Micro-timers of the pieces of the module's inference path (only those this version of twell has)."""
    from twell.nn import mlp as mlp_mod

    layer = layer_for(p, DispatchPolicy.always_sparse(), backend=backend, tile=tile)
    with torch.no_grad():
        layer(x)  # builds the caches
    w = layer.gate_proj.weight
    m, dev_type = x.shape[0], x.device.type
    shape = (layer.hidden_size, layer.intermediate_size)
    counts = torch.ones(m, 4, dtype=torch.int32, device=x.device)
    out: list[tuple[str, Fn]] = [
        ("nn.Module.__call__ of an empty forward", _empty_module_call()),
        ("_check_input(x)", lambda: mlp_mod._check_input(x, layer.hidden_size, w)),
        ("layer._use_sparse(m, device type)", lambda: layer._use_sparse(m, dev_type)),
        ("policy.use_sparse(...)", lambda: layer.policy.use_sparse(m, 0.01, device_type=dev_type, shape=shape)),
        ("x.device.type", lambda: x.device.type),
        ("layer.gate_proj.weight (Module.__getattr__ x2)", lambda: layer.gate_proj.weight),
        ("Module.__setattr__ of an int", lambda: setattr(layer, "_overhead_probe", 1)),
        ("x.reshape(-1, d)", lambda: x.reshape(-1, layer.hidden_size)),
        ("weight.detach()", lambda: w.detach()),
        ("layer.w_down_unit_major()", layer.w_down_unit_major),
        ("l0 of counts: sum int64 -> f64 / m -> f32",
         lambda: (counts.sum(dtype=torch.int64).to(torch.float64) / m).to(torch.float32)),
        ("l0 of counts: sum f32, div_ m", lambda: counts.sum(dtype=torch.float32).div_(m)),
    ]
    cache = getattr(layer, "_hot_cold", None)
    if cache is not None and cache.chosen:
        wu, wd = layer.up_proj.weight, layer.down_proj.weight
        out.append(("HotColdCache.plan(...) (cached)", lambda: cache.plan(w, wu, wd)))
    return out


def _empty_module_call() -> Fn:
    class Empty(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    mod = Empty()
    t = torch.zeros(1)
    return lambda: mod(t)


def breakdown(p: dict[str, torch.Tensor], m: int, device: torch.device, backend: str, tile: int, calls: int,
              rounds: int) -> None:
    x = p["x"][:m].contiguous()
    print(f"\n## breakdown at M={m}: cProfile, own time per module call (us, profiler overhead included)")
    kw = {"backend": backend, "tile": tile}
    for label, policy, extra in (("dense path", DispatchPolicy.always_dense(), {}),
                                 ("sparse hot/cold", DispatchPolicy.always_sparse(), {"hot_cold": True})):
        layer = layer_for(p, policy, **kw, **extra)
        print(f"  module, {label}:")
        with torch.no_grad():
            profile_calls(lambda layer=layer: layer(x), n=max(200, calls), top=14)
    print(f"\n## components at M={m} (us per call, no profiler, no_grad)")
    with torch.no_grad():
        for label, fn in components(p, x, backend, tile):
            print(f"  {per_call_us(fn, device, calls=calls, rounds=rounds):8.3f}  {label}")


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    # Many short rounds on the CPU: on a shared machine the best of many short rounds is the one least
    # disturbed by other processes.
    ap.add_argument("--calls", type=int, default=None, help="calls per timed round (default 200 CPU, 500 CUDA)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds, the best reported (default 40 CPU, 7 CUDA)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (1: least noise on a shared machine)")
    args = ap.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    if device.type == "cuda":
        d, f, dtype, ms, tile = 2048, 5632, torch.bfloat16, (1, 16, 64, 256, 4096, 16384), 128
        calls, rounds = args.calls or 500, args.rounds or 7
    else:
        d, f, dtype, ms, tile = 64, 256, torch.float32, (1, 16, 64), 32
        calls, rounds = args.calls or 200, args.rounds or 40
        stubbed = stub_triton_kernels()
        print(f"CPU: Triton kernel launches replaced by no-ops ({len(stubbed)} kernels): host overhead only")
    print(f"torch {torch.__version__}, device {device}, d={d}, F={f}, {str(dtype).replace('torch.', '')}, "
          f"tile {tile}, {calls} calls x {rounds} rounds (best), {torch.get_num_threads()} CPU thread(s)")
    # On the CPU 64 always-on units give the hot/cold rows a plan at every M; on CUDA the profile is
    # left as it is, so there the module takes whatever path the real statistics give it.
    p = make_problem(d, f, max(ms), dtype, device, n_always_on=64 if device.type == "cpu" else 0)
    main_table(p, ms, device, "triton", tile, calls, rounds)
    breakdown(p, 1, device, "triton", tile, calls, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
