"""GPU time of the 1.5B model's shared (non-FFN) parts per layer: SDPA backends, the attention projections
fused or not, and the residual add + RMSNorm pair, at the forward benchmark's shape.

Why: at 1.5B / 64 x 2048 tokens the forward's parts outside the FFN are the same in the dense and the sparse
model, and they cap the whole-model speed-up (session 14: 237.6 vs 183.2 tokens/ms, 1.297x, goal 1.35x;
bench_results/h200/model/model_1.5b_forward_session14.json).  With the FFN as it is, 1.35x needs ~83 ms less
per forward in both variants (from 551.6 / 715.5 ms: (715.5 - x) / (551.6 - x) = 1.35).  Session 10's kernel
table (docs/performance.md, next step 5) had SDPA at 81.1 ms, the attention projections 159.5, residual
additions 20.4, norms 17.4 of ~540 ms.  This probe says which of those a different kernel choice can cut.

Per layer, medians of ``twell.bench.timing.time_ms``: SDPA (causal, [B, H, S, D] as transformers passes it)
under each backend PyTorch offers here (flash, efficient, cuDNN) and the default choice, with each output's
largest difference from the flash backend's; q, k, v as three linears against one linear of the
concatenated weight; ``h = r + a`` then ``F.rms_norm(h)`` against the same under ``torch.compile`` (one fused
kernel); the o projection and the dense FFN's down projection followed by the residual add, against one
``torch.addmm`` that adds the residual in cuBLAS's epilogue (session 23: the 56 residual additions of a forward
read and write ~1.5 GB each); a backend or a compile that fails is reported and the probe goes on.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/attention_probe.py``; ``--device cpu --tiny`` is the
smoke test.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from twell.bench.probe import probe_args
from twell.bench.timing import time_ms

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: SDPBackend | None):
    def call() -> torch.Tensor:
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return call


def main() -> None:
    device, tiny = probe_args(__doc__)
    b, h, s, dh = (2, 4, 64, 16) if tiny else (64, 32, 2048, 64)
    d = h * dh
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rep = 20.0 if tiny else 300.0
    torch.manual_seed(0)
    x = torch.randn(b, s, d, device=device, dtype=dtype)
    wq, wk, wv = (torch.randn(d, d, device=device, dtype=dtype) * d ** -0.5 for _ in range(3))
    # transformers' layout: [B, S, H, D] projections transposed to [B, H, S, D] (strided views)
    q, k, v = (F.linear(x, w).view(b, s, h, dh).transpose(1, 2) for w in (wq, wk, wv))
    flops = 4 * b * h * s * s * dh / 2  # QK^T and PV, causal half
    print(f"SDPA B={b} H={h} S={s} D={dh} causal {dtype}: per layer")
    ref = None
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if device.type == "cuda" else torch.no_grad():
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).float()
    for name, backend in [("default", None), *BACKENDS.items()]:
        try:
            out = _sdpa(q, k, v, backend)().float()
            ms = time_ms(_sdpa(q, k, v, backend), device=device, rep_ms=rep)
        except RuntimeError as exc:
            print(f"  {name:10s} failed: {str(exc).splitlines()[0][:120]}")
            continue
        diff = (out - ref).abs().max().item()
        print(f"  {name:10s} {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s  max |diff| vs flash {diff:.2e}")

    x2 = x.view(b * s, d)
    wqkv = torch.cat([wq, wk, wv])
    three = time_ms(lambda: [F.linear(x2, w) for w in (wq, wk, wv)], device=device, rep_ms=rep)
    one = time_ms(lambda: F.linear(x2, wqkv), device=device, rep_ms=rep)
    print(f"q, k, v projections M={b * s} d={d}: three linears {three:.3f} ms, one of N={3 * d} {one:.3f} ms "
          f"({three / one:.3f}x)")

    r = torch.randn_like(x2)
    a = torch.randn_like(x2)
    weight = torch.ones(d, device=device, dtype=dtype)

    def add_norm():
        hsum = r + a
        return hsum, F.rms_norm(hsum, (d,), weight, 1e-6)

    eager = time_ms(add_norm, device=device, rep_ms=rep)
    line = f"residual add + rms_norm M={b * s} d={d}: eager {eager:.3f} ms"
    try:
        fused = torch.compile(add_norm)
        fused()
        comp = time_ms(fused, device=device, rep_ms=rep)
        line += f", compiled {comp:.3f} ms ({eager / comp:.3f}x)"
    except Exception as exc:  # noqa: BLE001 - report and go on: the probe's other figures stand
        line += f", compile failed: {str(exc).splitlines()[0][:120]}"
    print(line)

    wo = torch.randn(d, d, device=device, dtype=dtype) * d ** -0.5
    f = 4 * d if tiny else 5632
    hid = torch.randn(b * s, f, device=device, dtype=dtype)
    wd = torch.randn(d, f, device=device, dtype=dtype) * f ** -0.5
    for name, inp, w in (("o projection", a, wo), ("FFN down projection", hid, wd)):
        sep = time_ms(lambda inp=inp, w=w: r + F.linear(inp, w), device=device, rep_ms=rep)
        fused_add = time_ms(lambda inp=inp, w=w: torch.addmm(r, inp, w.t()), device=device, rep_ms=rep)
        diff = (torch.addmm(r, inp, w.t()).float() - (r + F.linear(inp, w)).float()).abs().max().item()
        print(f"{name} + residual add M={b * s} K={inp.shape[1]} N={d}: linear then add {sep:.3f} ms, addmm "
              f"{fused_add:.3f} ms ({sep / fused_add:.3f}x), max |diff| {diff:.2e}")


if __name__ == "__main__":
    main()
