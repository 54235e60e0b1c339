"""Which launch of the hot/cold op issues the one ``Memset (Device)`` per call seen in its kernel profile (session 21's
and session 25's): the hot down GEMM (cuBLAS, fp32 output) alone, the same GEMM with a bf16 output, and one Triton
launch (the list pass), each profiled over a few calls.  Usage (GPU machine): ``PYTHONPATH=src python3
scripts/memset_source_probe.py``; ``--device cpu --tiny`` runs the calls without a profile (the smoke test)."""

from __future__ import annotations

import torch

from twell.bench.model_measure import kernel_lines, profile_kernels
from twell.bench.probe import probe_args
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.twell_list_kernel import launch_list_twell_rows


def main() -> None:
    dev, tiny = probe_args(__doc__)
    m, h, d, f, tile, cap = (64, 32, 64, 256, 32, 4) if tiny else (16384, 256, 2048, 5632, 128, 16)
    gen = torch.Generator(device=dev).manual_seed(0)
    dtype = torch.bfloat16
    hid = torch.relu(torch.randn(m, h, generator=gen, device=dev)).to(dtype)
    w = (torch.randn(h, d, generator=gen, device=dev) / h**0.5).to(dtype)
    g = (torch.randn(m, f, generator=gen, device=dev) - 2.6).to(dtype)  # ~0.5 % positive
    container = launch_pack_twell(g, tile, cap)
    cuda = dev.type == "cuda"  # (out_dtype on a bf16 mm is CUDA's; the CPU smoke test multiplies in fp32)
    fns = {"mm fp32 out": lambda: torch.mm(hid, w, out_dtype=torch.float32) if cuda else hid.float() @ w.float(),
           "mm bf16 out": lambda: torch.mm(hid, w),
           "list pass": lambda: launch_list_twell_rows(*container, tile=tile, unit_map=None, idx_is_unit=False)}
    for name, fn in fns.items():
        fn()
        if not cuda:
            print(f"M={m} {name}: ran (no CUDA profile on {dev})", flush=True)
            continue
        prof = profile_kernels(fn, dev, top=6, calls=16)
        print(f"M={m} {name}: kernels {prof['kernel_ms']:.4f} ms/call", flush=True)
        print(kernel_lines(prof), flush=True)


if __name__ == "__main__":
    main()
