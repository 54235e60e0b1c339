"""Where the batch decode up kernel's ~10 us go: its GPU time with no unit firing, with the synthetic problem's
units firing, with every unit firing, and an empty kernel on the same grid, all CUDA-graph timed.

Why: at d=2048, F=5632 the up kernel (twell.ops.decode_batch_kernels._batch_up_kernel) took 10.0-10.1 us at
2-16 tokens whether 0.5 % or 2 % of the units fire (decode_probe_final_call6_session33.log), while the rows
it reads (~470 Wu rows of 4 KB: the synthetic union at eight tokens and 0.5 %) take well under a
microsecond at the H200's bandwidth, and no K-loop configuration moved it
(decode_probe_pdl_call5_session33.log).  If the time with nothing firing is most of it, the cost is the
launch and the g pass, not the up projection.

Columns per (d, F, M): ``empty`` (a kernel that only returns, same grid and warps), ``none`` (g < 0
everywhere: the g pass, flags and counts, no up projection), ``real`` (the synthetic problem's g at 0.5 %;
5 % with ``--tiny``), ``all`` (g > 0 everywhere: every block runs the up projection), then ``real`` under
each _UP_CONFIG of UP_VARIANTS; the down kernel (with its partial sum) with no unit firing and with the
real flags.

    PYTHONPATH=src:scripts python3 scripts/batch_up_probe.py            # GPU machine
    PYTHONPATH=src:scripts python3 scripts/batch_up_probe.py --ptx      # no GPU: per-warp PTX counts, sm_90a
    TRITON_INTERPRET=1 PYTHONPATH=src:scripts python3 scripts/batch_up_probe.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import math

import torch
import triton
import triton.language as tl
from decode_probe import FLUSH_BYTES, eager_ms, graph_ms

from twell.ops import decode_batch_kernels as dbk
from twell.ops.decode_kernels import _HIDDEN_BU
from twell.synthetic import SparsityProfile, synthetic_ffn_problem
from twell.tolerances import REL_TOL, rel_error

#: (BK, stages, warps) of the up kernel timed on the real g besides the shipped one.  Fewer warps: with BM = BU = 16
#: the dot has two m16n8 tiles, and the shipped four warps each load operands from shared memory: 192 ldmatrix per
#: K step against 64 for one warp, 96 for two (``--ptx``, bench_results/sm90_offline/batch_up_ptx_session36.log);
#: session 35's ncu had L1/TEX 77 % busy while 4 % of DRAM's bandwidth was used (ncu_batch_up_call3_session35.log).
#: BK = 256 halves the shared memory (32 KB: seven programs per SM instead of three).
#: Above 16 tokens a variant runs with BK = 128 (``dbk._UP_LARGE_M_CONFIG``'s), its stages and warps.  (512, 3, 4) was
#: shipped until session 39, which shipped session 38's faster (256, 3, 2) and, at 17-32 tokens, (128, 3, 1).
UP_VARIANTS = [(512, 3, 4), (512, 3, 2), (256, 3, 2), (512, 3, 1), (256, 3, 1), (1024, 2, 1), (512, 1, 4),
               (2048, 1, 4)]
#: Token tiles (two programs of 32 rows a unit block at 33-64 tokens) were timed here in session 40 and lost everywhere
#: (bench_results/h100/batch_up_probe_calluptiles_session40.log); the kernel dropped them in session 41.


@triton.jit
def _empty_kernel(p_ptr):
    if tl.program_id(0) < 0:  # never true: keeps the pointer argument, does nothing
        tl.store(p_ptr, 0)


def probe(d: int, f: int, m: int, device: torch.device, reps: int, rep_ms: float, dens: float = 0.5) -> str:
    gen = torch.Generator(device=device).manual_seed(31 * m + f)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=dens / 100 * f), generator=gen, device=device)
    x, wg, wu = p["x"], p["w_gate"], p["w_up"]
    n_sets = max(1, min(16, math.ceil(FLUSH_BYTES / (wu.numel() * wu.element_size())))) if device.type == "cuda" else 1
    wus = [wu] + [wu.clone() for _ in range(n_sets - 1)]
    g = torch.nn.functional.linear(x, wg)
    gs = {"none": -(g.abs() + 1), "real": g, "all": g.abs() + 1}
    wdt = p["w_down"].t().contiguous()
    flags = {k: dbk.launch_batch_up(x, v, wu, match=True) for k, v in gs.items()}
    scratch = torch.empty(1, device=device)
    n_blocks = triton.cdiv(f, _HIDDEN_BU)

    def timed(fns: list) -> float:
        fns = fns * max(1, 16 // len(fns))
        return graph_ms(fns, reps) if device.type == "cuda" else eager_ms(fns, device, rep_ms)

    bm = max(16, triton.next_power_of_2(m))
    warps = dbk.up_config(bm)[2]
    cols = {"empty": timed([lambda: _empty_kernel[(n_blocks,)](scratch, num_warps=warps)])}
    for k, gk in gs.items():
        cols[k] = timed([lambda w=w, gk=gk: dbk.launch_batch_up(x, gk, w, match=True) for w in wus])
    default = dbk._UP_CONFIG, dbk._UP_LARGE_M_CONFIG
    shipped_ht, shipped_fires = flags["real"][0], flags["real"][1].bool()
    variants = [(f"real{cfg}", cfg, {b: (c[0], *cfg[1:]) for b, c in default[1].items()}) for cfg in UP_VARIANTS]
    try:
        for name, small, large in variants:
            dbk._UP_CONFIG, dbk._UP_LARGE_M_CONFIG = small, large
            try:  # h^T against the shipped launch's: the sums' order inside a K step may differ (wgmma, mma.sync)
                ht_v = dbk.launch_batch_up(x, g, wu, match=True)[0]
                if rel_error(ht_v[shipped_fires], shipped_ht[shipped_fires]) > REL_TOL[ht_v.dtype]:
                    cols[name] = "FAILED h^T differs from the shipped launch's beyond the tolerance"
                    continue
                cols[name] = timed([lambda w=w: dbk.launch_batch_up(x, g, w, match=True) for w in wus])
            except Exception as exc:  # noqa: BLE001 - a configuration that does not build: report, go on
                cols[name] = f"FAILED {type(exc).__name__}: {str(exc)[:60]}"
    finally:
        dbk._UP_CONFIG, dbk._UP_LARGE_M_CONFIG = default
    for k in ("none", "real"):
        ht, fires, _ = flags[k]
        cols[f"down_{k}"] = timed([lambda: dbk.launch_batch_down(ht, fires, wdt, x.dtype)])
    fired = {k: int(v[1].sum()) for k, v in flags.items()}
    body = " ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in cols.items())
    return (f"d={d:5d} F={f:6d} M={m:3d} | ms: {body} | firing units none/real/all {fired['none']}/{fired['real']}/"
            f"{fired['all']} | weight sets {n_sets}")


def ptx_counts(configs: list[tuple[int, int, int]], bm: int = 16) -> list[str]:
    """Per (BK, stages, warps): ptxas's registers, the shared memory Triton allots, and the PTX's per-thread
    ldmatrix / mma.sync / cp.async counts of one K step (the loop body is emitted once) for BM = ``bm``, sm_90a,
    compiled as a launch at d = 2048 specialises it.  Every warp of a program runs this code, so ldmatrix x warps is how
    many ldmatrix a program issues per K step to read its dot operands from shared memory, duplicates included."""
    from triton.backends.compiler import GPUTarget

    from twell.ops import compile_check as cc

    out = []
    for bk, stages, warps in configs:
        cons = {"BM": bm, "BU": _HIDDEN_BU, "BK": bk, "DOT_FP32": False, "MATCH": True, "K_STAGES": stages,
                "PDL": True, "EARLY": False}
        kernel = cc._compiled(dbk._batch_up_kernel, cc.BATCH_UP_SIGNATURE, cons, GPUTarget("cuda", 90, 32),
                              divisible=("D", "stride_xm", "stride_wu"), num_warps=warps)
        ptx = kernel.asm["ptx"]
        use = cc._usage(ptx, 90)
        ldm = ptx.count("ldmatrix")
        out.append(f"({bk}, {stages}, {warps}) BM={bm}: {use.get('registers')} registers, spill "
                   f"{use.get('spill_bytes')} B, shared {kernel.metadata.shared} B; per thread: ldmatrix {ldm}, "
                   f"mma.sync {ptx.count('mma.sync')}, cp.async {ptx.count('cp.async.cg') + ptx.count('cp.async.ca')}"
                   f"; ldmatrix x warps {ldm * warps}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="one small shape (CPU interpreter smoke test)")
    ap.add_argument("--reps", type=int, default=50, help="graph replays per point")
    ap.add_argument("--ptx", action="store_true", help="only print ptx_counts per configuration (no GPU), then exit")
    args = ap.parse_args()
    if args.ptx:
        for line in ptx_counts([dbk._UP_CONFIG, *UP_VARIANTS]):
            print(line, flush=True)
        print(ptx_counts([dbk.up_config(64)], bm=64)[0], "(shipped at 33-64 tokens)", flush=True)
        return
    device = torch.device(args.device)
    shapes, ms_, rep_ms, dens = [(2048, 5632), (1536, 8960), (4096, 14336)], (2, 8, 32, 64), 100.0, 0.5
    if args.tiny:  # 5 %: some of the 160 units fire; 40 tokens: BM = 64, the 33-64 token configuration
        shapes, ms_, rep_ms, dens = [(64, 160)], (2, 40), 1.0, 5.0
    if device.type == "cuda":
        print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    for d, f in shapes:
        for m in ms_:
            try:
                print(probe(d, f, m, device, args.reps, rep_ms, dens), flush=True)
            except Exception as exc:  # noqa: BLE001 - report every point, keep going
                print(f"d={d} F={f} M={m}: FAILED {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
