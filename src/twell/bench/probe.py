"""What the GPU probe scripts share (``scripts/*_probe.py``): the command line (``--device``, ``--tiny``), the
hot/cold split probes' points and problems, and the registers and spills of the kernel builds a probe launched."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import triton

from ..format.twell import live_slots
from ..nn import hot_cold_cache
from ..ops import hot_cold_dense_rows
from ..ops.hot_cold_plan import unit_frequency
from ..synthetic import SparsityProfile, synthetic_ffn_problem
from .shape_arg import parse_shape


def probe_parser(doc: str) -> argparse.ArgumentParser:
    """The probes' command line: ``--device`` and ``--tiny``, its help the first line of ``doc``; a probe adds
    its own options and parses it, then calls :func:`probe_device`."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small shapes (CPU interpreter smoke test)")
    return ap


def add_long_row_args(ap: argparse.ArgumentParser) -> None:
    """The dense-row pass's long-row switches for one run (``--heavy-pairs``, ``--[no-]count-heavy``; default: as
    shipped), set by :func:`apply_long_row_args` after parsing."""
    ap.add_argument("--heavy-pairs", type=int, default=None,
                    help="the heavy-row bound for this run at every call size (hot_cold_dense_rows.HEAVY_ROW_PAIRS "
                         "and HEAVY_ROW_PAIRS_LARGE both): rows with more cold pairs than this (and no overflowing "
                         "tile) also go to the dense-row pass, in the slots the overflowing rows leave (0: none); "
                         "default: as shipped (64 below 8192 tokens, 128 from there)")
    ap.add_argument("--count-heavy", action=argparse.BooleanOptionalAction, default=None,
                    help="hot_cold_cache.DENSE_ROWS_COUNT_HEAVY for this run: small calls' dense-row budgets count the "
                         "refresh sample's heavy rows too; default: as shipped")


def apply_long_row_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Set the switches :func:`add_long_row_args` parsed (both modules read them at call time); a negative bound ends
    the command with the accepted values."""
    if a.heavy_pairs is not None:
        if a.heavy_pairs < 0:
            ap.error(f"--heavy-pairs must be >= 0 (0: off), got {a.heavy_pairs}")
        hot_cold_dense_rows.HEAVY_ROW_PAIRS = hot_cold_dense_rows.HEAVY_ROW_PAIRS_LARGE = a.heavy_pairs
    if a.count_heavy is not None:
        hot_cold_cache.DENSE_ROWS_COUNT_HEAVY = a.count_heavy


def probe_device(name: str) -> torch.device:
    """``torch.device(name)``; on CUDA the GPU and the torch / Triton versions are printed first (each log says
    what it ran on)."""
    dev = torch.device(name)
    if dev.type == "cuda":
        print(torch.cuda.get_device_name(dev), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    return dev


def probe_args(doc: str) -> tuple[torch.device, bool]:
    """``(device, tiny)`` from the command line of a probe whose module docstring is ``doc`` (its first line
    is the help text); on a CUDA device prints the GPU and the torch / Triton versions first, so that each
    log says what it ran on.  ``--tiny`` (small shapes, for TRITON_INTERPRET=1 on the CPU) is the smoke test."""
    a = probe_parser(doc).parse_args()
    return probe_device(a.device), a.tiny


def probe_shape_args(doc: str, default_shape: str) -> tuple[torch.device, bool, tuple[int, int]]:
    """:func:`probe_args` plus ``--shape HIDDENxFFN`` (default ``default_shape``): ``(device, tiny, (d, f))``."""
    ap = probe_parser(doc)
    ap.add_argument("--shape", type=parse_shape, default=parse_shape(default_shape),
                    help=f"HIDDENxFFN of the problem (default {default_shape})")
    a = ap.parse_args()
    return probe_device(a.device), a.tiny, a.shape


@dataclass(frozen=True)
class SplitProbeSetup:
    """The points of the hot/cold split probes: (M, l0) pairs of the synthetic problem at ``d`` x ``f``, the hot
    units each point's plan takes (by l0), the timing budget and the TwELL tile and capacity."""

    d: int
    f: int
    points: tuple[tuple[int, float], ...]
    hot_units: dict[float, int]
    rep_ms: float
    tile: int
    cap: int


def split_probe_setup(tiny: bool) -> SplitProbeSetup:
    """At d=2048, F=5632: M=16384 and 131072 at l0=28 (0.5 %) with 576 hot units, M=131072 at l0=56 with 1344,
    tile 128, capacity 16; ``tiny``: one small point for the CPU interpreter."""
    if tiny:
        return SplitProbeSetup(64, 700, ((40, 6.0),), {6.0: 64}, 1.0, 32, 4)
    return SplitProbeSetup(2048, 5632, ((16384, 28.0), (131072, 28.0), (131072, 56.0)), {28.0: 576, 56.0: 1344},
                           100.0, 128, 16)


@dataclass(frozen=True)
class SplitProblem:
    """One point's synthetic problem as the split probes use it: the FFN weights, Wd^T contiguous (the row
    gather's layout), each unit's firing frequency (``unit_frequency``, fp32 [F]) and the units by it, most
    frequent first (the hot set is a prefix)."""

    x: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    w_down_t: torch.Tensor
    frequency: torch.Tensor
    by_frequency: torch.Tensor


def split_problem(m: int, d: int, f: int, l0: float, device: torch.device) -> SplitProblem:
    """The synthetic problem of ``twell bench ffn`` at ``m`` tokens, ``d`` x ``f``, mean l0 ``l0`` (seed 0, so every
    probe draws the same one), with its units ranked as ``SparseGatedMLP`` ranks them for the hot set."""
    gen = torch.Generator(device=device).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0), generator=gen, device=device)
    x, wg, wd = p["x"], p["w_gate"], p["w_down"]
    freq = unit_frequency(x, wg)
    return SplitProblem(x, wg, p["w_up"], wd, wd.t().contiguous(), freq, torch.argsort(freq, descending=True))


def run_points(points: Iterable[tuple[int, float]], probe: Callable[[int, float], None], device: torch.device) -> None:
    """``probe(m, x)`` for each point ``(m, x)`` (tokens and l0 or density), the allocator's cache emptied between
    points on CUDA (the problems at M=131072 take tens of GB)."""
    for m, l0 in points:
        probe(m, l0)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def builds_of(kernel: object) -> dict[str, object]:
    """The compiled builds of a ``@triton.jit`` kernel launched so far in this process, by cache key (empty under
    the interpreter, which compiles nothing)."""
    caches = getattr(kernel, "device_caches", None) or {}
    return {f"{dev}:{key}": build for dev, cache in caches.items() for key, build in cache[0].items()}


def new_build_resources(kernel: object, before: dict[str, object]) -> str:
    """Registers, spilled bytes and warps of the builds of ``kernel`` that are not in ``before`` (a
    :func:`builds_of` taken earlier), as the driver loaded them: the ground truth behind the offline ptxas
    figures.  '' when there is none (the interpreter, or a build launched before)."""
    parts = []
    for key, build in builds_of(kernel).items():
        if key not in before:
            regs, spills = getattr(build, "n_regs", None), getattr(build, "n_spills", None)
            warps = getattr(getattr(build, "metadata", None), "num_warps", None)
            parts.append(f"{regs} registers, {spills} B spilled, {warps} warps")
    return "; ".join(parts)


def gate_outputs_agree(a: tuple, b: tuple) -> dict[str, bool]:
    """Which outputs of two hot/cold gate launches (``(h_hot, hot_counts, values, indices, cold_counts)``) are
    equal bit for bit: h and the counts whole, the cold container on its used slots (a slot past a row's count
    is never read, and the kernels leave it as allocated)."""
    h_a, hc_a, val_a, idx_a, cc_a = a
    h_b, hc_b, val_b, idx_b, cc_b = b
    used = live_slots(cc_a, val_a.shape[-1])
    bits = torch.int16 if h_a.element_size() == 2 else torch.int32
    return {"h": torch.equal(h_a.view(bits), h_b.view(bits)), "hot counts": torch.equal(hc_a, hc_b),
            "cold counts": torch.equal(cc_a, cc_b),
            "values": torch.equal(val_a.view(bits)[used], val_b.view(bits)[used]),
            "ids": torch.equal(idx_a[used], idx_b[used])}
