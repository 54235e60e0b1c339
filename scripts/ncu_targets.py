"""One launch of each kernel worth profiling, at M=131072, d=2048, F=5632, l0~28 (run under ncu).

``--target hotcold`` (the default since session 8): the shipped hot/cold op with the fused gate kernel
(``_hot_cold_gate_kernel``: GEMM + hot hidden state + cold TwELL pack; then the hot down GEMM and the
cold gather), hot units chosen as ``twell bench ffn`` does.  ``--target legacy``: the session 3 set
(the pack, the row-gather FFN, the block-union kernels).

    ncu --clock-control none -k regex:'_hot_cold_gate|_twell_ffn_row' -c 2 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy --section SourceCounters \
        python3 scripts/ncu_targets.py --target hotcold

(``scripts/gpu_all.sh`` stage ``ncu`` runs that and keeps the report; ``--ms 16384 131072`` profiles the
op at both token counts, with ``NCU_COUNT=4`` for ncu's ``-c``.)  ``--target batch --ms 2 8``: the batch
decode kernels at 2 and 8 tokens (four launches per call, two calls per M).  ``--device cpu --tiny`` runs the
hot/cold target small under TRITON_INTERPRET=1 and checks it against the dense reference (smoke test).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from twell.synthetic import SparsityProfile, synthetic_ffn_problem


def _problem(dev: torch.device, tiny: bool = False, m: int = 131072) -> tuple[torch.Tensor, ...]:
    m, d, f, l0 = (40, 64, 700, 6.0) if tiny else (m, 2048, 5632, 28.0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0),
                              generator=torch.Generator(device=dev).manual_seed(0), device=dev)
    return p["x"], p["w_gate"], p["w_up"], p["w_down"]


def hot_cold(dev: torch.device, tiny: bool = False, m: int = 131072) -> None:
    """The op as ``SparseGatedMLP`` runs it at this shape and ``m`` tokens (fused gate, TwELL cold format);
    ``tiny``: a small problem checked against the dense float32 reference."""
    from twell import ops
    from twell.ops import hot_cold as hc
    from twell.reference.inference import dense_gated_ffn
    from twell.tolerances import REL_TOL, rel_error

    x, wg, wu, wd = _problem(dev, tiny, m)
    tile, cap = (32, 4) if tiny else (128, 16)
    hot = ops.choose_hot_units(ops.unit_frequency(x, wg))
    plan = ops.build_hot_cold_plan(wg, wu, wd, hot, fused_tile=tile)
    out, _ = hc.launch_hot_cold_ffn(x, plan, wg, wu, wd.t().contiguous(), tile=tile, capacity=cap)
    if tiny:
        ref = dense_gated_ffn(x.float(), wg.float(), wu.float(), wd.float(), precision="fp32")
        err = rel_error(out, ref)
        print(f"M={x.shape[0]} hot/cold with the fused gate: rel {err:.1e} ok {err <= REL_TOL[out.dtype]}")


def batch_decode(dev: torch.device, tiny: bool, m: int) -> None:
    """The batch decode kernels (twell.ops.decode_batch_kernels: cuBLAS gate, up kernel, split down kernel,
    partial sum) at ``m`` tokens, d=2048, F=5632, 0.5 %, with the unit-major Wd^T SparseGatedMLP passes;
    twice (the first launch compiles).  ``tiny``: small, checked against the dense float32 reference."""
    from twell.ops.decode_batch_kernels import launch_batch_ffn
    from twell.reference.inference import dense_gated_ffn
    from twell.tolerances import REL_TOL, rel_error

    d, f, l0 = (64, 700, 6.0) if tiny else (2048, 5632, 28.0)
    gen = torch.Generator(device=dev).manual_seed(m)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0), generator=gen, device=dev)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    wdt = wd.t().contiguous()
    for _ in range(2):
        out = launch_batch_ffn(x, wg, wu, wdt)[0]
    if tiny:
        err = rel_error(out, dense_gated_ffn(x.float(), wg.float(), wu.float(), wd.float(), precision="fp32"))
        print(f"M={m} batch decode kernels: rel {err:.1e} ok {err <= REL_TOL[out.dtype]}")


def legacy(dev: torch.device) -> None:
    from twell.ops.block_union_kernel import launch_block_union_ffn
    from twell.ops.gate_kernel import launch_pack_twell
    from twell.ops.twell_ffn_kernel import launch_twell_ffn

    x, wg, wu, wd = _problem(dev)
    wdt = wd.t().contiguous()
    g = F.linear(x, wg)
    v, i, c = launch_pack_twell(g, 128, 16)
    out = torch.empty(x.shape[0], x.shape[1], dtype=x.dtype, device=dev)
    launch_twell_ffn(x, v, i, c, None, None, wg, wu, wdt, n_cols=wg.shape[0], tile=128, round_hidden=True, out=out)
    launch_block_union_ffn(x, g, wu, wdt, round_hidden=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=["hotcold", "legacy", "batch"], default="hotcold")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a small hot/cold problem (CPU interpreter smoke test)")
    ap.add_argument("--ms", type=int, nargs="+", default=[131072],
                    help="token counts of the hot/cold target, one op each in this order (ncu -c: 2 per M)")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if a.target == "hotcold":
        for m in a.ms:
            hot_cold(dev, a.tiny, m)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    elif a.target == "batch":
        for m in a.ms:
            batch_decode(dev, a.tiny, m)
    else:
        legacy(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
