"""Host cost of ``SparseGatedMLP(train_impl="auto")``'s dense path against plain dense autograd.

Issue 4's last criterion is "no point of ``twell bench train-ffn`` more than 5 % slower than dense with
the switch on".  At M=4096 (d=2048, F=5632, bf16, H200) the switch correctly stays dense, yet its path
read 0.85-1.00x of dense autograd, and ``scripts/train_hot_cold_profile.py`` showed why it is not the
GPU: the switch's dense path runs the same kernels (1.408 vs 1.387 ms per step, the l0 count 0.014 ms
of it) but timed 1.92 ms against 1.42 ms (bench_results/h200/trainprof_session5.log).  A step whose
GPU work is ~1.4 ms is close to bound by the host, so every microsecond of Python in the layer shows.

Per path this prints, for one forward + backward:

* ``host``: host microseconds per call, 8 calls issued back to back after a synchronisation (launches
  are asynchronous, so this is the Python + dispatcher + launch time);
* ``loop``: milliseconds per call of 40 calls back to back, then one synchronisation (max of host and
  GPU time, what a training loop sees);
* ``event``: :func:`twell.bench.timing.time_ms` (CUDA events, the method of ``twell bench train-ffn``);

then a cProfile of the switch's path (top functions by own time).  Paths: dense autograd without and
with the l0 count, the module with an always-dense policy and with the default switch.

Usage: ``python scripts/train_switch_overhead.py [--device cpu|cuda] [--tokens M]``; on the CPU the
shapes are tiny (d=64, F=256, fp32) and the times are host overhead plus small CPU kernels.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections.abc import Callable

import torch

from twell.bench.timing import back_to_back_ms, synchronize, time_ms
from twell.nn import SparseGatedMLP
from twell.nn.train_dispatch import TrainDispatchPolicy, dense_train_ffn_l1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=None, help="M (default 4096 on CUDA, 16 on the CPU)")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    d, f = (2048, 5632) if cuda else (64, 256)
    m = a.tokens or (4096 if cuda else 16)
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(m, d, device=dev, dtype=dtype, generator=gen).requires_grad_(True)
    auto = SparseGatedMLP(d, f, device=dev, dtype=dtype).train()
    dense_mod = SparseGatedMLP(d, f, device=dev, dtype=dtype, train_policy=TrainDispatchPolicy.always_dense()).train()
    dense_mod.load_state_dict(auto.state_dict())
    ws = tuple(p.detach().clone().requires_grad_(True) for p in (auto.gate_proj.weight, auto.up_proj.weight,
                                                                   auto.down_proj.weight))
    gout = torch.randn(m, d, device=dev, dtype=dtype, generator=gen)
    gl1 = torch.tensor(0.5, device=dev)

    def plain(with_l0: bool) -> Callable[[], None]:
        def step() -> None:
            out, l1, _ = dense_train_ffn_l1(x, *ws, with_l0=with_l0)
            torch.autograd.grad((out, l1), (x, *ws), (gout, gl1))
        return step

    def module(mlp: SparseGatedMLP) -> Callable[[], None]:
        params = tuple(mlp.parameters())

        def step() -> None:
            out = mlp(x)
            torch.autograd.grad((out, mlp.l1_loss()), (x, *params), (gout, gl1))
        return step

    paths = {"dense": plain(False), "dense + l0": plain(True), "module always-dense": module(dense_mod),
             "module auto": module(auto)}
    for fn in paths.values():
        for _ in range(3):
            fn()
    print(f"{torch.cuda.get_device_name(dev) if cuda else 'cpu'} torch {torch.__version__}: M={m} d={d} F={f} "
          f"{str(dtype).replace('torch.', '')}; auto path: {'sparse' if auto._train_switch.last_sparse else 'dense'}")
    base: dict[str, float] = {}
    for rnd in range(2):  # two rounds, so a drift of clocks shows as a difference between them
        for name, fn in paths.items():
            host = back_to_back_ms(fn, device=dev, calls=8, rounds=30, wait=False) * 1e3
            loop = back_to_back_ms(fn, device=dev, calls=40, rounds=5)
            event = time_ms(fn, device=dev)
            base.setdefault("loop", loop)
            base.setdefault("event", event)
            print(f"  round {rnd} {name:20s} host {host:7.1f} us | loop {loop:.3f} ms ({base['loop'] / loop:.2f}x) | "
                  f"event {event:.3f} ms ({base['event'] / event:.2f}x)", flush=True)
        base.clear()
    prof = cProfile.Profile()
    fn = paths["module auto"]
    synchronize(dev)
    prof.enable()
    for _ in range(200):
        fn()
    prof.disable()
    synchronize(dev)
    print("cProfile of 200 calls of the switch's path (own time):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
