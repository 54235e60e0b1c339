"""The hot/cold op's launches after its gate, the shipped ones against the list pass beside the gate, on the GPU.

Why (session 25): at M=16384, l0=28 the op's kernels summed 0.811 ms in session 21's profile, of which the counts'
concatenation took 0.004 ms and the heavy queue's zero fill ~0.001, each with a launch of its own, and the list pass
0.015 ms right after the 0.046 ms hot down GEMM (bench_results/h200/infer_op_profile_session21.log); 2.0x of the
dense 1.611 ms there needs the op at ~0.805 ms against the 0.822 measured (session 22's sweep).  Session 25 has the
fused gate write both counts into one buffer and zero the queue's counter, and (``hot_cold.LIST_PDL``) launches the
list pass and the gather as programmatic dependents.  Predicted at 16384: -0.005 ms for the first two, -0.003 to
-0.015 more with the dependents (launch latency only, or the list pass wholly beside the GEMM); at 131072 -0.02 and
up to -0.09 (its list pass).  Measured (call 1, bench_results/h200/tail_probe_session25.log): 0.8149 -> 0.8059 ->
0.8029 ms at 16384 (dense 1.5995), 6.2874 -> 6.2585 -> 6.2589 at 131072: the GEMM lets the list pass launch only as
it ends.  Then (``hot_cold.LIST_BESIDE_GATE``, variant "beside") the list pass beside the gate, after its row-block
counters: predicted -0.010 to -0.015 ms more at 16384, -0.05 to -0.09 at 131072.  Measured (call 3,
tail_probe_beside_session25.log): 1.7069 against 0.8184 ms at 16384, the gate 1.441 against 0.533 ms.  Session 26
found offline that the gate's ``tl.debug_barrier()`` before each release had stopped its software pipeliner; with
the barrier and release in inline PTX the loop is pipelined again, and the list programs may launch from the gate's
last rounds of tiles (``hot_cold.LIST_BESIDE_ROUNDS``).  Variants "beside@start" (launched as the gate starts, as
in session 25) and "beside@R" (from the last R rounds).  Predicted: every beside variant within ~1 % of "now+pdl" in
the gate's own time (0.533 ms at 16384), the op -0.010 to -0.015 ms at 16384 from the last round (the list pass's
0.015 ms in the ~0.023 ms round where 92 of 132 SMs have no tile), -0.02 to -0.09 at 131072 with more rounds; from the
start, less or a loss if the waiting programs' polls cost the gate.  Session 26's call 1 (tail_probe_session26.log):
the gate 0.521 against 0.510-0.514 ms with its counts released, the list pass spanning 0.037-0.046 ms from the gate's
last round on, the op 0.806-0.807 against 0.7975 ms; then each count released a mainloop late (its fence then waits on
no stores), the poll a plain acquire load, and the SMs configured for the gate's shared memory and a list program's
("-nocarve": without).  Predicted: the gate back within 0.003 ms of 0.510-0.514; from the start, with the carveout, the
list programs beside the gate, the pass ending within ~0.003 ms of the gate; the op -0.010 to -0.015 ms at 16384 and
-0.05 to -0.08 at 131072 against "now+pdl".  Call 2 (tail_probe_call2_session26.log): every beside variant tied
"now+pdl" (0.8030-0.8035 against 0.8035 ms at 16384), the gate 0.526-0.562 against 0.519-0.520, the pass still
spanning 0.036-0.046 ms with or without the carveout: its programs began only as the gate's ended.  Then the gate's
hot tiles last (``hot_cold.LIST_BESIDE_HOT_LAST``; "-grouped": the grouped order), so that the list programs find
every row block ready as the gate's programs end.  Predicted at 16384: "beside@1" -0.008 to -0.013 ms against
"now+pdl" (the pass's 0.015 ms, most of it in the gate's last round on the 92 SMs then free), "-grouped" as call 2;
at 131072 -0.01 to -0.02 (one round of the pass's 0.09 ms).  Call 3 (tail_probe_call3_session26.log): no change
(0.8137 against 0.8109 ms, the pass spanning 0.037 ms either way).  Read from the spans: every list program ended
with ``griddepcontrol.wait`` and so held its SM until the gate ended; with ``twell_list_kernel.LIST_ONE_WAITS`` only
the last waits ("-onewait").  Predicted for the next run: "beside@1-onewait" -0.008 to -0.013 ms against "now+pdl"
at 16384, "now+pdl-onewait" as "now+pdl".  Session 27's call 1 (tail_probe_call1_session27.log): 0.8075 against
0.8128 ms (-0.005, 2.005x; the pass's span 0.028 ms against 0.037), "now+pdl-onewait" 0.8124; both switches are now
on by default, so "now+pdl" is no longer the shipped launch order but session 26's.

Per point (the module's own hot set, built as ``twell bench ffn`` builds it): interleaved medians
(``time_ms_interleaved``, the bench's hold) of the dense FFN with separate linears, the op in each of
:data:`VARIANTS` (session 25's "s24", the launches session 24 left, ran in session 25's calls and session 26's first),
and the module as shipped and with the list pass beside the gate; the outputs compared bit for bit; each
op variant's kernels from ``torch.profiler`` (kernel sum against the call's wall time); then back to back at the
power cap.
Usage (GPU machine): ``PYTHONPATH=src:scripts python3 scripts/tail_probe.py``; ``--device cpu --tiny`` under
TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from clock_probe import Nvml, measure  # scripts/ (the script's own directory is on sys.path)

from twell.bench.model_measure import kernel_lines, profile_kernels
from twell.bench.probe import probe_args, run_points
from twell.bench.timing import time_ms_interleaved
from twell.format.twell import default_capacity
from twell.nn import SparseGatedMLP
from twell.ops import hot_cold, hot_cold_gate_kernel, twell_list_kernel
from twell.ops.hot_cold_plan import build_hot_cold_plan, choose_hot_units, fused_gate_tile, unit_frequency
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

#: The variants timed: see :func:`_variant`.
VARIANTS = ("now", "now+pdl", "now+pdl-onewait", "beside@1", "beside@1-onewait", "beside@1-grouped-onewait",
            "beside@start-onewait")


#: The module switches a variant sets (restored after it).
_SWITCHES = ((hot_cold, "LIST_PDL"), (hot_cold, "LIST_BESIDE_GATE"), (hot_cold, "LIST_BESIDE_ROUNDS"),
             (hot_cold, "LIST_BESIDE_HOT_LAST"), (hot_cold_gate_kernel, "BESIDE_MAX_CARVEOUT"),
             (twell_list_kernel, "LIST_ONE_WAITS"))


@contextlib.contextmanager
def _variant(name: str):
    """The op's launches as ``name`` says: "now" (one counts buffer, the counter zeroed by the gate, no
    dependents), "now+pdl" (and ``LIST_PDL``), "beside@start" / "beside@R" (and
    ``LIST_BESIDE_GATE``, the list programs launched as the gate starts / from its last R rounds of tiles, the gate's
    hot tiles last; with "-grouped" in the grouped order; with "-carve", ``hot_cold_gate_kernel.BESIDE_MAX_CARVEOUT``
    on); "-onewait" (after "now+pdl" or a beside variant): ``twell_list_kernel.LIST_ONE_WAITS`` on."""
    saved = {(mod, attr): getattr(mod, attr) for mod, attr in _SWITCHES}
    try:
        base, *options = name.split("-")
        beside = base.startswith("beside@")
        hot_cold.LIST_PDL = base == "now+pdl" or beside
        hot_cold.LIST_BESIDE_GATE = beside
        twell_list_kernel.LIST_ONE_WAITS = "onewait" in options
        if beside:
            at = base.split("@", 1)[1]
            hot_cold.LIST_BESIDE_ROUNDS = None if at == "start" else int(at)
            hot_cold_gate_kernel.BESIDE_MAX_CARVEOUT = "carve" in options
            hot_cold.LIST_BESIDE_HOT_LAST = "grouped" not in options
        yield
    finally:
        for (mod, attr), value in saved.items():
            setattr(mod, attr, value)


def probe_point(m: int, l0: float, d: int, f: int, tile: int, nvml: Nvml, dev: torch.device, rep_ms: float,
                seconds: float) -> None:
    gen = torch.Generator(device=dev).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0), generator=gen, device=dev)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    wdt = wd.t().contiguous()
    mlp = SparseGatedMLP.from_weights(wg, wu, wd, tile=tile, eager_graphs=0).eval()  # the kernels, not a replay
    with torch.no_grad():
        for _ in range(2):  # the first call measures l0 on the dense path, the second builds the plan
            mlp(x)
    plan = mlp._hot_cold._plan
    cap = default_capacity(tile)
    rows = mlp._hot_cold.dense_rows(m)
    if plan is None:  # the module runs dense here (the smoke test's small problem): the op on the default hot set
        hot = choose_hot_units(unit_frequency(x, wg))
        plan = build_hot_cold_plan(wg, wu, wd, hot, fused_tile=fused_gate_tile(tile, x.dtype, d, dev))
        print(f"M={m} l0={l0}: the module took no hot/cold plan; the op on {hot.numel()} hot units", flush=True)
    head = f"M={m:6d} l0={l0:4.1f} H={plan.n_hot} fused={plan.fused_tile} dense_rows={rows}"

    def op(name: str):
        def run():
            with _variant(name):
                return hot_cold.launch_hot_cold_ffn(x, plan, wg, wu, wdt, tile=tile, capacity=cap, dense_rows=rows)
        return run

    def module(name: str):
        def run():
            with _variant(name), torch.no_grad():
                return mlp(x)
        return run

    def dense():
        return F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd)

    names = VARIANTS
    outs = {n: op(n)() for n in names}
    same = all(torch.equal(outs[n][0], outs["now"][0]) and torch.equal(outs[n][1], outs["now"][1]) for n in names)
    same_module = torch.equal(module("now")(), module("beside@1-onewait")())
    print(f"{head}: op outputs and counts bit for bit across variants {same}; module {same_module}", flush=True)
    fns = {"dense": dense, **{f"op {n}": op(n) for n in names}, "module now+pdl": module("now+pdl"),
           "module beside@1-onewait": module("beside@1-onewait")}
    times = time_ms_interleaved(fns, device=dev, rep_ms=rep_ms)
    base = times["dense"]
    print(f"{head} interleaved | " + " | ".join(f"{k} {t:.4f} ms ({base / t:.3f}x)" for k, t in times.items()),
          flush=True)
    if dev.type == "cuda":
        for n in names:
            prof = profile_kernels(op(n), dev, top=12, calls=32)
            print(f"{head} op {n}: kernels {prof['kernel_ms']:.4f} ms/call, wall {prof['wall_ms']:.4f} ms/call",
                  flush=True)
            print(kernel_lines(prof), flush=True)
    for name, fn in (("dense", dense), *((f"op {n}", op(n)) for n in names), ("dense again", dense)):
        print(f"{head} back to back | " + measure(name, fn, nvml, dev, seconds), flush=True)


def main() -> None:
    dev, tiny = probe_args(__doc__)
    d, f, tile, rep_ms, seconds = 2048, 5632, 128, 200.0, 2.0
    points = ((16384, 28.0), (131072, 28.0))
    if tiny:
        d, f, tile, rep_ms, seconds, points = 64, 700, 32, 1.0, 0.1, ((40, 6.0),)
    nvml = Nvml((dev.index or 0) if dev.type == "cuda" else None)
    run_points(points, lambda m, l0: probe_point(m, l0, d, f, tile, nvml, dev, rep_ms, seconds), dev)


if __name__ == "__main__":
    main()
