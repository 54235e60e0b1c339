"""Host time per call of the inference hot/cold op and of ``SparseGatedMLP``, with the GPU held busy, and where it goes.

Session 40's timeline (``infer_op_profile.py --timeline``, H100, bench_results/h100/timeline_*_session40.log) showed
each call started on an idle GPU waiting ~450-560 us between its first kernel and the fused gate kernel, and at
1024 x 3072 / 16,384 tokens the op's ~0.39 ms of kernels inside a ~1.2 ms span: the host issues the op's launches
more slowly than the GPU runs them there.  ``launch_overhead_session6.log`` put one Triton launch at ~62 us of host
time on the H200 machine against 8.6 us for a torch op.  Per point this prints, for the dense chain, the module
and the op: the host's microseconds per call while a ``torch.cuda._sleep`` holds the GPU (so the queue never
drains and the host clock measures the issuing alone), the device's milliseconds per call (CUDA events), and a
cProfile of the op's calls by own time (which Python functions the host time is).

Usage (GPU machine): ``PYTHONPATH=src:scripts python3 scripts/op_host_time.py [--shape 1024x3072] [--points 16384:30
...] [--stub-launches] [--pieces] [--ab ROUNDS]``: ``--stub-launches`` makes every Triton kernel a no-op (the host
time of the Python and torch ops alone), ``--pieces`` adds the host time of the torch ops an op call is built from,
``--ab`` times the shipped launch path against the one before session 40's trim in one process.  ``--device cpu
--tiny`` under TRITON_INTERPRET=1 is the smoke test (the host times then include the interpreter).
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable, Iterator

import torch
from hot_threshold_probe import parse_point  # scripts/ (the script's own directory is on sys.path)

from twell import ops
from twell.bench.probe import probe_device, probe_parser, run_points
from twell.bench.shape_arg import parse_shape
from twell.bench.timing import SLEEP_CYCLES_PER_MS, synchronize, time_ms
from twell.format.twell import DEFAULT_TILE
from twell.nn import DEFAULT_POLICY, DispatchPolicy, SparseGatedMLP
from twell.ops.hot_cold_plan import build_hot_cold_plan, choose_hot_units, unit_frequency
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

#: Calls issued per host-time sample, and samples per function (the median is printed)
CALLS, SAMPLES = 40, 5
#: GPU hold per call issued (ms): longer than any host time per call seen (~1 ms under the profiler); a piece of
#: ``--pieces`` is timed 200 calls at a time, behind 200 x this
HOLD_MS_PER_CALL = 3.0


def _hold_gpu(dev: torch.device, calls: int) -> None:
    """After a synchronize, the GPU spins long enough that ``calls`` calls issued now all queue behind it (CUDA)."""
    synchronize(dev)
    if dev.type == "cuda":
        torch.cuda._sleep(int(HOLD_MS_PER_CALL * calls * SLEEP_CYCLES_PER_MS))


def host_us(fn: Callable[[], object], dev: torch.device, calls: int = CALLS, samples: int = SAMPLES) -> float:
    """Median over ``samples`` of the host microseconds per call of ``calls`` calls issued behind a GPU hold."""
    out = []
    for _ in range(samples):
        _hold_gpu(dev, calls)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) * 1e6 / calls)
    synchronize(dev)
    out.sort()
    return out[len(out) // 2]


def profile_text(fn: Callable[[], object], dev: torch.device, calls: int, top: int = 25) -> str:
    """cProfile of ``calls`` calls behind a GPU hold, the ``top`` functions by own time."""
    _hold_gpu(dev, calls)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    synchronize(dev)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def torch_op_costs(dev: torch.device, m: int = 16384, d: int = 2048, h: int = 512) -> None:
    """Host us per call of the pieces an op call is built from, the GPU held: allocations, cuBLAS's fp32-output GEMM
    (the hot down projection) against the same GEMM in bf16, a TMA descriptor, one Triton launch."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from twell.ops.active_count import mean_active_per_token

    dt = torch.bfloat16
    x = torch.randn(m, d, device=dev, dtype=dt)
    hh = torch.randn(m, h, device=dev, dtype=dt)
    wt = torch.randn(h, d, device=dev, dtype=dt)
    a = torch.relu(torch.randn(64, 256, device=dev, dtype=dt))
    pieces: dict[str, Callable[[], object]] = {
        "torch.empty [m, d] bf16": lambda: torch.empty((m, d), dtype=dt, device=dev),
        "torch.zeros [33] int32": lambda: torch.zeros(33, dtype=torch.int32, device=dev),
        "torch.mm [m, h] x [h, d], out_dtype fp32": lambda: torch.mm(hh, wt, out_dtype=torch.float32),
        "torch.mm [m, h] x [h, d], bf16": lambda: torch.mm(hh, wt),
        "x.contiguous() (already)": lambda: x.contiguous(),
        "TensorDescriptor.from_tensor(x, [128, 64])": lambda: TensorDescriptor.from_tensor(x, [128, 64]),
        "a Triton launch (l0 count, 6 args)": lambda: mean_active_per_token(a),
    }
    for name, fn in pieces.items():
        fn()
        print(f"piece {name:45s}: host {host_us(fn, dev, 200):8.1f} us/call (GPU held)", flush=True)


@contextlib.contextmanager
def launch_path(before: bool) -> Iterator[None]:
    """The host-side launch path as shipped, or (``before``) as it was before session 40's trim: the module's eager
    hot/cold calls through the custom op (``nn.mlp.EAGER_HOT_COLD_LAUNCH`` off) and every launcher's grid on
    ``triton.cdiv`` (the ``ConstexprFunction``) instead of ``ops._runtime.cdiv``."""
    import triton
    from module_overhead import twell_ops_modules

    import twell.nn.mlp as mlp_mod
    from twell.ops import _runtime

    patched = [(mlp_mod, "EAGER_HOT_COLD_LAUNCH", not before)]
    if before:
        for mod in twell_ops_modules():
            if mod is not _runtime and getattr(mod, "cdiv", None) is _runtime.cdiv:
                patched.append((mod, "cdiv", triton.cdiv))
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patched]
    try:
        for mod, name, value in patched:
            setattr(mod, name, value)
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


def _warm_layer(m: int, l0: float, d: int, f: int, dev: torch.device, **kw: object
                ) -> tuple[dict[str, torch.Tensor], SparseGatedMLP]:
    """The synthetic problem (with ``w_down_t``, Wd^T unit-major) and its ``SparseGatedMLP`` (``kw``: its options),
    after the two calls that measure l0 on the dense path and build the hot/cold plan, with the l0 refresh off: its
    host read (one call in 64) would wait out a whole GPU hold (session 40's first run read 3.0-4.0 ms a module call
    that way)."""
    gen = torch.Generator(device=dev).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0), generator=gen, device=dev)
    p["w_down_t"] = p["w_down"].t().contiguous().t()
    kw.setdefault("eager_graphs", 0)  # the host time of the unrecorded call (a replay issues one graph launch)
    mlp = SparseGatedMLP.from_weights(p["w_gate"], p["w_up"], p["w_down"], **kw).eval()
    with torch.no_grad():
        for _ in range(2):
            mlp(p["x"])
    mlp.l0_refresh_every = 1 << 40
    return p, mlp


def _layer_kwargs(dev: torch.device, *, sparse_off_cuda: bool) -> dict:
    """The layer's policy: on CUDA the default tables without the eager floor (since session 43 the default runs an
    eager call dense below its floor, 8937 tokens at 2048 x 5632 since session 44, and this script times the sparse
    call's host work: session 44's A/B at 1024 tokens found no plan); off CUDA (the smoke tests) with
    ``sparse_off_cuda`` the Triton path under the interpreter, sparse whatever the size, else the default."""
    if dev.type == "cuda":
        return {"policy": DEFAULT_POLICY.without_eager_floor()}
    return {"backend": "triton", "policy": DispatchPolicy.always_sparse()} if sparse_off_cuda else {}


def ab_point(m: int, l0: float, d: int, f: int, dev: torch.device, calls: int, rounds: int) -> None:
    """The module's and the op's host time a call, shipped against :func:`launch_path`'s before, alternating in this
    process round by round (separate processes on the GPU machine's host differed by more than the change)."""
    kw = _layer_kwargs(dev, sparse_off_cuda=True)
    p, mlp = _warm_layer(m, l0, d, f, dev, **kw)
    x, wg, wu, wd_t = p["x"], p["w_gate"], p["w_up"], p["w_down_t"]
    with torch.no_grad():
        plan = mlp._hot_cold._plan
        if plan is None:
            print(f"M={m} l0={l0}: the module took no hot/cold plan; A/B skipped", flush=True)
            return
        be = kw.get("backend", "auto")
        fns = {"module": lambda: mlp(x),
               "hot/cold op": lambda: ops.hot_cold_gated_ffn(x, wg, wu, wd_t, plan, backend=be)}
        times: dict[tuple[str, bool], list[float]] = {(k, b): [] for k in fns for b in (False, True)}
        outs = {}
        for _ in range(rounds):
            for before in (False, True):
                with launch_path(before):
                    for name, fn in fns.items():
                        outs[(name, before)] = fn()
                        times[(name, before)].append(host_us(fn, dev, calls, samples=1))
        for name in fns:
            new, old = (statistics.median(times[(name, b)]) for b in (False, True))
            same = bool(torch.equal(outs[(name, False)], outs[(name, True)]))
            print(f"M={m} l0={l0} A/B {name:12s}: host shipped {new:8.1f} us/call, before {old:8.1f} "
                  f"(medians of {rounds} rounds; shipped/before {new / old:.3f}; same output {same})", flush=True)


def probe_point(m: int, l0: float, d: int, f: int, dev: torch.device, calls: int) -> None:
    p, mlp = _warm_layer(m, l0, d, f, dev, **_layer_kwargs(dev, sparse_off_cuda=False))
    x, wg, wu, wd, wd_t = p["x"], p["w_gate"], p["w_up"], p["w_down"], p["w_down_t"]
    lin = torch.nn.functional.linear
    with torch.no_grad():
        plan = mlp._hot_cold._plan
        if plan is None:  # the module runs dense or its decode path here: time the op on the module's hot-set rule
            print(f"M={m} l0={l0}: the module took no hot/cold plan; the op runs the default hot set", flush=True)
            plan = build_hot_cold_plan(wg, wu, wd, choose_hot_units(unit_frequency(x, wg)), fused_tile=DEFAULT_TILE)
        fns: dict[str, Callable[[], object]] = {
            "dense chain": lambda: lin(torch.relu(lin(x, wg)) * lin(x, wu), wd), "module": lambda: mlp(x)}
        fns["hot/cold op"] = lambda: ops.hot_cold_gated_ffn(x, wg, wu, wd_t, plan)
        for name, fn in fns.items():
            fn()
            dev_ms = time_ms(fn, device=dev, rep_ms=50.0)
            print(f"M={m} l0={l0} {name:12s}: host {host_us(fn, dev, calls):8.1f} us/call (GPU held), device "
                  f"{dev_ms * 1e3:8.1f} us/call (events)", flush=True)
        print(f"M={m} l0={l0} hot/cold op, cProfile of {calls} calls by own time:\n"
              f"{profile_text(fns['hot/cold op'], dev, calls)}", flush=True)


def main() -> None:
    ap = probe_parser(__doc__)
    ap.add_argument("--shape", type=parse_shape, default=(1024, 3072), help="hidden x FFN, e.g. 2048x5632")
    ap.add_argument("--points", nargs="+", type=parse_point, default=None, help="M:l0 pairs")
    ap.add_argument("--stub-launches", action="store_true",
                    help="every Triton kernel of twell.ops a no-op (module_overhead.py's stubs): the host time "
                         "left is the Python and torch ops around the launches (the outputs are then garbage)")
    ap.add_argument("--ab", type=int, default=0, metavar="ROUNDS",
                    help="instead: the module and the op, shipped launch path against the one before session 40's "
                         "trim, alternating for this many rounds in this process")
    ap.add_argument("--pieces", action="store_true",
                    help="also the host time of the torch ops an op call is built from")
    a = ap.parse_args()
    dev = probe_device(a.device)
    if a.stub_launches:
        from module_overhead import stub_triton_kernels

        print(f"Triton launches stubbed ({len(stub_triton_kernels())} kernels): host times without them", flush=True)
    (d, f), calls = a.shape, CALLS
    points = a.points or [(1024, 30.0), (4096, 30.0), (16384, 30.0)]
    if a.tiny:  # infer_op_profile.py's smoke point, where the module takes a hot/cold plan
        d, f, calls, points = 64, 700, 2, [(300, 6.0)]
    if a.ab:
        if a.tiny:  # the interpreter runs the kernels: a smaller problem than the smoke point, two rounds
            d, f, points = 64, 256, [(16, 6.0)]
        run_points(points, lambda m, l0: ab_point(m, l0, d, f, dev, calls, 2 if a.tiny else a.ab), dev)
    else:
        run_points(points, lambda m, l0: probe_point(m, l0, d, f, dev, calls), dev)
    if a.pieces and dev.type == "cuda":
        torch_op_costs(dev)


if __name__ == "__main__":
    main()
