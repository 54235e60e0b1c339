"""Host time per call of twell's Triton-launching ops on tiny inputs, where the GPU work is negligible.

At M=4096 the hot/cold training op is bound by its host (H200: 2.80 ms a step for 0.93 ms of kernels,
bench_results/h200/trainprof_session5.log), and with its seven Triton launches stubbed out its Python
and torch ops cost only 1.36x dense autograd's on the CPU (docs/performance.md): the launches
themselves (``JITFunction.run`` binding and specialising each argument) are the suspect.  Here, on
tiny shapes (d=64, F=256, M=64), each call's wall time is its host time; per op it prints that, the
number of Triton launches it makes, and a plain one-kernel launch (the l0 count) for the per-launch
floor, next to a torch op and dense autograd.

Usage (GPU machine): ``PYTHONPATH=src python3 scripts/launch_overhead.py``
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from twell.bench.timing import back_to_back_ms
from twell.nn.train_dispatch import dense_train_ffn_l1
from twell.ops.active_count import mean_active_per_token
from twell.ops.decode import decode_gated_ffn
from twell.ops.hot_cold_training import hot_units, twell_gated_ffn_l1_hot_cold


def host_us(fn: Callable[[], object]) -> float:
    """Wall microseconds per call, 200 calls back to back then one sync (20 untimed calls first)."""
    for _ in range(20):
        fn()
    return back_to_back_ms(fn, device=torch.device("cuda"), calls=200, rounds=7) * 1e3


@triton.jit
def _fill_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 1.0, mask=offs < n)


@triton.jit
def _wide_kernel(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9,
                 BLOCK: tl.constexpr):
    """Twenty arguments, as the op's gate and gather kernels take (~20-30): stores into p0 only."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p0 + offs, 1.0, mask=offs < n0 + n1 + n2 + n3 + n4 + n5 + n6 + n7 + n8 + n9)


def bare_launches(dev: torch.device) -> dict[str, Callable[[], object]]:
    """A two-argument Triton kernel through ``kernel[grid](...)`` (Triton's per-call binding and cache
    lookup), and the same compiled kernel's launcher called directly (what a cached fast path would
    pay); the direct call uses Triton 3.6's ``CompiledKernel.run`` argument order."""
    buf = torch.empty(128, device=dev)
    compiled = _fill_kernel[(1,)](buf, 128, BLOCK=128)

    def direct() -> None:
        stream = torch.cuda.current_stream(dev).cuda_stream
        compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, buf, 128, 128)

    bufs = [torch.empty(128, device=dev) for _ in range(10)]
    ints = [12 + i for i in range(10)]  # neither 1 nor a multiple of 16: no specialisation differs between them
    wide = _wide_kernel[(1,)](*bufs, *ints, BLOCK=128)

    def wide_direct() -> None:
        stream = torch.cuda.current_stream(dev).cuda_stream
        wide.run(1, 1, 1, stream, wide.function, wide.packed_metadata, None, None, None, *bufs, *ints, 128)

    return {"bare Triton launch (2 args, kernel[grid])": lambda: _fill_kernel[(1,)](buf, 128, BLOCK=128),
            "same kernel, launcher called directly": direct,
            "wide Triton launch (20 args, kernel[grid])": lambda: _wide_kernel[(1,)](*bufs, *ints, BLOCK=128),
            "wide kernel, launcher called directly": wide_direct}


def profile_top(fn: Callable[[], object], calls: int = 300, top: int = 15) -> str:
    """cProfile of ``calls`` calls: the ``top`` functions by their own time (where the host time goes)."""
    for _ in range(20):
        fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    m, d, f = 64, 64, 256
    x = torch.randn(m, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    ws = [(torch.randn(f, d, device=dev) / 8).bfloat16().requires_grad_(),
          (torch.randn(f, d, device=dev) / 8).bfloat16().requires_grad_(),
          (torch.randn(d, f, device=dev) / 16).bfloat16().requires_grad_()]
    hot = hot_units(torch.arange(0, 64, device=dev), f, cold_l0=4.0)
    gout = torch.randn(m, d, device=dev, dtype=torch.bfloat16)
    gl1 = torch.tensor(0.5, device=dev)
    a = torch.relu(torch.randn(m, f, device=dev, dtype=torch.bfloat16))

    def hot_cold() -> None:
        out, l1, _ = twell_gated_ffn_l1_hot_cold(x, *ws, hot)
        torch.autograd.grad((out, l1), (x, *ws), (gout, gl1))

    def dense() -> None:
        out, l1, _ = dense_train_ffn_l1(x, *ws, with_l0=False)
        torch.autograd.grad((out, l1), (x, *ws), (gout, gl1))

    xd = x.detach()[:1]
    wd = [w.detach() for w in ws]
    cases = {
        "torch add (one aten launch)": lambda: a.add(1.0),
        "l0 count (one Triton launch, 6 args)": lambda: mean_active_per_token(a),
        "decode op, 1 token (2 Triton launches)": lambda: decode_gated_ffn(xd, *wd, backend="triton"),
        "dense autograd fwd+bwd (cuBLAS)": dense,
        "hot/cold op fwd+bwd (7 Triton launches)": hot_cold,
    }
    print(f"{torch.cuda.get_device_name(dev)} torch {torch.__version__} triton {triton.__version__}; host us per "
          "call (tiny shapes)")
    for name, fn in {**bare_launches(dev), **cases}.items():
        try:
            print(f"  {name:45s} {host_us(fn):8.1f} us", flush=True)
        except Exception as exc:  # noqa: BLE001 - a launcher API that differs in this Triton: report, go on
            print(f"  {name:45s} FAILED {type(exc).__name__}: {str(exc)[:100]}", flush=True)
    for name in ("l0 count (one Triton launch, 6 args)", "decode op, 1 token (2 Triton launches)"):
        print(f"\n--- cProfile, 300 calls of {name}, by own time\n{profile_top(cases[name])}", flush=True)


if __name__ == "__main__":
    main()
