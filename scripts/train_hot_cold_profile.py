"""Where the time of the hot/cold training op goes: per-kernel GPU time of one forward+backward (H200).

Runs the op and dense autograd on the synthetic problem of ``twell bench train-ffn`` under
``torch.profiler`` and prints, per point, each CUDA kernel's mean time per call of the whole step,
largest first, with the step's total.  Usage (GPU machine):

    PYTHONPATH=src python3 scripts/train_hot_cold_profile.py [M:percent ...]   # default 16384:0.5 65536:2
"""

from __future__ import annotations

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from twell.bench.model_measure import profile_kernels
from twell.bench.timing import time_ms
from twell.nn import SparseGatedMLP
from twell.nn.train_dispatch import TrainDispatchPolicy, dense_train_ffn_l1
from twell.ops.hot_cold_train_kernels import launch_pack
from twell.ops.hot_cold_training import (
    choose_training_hot_units,
    default_cont_rows,
    default_width,
    twell_gated_ffn_l1_hot_cold,
)
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

D, F_UNITS, STEPS = 2048, 5632, 5


def _step(fn, x, ws, gout, gl1):  # noqa: ANN001, ANN202 - a script
    out, l1 = fn()[:2]
    torch.autograd.grad((out, l1), (x, *ws), (gout, gl1))


def _kernel_table(fn, label: str) -> None:  # noqa: ANN001 - a script
    for _ in range(2):
        fn()
    prof = profile_kernels(fn, torch.device("cuda"), top=18, calls=STEPS)
    print(f"  {label}: kernels sum {prof['kernel_ms']:.3f} ms per step")
    for r in prof["kernels"]:
        print(f"    {r['ms']:7.3f} ms  x{r['calls']:<3d} {r['kernel'][:110]}")


def _point(dev: torch.device, m: int, pct: float) -> None:
    gen = torch.Generator(device=dev).manual_seed(0)
    p = synthetic_ffn_problem(m, D, F_UNITS, SparsityProfile(mean_l0=pct / 100 * F_UNITS), generator=gen,
                              device=dev)
    x = p["x"].detach().requires_grad_(True)
    ws = tuple(p[k].detach().requires_grad_(True) for k in ("w_gate", "w_up", "w_down"))
    gout = torch.randn(m, D, device=dev, dtype=x.dtype, generator=gen)
    gl1 = torch.tensor(0.5 * m, device=dev)
    hot = choose_training_hot_units(x, ws[0])

    def dense() -> None:
        _step(lambda: dense_train_ffn_l1(x, *ws, with_l0=False), x, ws, gout, gl1)

    def hot_cold() -> None:
        _step(lambda: twell_gated_ffn_l1_hot_cold(x, *ws, hot), x, ws, gout, gl1)

    t_d, t_h = time_ms(dense, device=dev), time_ms(hot_cold, device=dev)
    print(f"M={m} density {pct} % (hot units {hot.n_hot}, cold l0 {hot.cold_l0:.1f}): dense {t_d:.3f} ms, "
          f"hot/cold {t_h:.3f} ms, {t_d / t_h:.2f}x", flush=True)
    mlp = SparseGatedMLP.from_weights(*(w.detach() for w in ws), train_impl="auto").train()

    def auto() -> None:
        out = mlp(x)
        torch.autograd.grad((out, mlp.l1_loss()), (x, *mlp.parameters()), (gout, gl1))

    auto()
    t_a = time_ms(auto, device=dev)
    print(f"  module train_impl='auto' (path {'sparse' if mlp._train_switch.last_sparse else 'dense'}): "
          f"{t_a:.3f} ms, {t_d / t_a:.2f}x of dense", flush=True)
    # The switch's dense path measured 0.87-0.93x of plain dense autograd in the train-ffn sweeps (its
    # l0 count is the only extra work on paper): its kernels side by side with dense's.
    mlp_dense = SparseGatedMLP.from_weights(*(w.detach() for w in ws), train_impl="auto",
                                            train_policy=TrainDispatchPolicy.always_dense()).train()

    def auto_dense() -> None:
        out = mlp_dense(x)
        torch.autograd.grad((out, mlp_dense.l1_loss()), (x, *mlp_dense.parameters()), (gout, gl1))

    auto_dense()
    t_ad = time_ms(auto_dense, device=dev)
    print(f"  module train_impl='auto', always-dense policy: {t_ad:.3f} ms, {t_d / t_ad:.2f}x of dense", flush=True)
    _kernel_table(auto_dense, "module auto, dense path")
    for name, fn in (("dense", dense), ("hot/cold", hot_cold)):
        try:
            print(f"  {name} captured in one CUDA graph (forward + backward): {_graph_ms(fn, dev):.3f} ms", flush=True)
        except Exception as exc:  # noqa: BLE001 - report and go on
            first = exc.__cause__ or exc.__context__
            print(f"  {name}: CUDA graph capture failed: {type(exc).__name__}: {str(exc)[:200]}"
                  + (f" (first: {type(first).__name__}: {str(first)[:300]})" if first else ""), flush=True)
    # The layer as torch.cuda.make_graphed_callables records it (forward and backward graphs, autograd
    # kept): a training loop's way to drop the per-call host time (kernels 2.58 of 3.25 ms at 16384).
    for name, impl, policy in (("dense", "auto", TrainDispatchPolicy.always_dense()), ("hot/cold", "hot-cold", None)):
        try:
            t_g = _graphed_layer_ms(ws, impl, policy, x, gout, gl1)
            print(f"  {name} layer through make_graphed_callables: {t_g:.3f} ms (eager dense {t_d:.3f})", flush=True)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"  {name}: make_graphed_callables failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        # torch.compile with CUDA graphs (inductor's cudagraph trees); the hot/cold op is a custom op there
        try:
            t_c = _compiled_layer_ms(ws, impl, policy, x, gout, gl1)
            print(f"  {name} layer under torch.compile(mode='reduce-overhead'): {t_c:.3f} ms", flush=True)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"  {name}: torch.compile(mode='reduce-overhead') failed: {type(exc).__name__}: "
                  f"{str(exc)[:300]}", flush=True)
    if KERNEL_TABLES:
        _kernel_table(dense, "dense")
        _kernel_table(auto, "module auto")
        _kernel_table(hot_cold, "hot/cold")
    _host_table(hot_cold, "hot/cold")
    if PACK_SWEEP:
        _pack_sweep(x, ws, hot, dev)


class _WithL1(torch.nn.Module):
    """The layer returning its L1 term too, so that a graphed callable carries its gradient."""

    def __init__(self, mlp: SparseGatedMLP) -> None:
        super().__init__()
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.mlp(x)
        return out, self.mlp.l1_loss()


def _graphed_layer_ms(ws: tuple, impl: str, policy, x: torch.Tensor, gout: torch.Tensor,  # noqa: ANN001
                      gl1: torch.Tensor) -> float:
    kw = {} if policy is None else {"train_policy": policy}
    mlp = SparseGatedMLP.from_weights(*(w.detach() for w in ws), train_impl=impl, **kw).train()
    xs = x.detach().clone().requires_grad_(True)
    graphed = torch.cuda.make_graphed_callables(_WithL1(mlp), (xs,))
    params = tuple(mlp.parameters())

    def step() -> None:
        out, l1 = graphed(xs)
        torch.autograd.grad((out, l1), (xs, *params), (gout, gl1))

    step()
    return time_ms(step, device=x.device)


def _compiled_layer_ms(ws: tuple, impl: str, policy, x: torch.Tensor, gout: torch.Tensor,  # noqa: ANN001
                       gl1: torch.Tensor) -> float:
    kw = {} if policy is None else {"train_policy": policy}
    mlp = SparseGatedMLP.from_weights(*(w.detach() for w in ws), train_impl=impl, **kw).train()
    xs = x.detach().clone().requires_grad_(True)
    wrapped = _WithL1(mlp)
    wrapped(xs)  # an eager call first: the layer's hot set and l0 estimate
    compiled = torch.compile(wrapped, mode="reduce-overhead")
    params = tuple(mlp.parameters())

    def step() -> None:
        out, l1 = compiled(xs)
        torch.autograd.grad((out, l1), (xs, *params), (gout, gl1))

    for _ in range(3):  # compilation, then the CUDA graphs' recording
        step()
    return time_ms(step, device=x.device)


def _graph_ms(fn, dev: torch.device) -> float:  # noqa: ANN001
    """Median time of ``fn`` replayed from one CUDA graph: its GPU time without the host's launch cost."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay, device=dev)


def _host_table(fn, label: str) -> None:  # noqa: ANN001
    """Host (CPU) time per step of ``fn`` by operator, self time, largest first."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            fn()
        torch.cuda.synchronize()
    rows = sorted(((ev.self_cpu_time_total / STEPS / 1000.0, ev.count // STEPS, ev.key) for ev in prof.key_averages()
                   if ev.self_cpu_time_total > 0), reverse=True)
    print(f"  {label}: host self time {sum(r[0] for r in rows):.3f} ms per step, top operators:")
    for ms, n, key in rows[:25]:
        print(f"    {ms:7.3f} ms  x{n:<3d} {key[:100]}")


#: Print the per-kernel GPU tables and the pack-shape sweep (environment switches; default on).
KERNEL_TABLES = os.environ.get("TWELL_PROFILE_KERNELS", "1") == "1"
PACK_SWEEP = os.environ.get("TWELL_PROFILE_PACK", "1") == "1"

#: (tokens, gate columns, warps) per program of the cold pack kernel.
PACK_CONFIGS = ((8, 128, 2), (16, 128, 2), (16, 128, 4), (8, 256, 4), (4, 256, 2), (4, 512, 4), (32, 128, 4),
                (16, 64, 2))


def _main(packed: tuple, m: int) -> tuple:
    return (packed[0], packed[1][:m], *packed[2:])


def _pack_sweep(x: torch.Tensor, ws: tuple, hot, dev: torch.device) -> None:  # noqa: ANN001
    with torch.no_grad():
        g = torch.nn.functional.linear(x, ws[0][hot.columns])  # the hot-first gate
        u_hot = torch.nn.functional.linear(x, ws[1][hot.ids]).float()
    width, cont = default_width(hot), default_cont_rows(x.shape[0])
    ref = launch_pack(g, hot.columns, hot.n_hot, u_hot, width, cont)
    line = []
    for bm, bf, nw in PACK_CONFIGS:
        got = launch_pack(g, hot.columns, hot.n_hot, u_hot, width, cont, block_m=bm, block_f=bf, num_warps=nw)
        m = x.shape[0]  # vals of the continuation rows stay unwritten until the continuation pack
        same = all(torch.equal(a, b) for a, b in zip(_main(ref, m), _main(got, m), strict=True))
        t = time_ms(lambda bm=bm, bf=bf, nw=nw: launch_pack(g, hot.columns, hot.n_hot, u_hot, width, cont,
                                                           block_m=bm, block_f=bf, num_warps=nw), device=dev)
        line.append(f"{bm}x{bf}/{nw}w {t:.3f}{'' if same else ' DIFFERS'}")
    print("  pack (tokens x columns / warps: ms): " + ", ".join(line), flush=True)


def main(argv: list[str]) -> None:
    dev = torch.device("cuda")
    points = [tuple(float(v) for v in a.split(":")) for a in argv] or [(16384, 0.5), (65536, 2.0)]
    for m, pct in points:
        _point(dev, int(m), pct)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
