"""How fast can an H200 gather whole weight rows at random: the floor under the cold row-gather kernel.

The hot/cold split's cold gather (twell_ffn_kernel, M=131072, l0=28: 7.09 cold pairs per token, 5056 cold
units) took 2.15 ms (bench_results/h200/cold_pack_gather_probe_session7.log).  Per token it reads one Wu
and one Wd row (4 KB each at d=2048, bf16) per cold pair, its x row (4 KB), its fp32 init row (8 KB) and
writes its output row (4 KB): 74.5 KB per token, 9.76 GB in all, i.e. 4.5 TB/s.  Whether that is near
what the memory system gives for such a pattern, or the kernel's ~200 instructions per pair and warp
(SASS, docs/performance.md) hold it back, decides what to build next; this probe measures the pattern
without the arithmetic.

Per table size (the cold set's 2 x 5056 rows = 41 MB, a quarter of it, and 2 x 40,000 rows = 328 MB, which
cannot stay in the 50-60 MB L2) and per (SB rows per step, warps): a Triton kernel whose program sums, for
its token, P random rows of each of two [T, d] tables (elementwise, fp32, no reduction across threads) and
writes the sum; plus the same with the x row read and an fp32 init row added (the gather's full traffic).
Prints ms, GB moved and TB/s; a device-to-device copy of 2 GB is the HBM reference.

Usage (GPU machine): ``PYTHONPATH=src python3 scripts/l2_gather_probe.py``; ``--device cpu --tiny`` under
TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from twell.bench.probe import probe_args
from twell.bench.timing import time_ms

#: (SB rows of each table per step, warps): the row-gather kernel ships SB 4 on 4 warps.
VARIANTS = ((1, 4), (2, 4), (4, 4), (4, 8), (8, 8), (2, 2))


@triton.jit
def _gather_sum_kernel(idx_ptr, a_ptr, b_ptr, x_ptr, init_ptr, out_ptr, P, D, SB: tl.constexpr, D_PAD: tl.constexpr,
                       FULL: tl.constexpr):
    """out[row] = sum_p A[idx[row, p]] + B[idx[row, p]] (+ x[row] + init[row] when FULL), in fp32."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, D_PAD)
    d_ok = offs < D
    acc = tl.zeros((D_PAD,), dtype=tl.float32)
    if FULL:
        acc += tl.load(x_ptr + row * D + offs, mask=d_ok, other=0.0).to(tl.float32)
        acc += tl.load(init_ptr + row * D + offs, mask=d_ok, other=0.0)
    for p0 in range(0, P, SB):
        k = p0 + tl.arange(0, SB)
        live = k < P
        unit = tl.load(idx_ptr + row * P + k, mask=live, other=0).to(tl.int64)
        w_off = unit[:, None] * D + offs[None, :]
        ok = live[:, None] & d_ok[None, :]
        a = tl.load(a_ptr + w_off, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + w_off, mask=ok, other=0.0).to(tl.float32)
        acc += tl.sum(a + b, axis=0)
    tl.store(out_ptr + row * D + offs, acc.to(out_ptr.dtype.element_ty), mask=d_ok)


def gather_sum(idx, a, b, x, init, sb: int, warps: int, full: bool) -> torch.Tensor:
    m, p = idx.shape
    d = a.shape[1]
    out = torch.empty(m, d, dtype=a.dtype, device=a.device)
    _gather_sum_kernel[(m,)](idx, a, b, x, init, out, p, d, SB=sb, D_PAD=triton.next_power_of_2(d), FULL=full,
                             num_warps=warps)
    return out


def reference(idx, a, b, x, init, full: bool) -> torch.Tensor:
    acc = a.float()[idx.long()].sum(1) + b.float()[idx.long()].sum(1)
    if full:
        acc = acc + x.float() + init
    return acc.to(a.dtype)


def main() -> None:
    dev, tiny = probe_args(__doc__)
    m, d, p = (16, 64, 7) if tiny else (131072, 2048, 7)
    tables = (300,) if tiny else (1264, 5056, 40000)
    rep = 5.0 if tiny else 100.0
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(m, d, generator=gen, device=dev).to(torch.bfloat16)
    init = torch.randn(m, d, generator=gen, device=dev)
    if dev.type == "cuda" and not tiny:
        big = torch.empty(2**30, dtype=torch.int16, device=dev)
        ms = time_ms(lambda: big.clone(), device=dev, rep_ms=rep)
        print(f"M={m} reference: device copy of 2 GB: {ms:.3f} ms, {2 * 2 * 2**30 / ms / 1e9:.2f} TB/s (read + write)")
        del big
    for t in tables:
        a = (torch.randn(t, d, generator=gen, device=dev) / 64).to(torch.bfloat16)
        b = (torch.randn(t, d, generator=gen, device=dev) / 64).to(torch.bfloat16)
        idx = torch.randint(0, t, (m, p), generator=gen, device=dev, dtype=torch.int32)
        table_mb = 2 * t * d * 2 / 1e6
        for full in (False, True):
            want = reference(idx, a, b, x, init, full)
            moved = m * p * 2 * d * 2 + m * d * 2 + (m * d * (2 + 4) if full else 0)  # rows, out, x + init
            parts = []
            for sb, warps in VARIANTS:
                got = gather_sum(idx, a, b, x, init, sb, warps, full)
                ok = bool(torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2))
                ms = time_ms(lambda sb=sb, warps=warps: gather_sum(idx, a, b, x, init, sb, warps, full), device=dev,
                             rep_ms=rep)
                parts.append(f"SB {sb} / {warps} warps {ms:.3f} ms {moved / ms / 1e9:.2f} TB/s ok {ok}")
            what = "rows + x + init + out" if full else "rows + out"
            print(f"M={m} P={p} tables 2 x {t} rows ({table_mb:.0f} MB), {what} ({moved / 1e9:.2f} GB): "
                  + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
