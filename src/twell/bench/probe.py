"""The command line every GPU probe script shares (``scripts/*_probe.py``): ``--device`` and ``--tiny``."""

from __future__ import annotations

import argparse

import torch
import triton


def probe_args(doc: str) -> tuple[torch.device, bool]:
    """``(device, tiny)`` from the command line of a probe whose module docstring is ``doc`` (its first line
    is the help text); on a CUDA device prints the GPU and the torch / Triton versions first, so that each
    log says what it ran on.  ``--tiny`` (small shapes, for TRITON_INTERPRET=1 on the CPU) is the smoke test."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small shapes (CPU interpreter smoke test)")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda":
        print(torch.cuda.get_device_name(dev), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    return dev, a.tiny
