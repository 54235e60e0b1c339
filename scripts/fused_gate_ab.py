"""Energy and time per call of the fused hot/cold gate, the cold gather (list pass included) and the whole
hot/cold op with some module constants of ``twell.ops`` changed together, back to back at the power cap
(``clock_probe.measure``; shipped values, other values, shipped again), at M=131072 and 16384, l0=28, d=2048,
F=5632, 576 hot units by default (``--ms``, ``--shape``, ``--l0``, ``--hot`` change them).

Why: at M=131072 time per call follows energy per call (session 12), and the epilogue's joules are the
fused gate's lever (session 15 clock probe: 4.012 J against 3.333 for its mainloop alone); a switch that
changes the epilogue is judged on both figures, measured in one run.  The gather is timed on its own as
well, so that a change of a few percent of it is not lost in the op's spread.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/fused_gate_ab.py FUSED_TMA_SLOTS``.  A change is a
boolean switch of ``hot_cold_gate_kernel`` (set to the opposite of the first one's shipped value) or
``module.NAME=value`` for a constant of a ``twell.ops`` module (``twell_list_kernel.LIST_MAX=128``,
``hot_cold_gate_kernel._GPU_CONFIG=(128,64,4,8)``, ``hot_cold.COLD_UNIT_IDS=False``);
several, comma-separated, change together.  ``--device cpu --tiny`` under TRITON_INTERPRET=1 is the smoke
test.
"""

from __future__ import annotations

import argparse
import ast
import importlib

import torch
from clock_probe import Nvml, measure  # scripts/ (the script's own directory is on sys.path)

from twell.bench.probe import split_problem
from twell.ops import hot_cold, hot_cold_gate_kernel
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan
from twell.ops.twell_ffn_kernel import launch_twell_ffn


def _split_top_level(spec: str) -> list[str]:
    """``spec`` split at the commas outside brackets (a value may be a tuple: ``_GPU_CONFIG=(128,64,4,8)``)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    return [*items, spec[start:]]


def parse_changes(spec: str) -> list[tuple[object, str, object, object]]:
    """``(module, name, shipped value, other value)`` per comma-separated change of ``spec`` (see the module
    docstring); SystemExit naming the problem for an unknown module or constant, or a value of another type."""
    changes = []
    first_flip = None
    for item in _split_top_level(spec):
        if "=" in item:
            target, text = item.split("=", 1)
            mod_name, _, name = target.rpartition(".")
            try:
                module = importlib.import_module(f"twell.ops.{mod_name}")
                value = ast.literal_eval(text)
            except (ImportError, ValueError, SyntaxError) as e:
                raise SystemExit(f"{item}: expected module.NAME=value for a twell.ops module ({e})") from e
        else:
            module, name, value = hot_cold_gate_kernel, item, None
        shipped = getattr(module, name, None)
        if value is None:
            if not isinstance(shipped, bool):
                raise SystemExit(f"{name} is not a boolean switch of twell.ops.hot_cold_gate_kernel")
            first_flip = (not shipped) if first_flip is None else first_flip
            value = first_flip
        elif type(shipped) is not type(value):
            raise SystemExit(f"{item}: {module.__name__}.{name} is {shipped!r}; the value must be of type "
                             f"{type(shipped).__name__}")
        changes.append((module, name, shipped, value))
    return changes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("changes", help="switches of hot_cold_gate_kernel or module.NAME=value, comma-separated")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--shape", default="2048x5632", help="d x F of the problem (default 2048x5632)")
    ap.add_argument("--ms", type=int, nargs="+", default=[131072, 16384], help="token counts")
    ap.add_argument("--l0", type=float, default=28.0, help="mean active units a token")
    ap.add_argument("--hot", type=int, default=576, help="hot units (the most frequent ones)")
    a = ap.parse_args()
    changes = parse_changes(a.changes)
    dev = torch.device(a.device)
    try:
        d, f = (int(v) for v in a.shape.lower().split("x"))
    except ValueError as e:
        raise SystemExit(f"--shape {a.shape!r}: expected DxF, e.g. 4096x14336") from e
    tile, cap, n_hot, points, seconds, l0 = 128, 16, a.hot, tuple(a.ms), 2.0, a.l0
    if a.tiny:
        d, f, tile, cap, n_hot, points, seconds, l0 = 64, 700, 32, 8, 64, (40,), 0.1, 28.0
    nvml = Nvml((dev.index or 0) if dev.type == "cuda" else None)
    if dev.type == "cuda":
        print(torch.cuda.get_device_name(dev), "torch", torch.__version__, flush=True)
    for m in points:
        p = split_problem(m, d, f, l0, dev)
        x, wg, wu, wd, wdt = p.x, p.w_gate, p.w_up, p.w_down, p.w_down_t
        hot = p.by_frequency[:n_hot]
        fused = build_hot_cold_plan(wg, wu, wd, hot, fused_tile=tile)
        outs = {}
        for label in ("shipped", "changed", "shipped"):  # the shipped values again: the order's drift shows
            for module, name, shipped, other in changes:
                setattr(module, name, shipped if label == "shipped" else other)
            unit_ids = hot_cold.stores_unit_ids(f)  # as the op decides it, under this setting

            def fused_gate(unit_ids=unit_ids):
                return launch_hot_cold_gate(x, fused.w_gemm, n_hot, f - n_hot, fused.cold, tile=tile, capacity=cap,
                                            unit_ids=unit_ids)

            # the gather (its list pass included) on this setting's fused gate outputs, as the op runs it
            h_hot, _, *cold = fused_gate()
            init = hot_cold._hot_partial(h_hot, fused.w_down_hot_t)
            out = torch.empty_like(x)
            fns = {"fused gate": fused_gate,
                   "cold gather": lambda cold=cold, init=init, out=out, unit_ids=unit_ids: launch_twell_ffn(
                       x, *cold, None, None, wg, wu, wdt, n_cols=f - n_hot, tile=tile, round_hidden=True, out=out,
                       unit_map=fused.cold, init=init, idx_is_unit=unit_ids),
                   "hot/cold op": lambda: hot_cold.launch_hot_cold_ffn(x, fused, wg, wu, wdt, tile=tile, capacity=cap)}
            outs[label] = fns["hot/cold op"]()[0]
            for name, fn in fns.items():
                print(f"M={m:6d} {a.changes} {label} | " + measure(name, fn, nvml, dev, seconds), flush=True)
        print(f"M={m:6d} op outputs equal bit for bit: {torch.equal(outs['shipped'], outs['changed'])}", flush=True)
        for module, name, shipped, _ in changes:
            setattr(module, name, shipped)


if __name__ == "__main__":
    main()
