"""How much the tokens of a 64-token block share their active FFN units in ``twell bench model``'s forward,
layer by layer, against tokens drawn independently with the same unit frequencies.

Why (session 23): with no hot unit (the plain TwELL op, which from 8192 tokens runs the block-union method:
``ops.inference.BLOCK_UNION_MIN_TOKENS``) the 1.5B forward's 28 FFNs took 169.970 ms against 194.895 with the
shipped hot/cold split (``forward_hot_sets_interleaved_session23.log``), while on the synthetic FFN, whose tokens
are independent, the same method loses to the split by 1.7x at 131,072 tokens and 0.5 % (11.09 against 6.51 ms,
``ffn_sweep_dispatch_session22.json``).  Block-union's work per block is 4 d |U| FLOPs a token for the union U of
the block's active units, so what decides between the two is |U|; this prints it.

Per layer (each MLP's input captured in one forward; the gate GEMM in chunks): l0, the mean union of 64 consecutive
tokens, the union expected of 64 independent tokens with the layer's unit frequencies (sum over units of
1 - (1 - p)^64), the same two for the cold units of the layer's current hot set, and the union estimated from 64
evenly spaced blocks of 64 tokens (a 4096-token sample, as a refresh would draw it); and the relative error against
an fp32 FFN of the no-hot-unit op (block-union from 8192 tokens) and of the hot/cold op on that input, at layers
``ERROR_LAYERS`` (CUDA only: the bf16 kernels).  Then the unions of the synthetic problems of ``twell bench ffn``
at ``--points``.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/forward_unions.py``; ``--device cpu --tiny`` is the smoke
test.
"""

from __future__ import annotations

import torch
from forward_layer_times import add_model_args, prepare_forward  # scripts/ (the script's own directory is on sys.path)

from twell.bench.probe import probe_device, probe_parser, split_problem
from twell.format.twell import default_capacity
from twell.ops import hot_cold
from twell.synthetic import UNION_BLOCK, block_unions, independent_union

BLOCK = UNION_BLOCK
#: the layers whose ops are checked against fp32 (the densest first ones, a middle and the last)
ERROR_LAYERS = (0, 1, 9, 27)


def active_of(x: torch.Tensor, w_gate: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    """bool [M, F]: gate pre-activation > 0 (or NaN), the GEMM in chunks of rows."""
    parts = []
    for i in range(0, x.shape[0], chunk):
        g = torch.nn.functional.linear(x[i:i + chunk], w_gate)
        parts.append((g > 0) | g.isnan())
    return torch.cat(parts)


def union_stats(active: torch.Tensor, cold: torch.Tensor | None) -> str:
    """l0, block union, independent-token union (all units and, given ``cold`` ids, the cold ones), sampled."""
    freq = active.float().mean(0)
    l0 = float(active.sum(1).float().mean())
    u = float(block_unions(active).mean())
    iid = independent_union(freq)
    n_blocks = active.shape[0] // BLOCK
    picks = torch.linspace(0, n_blocks - 1, min(64, n_blocks), device=active.device).long()
    sample = active[: n_blocks * BLOCK].view(n_blocks, BLOCK, -1)[picks].reshape(-1, active.shape[1])
    u_sample = float(block_unions(sample).mean())
    line = f"l0 {l0:6.1f} union {u:7.1f} ({u / max(l0, 1e-9):5.2f} l0) independent {iid:7.1f} sampled {u_sample:7.1f}"
    if cold is not None and cold.numel():
        ca = active[:, cold]
        line += (f" | cold l0 {float(ca.sum(1).float().mean()):5.1f} union {float(block_unions(ca).mean()):7.1f}"
                 f" independent {independent_union(freq[cold]):7.1f}")
    return line


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| on the device, in float32 (the inputs hold 268 M values: no float64 host copy)."""
    return float(torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref))


def op_errors(mlp: torch.nn.Module, x: torch.Tensor) -> str:
    """Relative errors vs an fp32 FFN of the plain op (no hot unit) and of the hot/cold op of the layer's plan."""
    wg, wu, wd = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
    ref = (torch.relu(x.float() @ wg.float().t()) * (x.float() @ wu.float().t())) @ wd.float().t()
    cap = mlp.capacity or default_capacity(mlp.tile)
    wdt = mlp.w_down_unit_major()
    plain, _ = torch.ops.twell.sparse_gated_ffn_unchecked(x, wg, wu, wdt, mlp.tile, cap, "match", "triton")
    line = f"rel err: no hot unit {rel_err(plain, ref):.1e}"
    plan = mlp._hot_cold._plan
    if plan is not None:
        out, _ = hot_cold.launch_hot_cold_ffn(x, plan, wg, wu, wdt, tile=mlp.tile, capacity=cap,
                                              dense_rows=mlp._hot_cold.dense_rows(x.shape[0]))
        line += f", hot/cold {rel_err(out, ref):.1e}"
    return line


def main() -> None:
    ap = probe_parser(__doc__)
    add_model_args(ap)
    ap.add_argument("--points", type=float, nargs="*", default=[14.0, 28.0, 56.0],
                    help="l0 of the synthetic problems (131,072 tokens; --tiny: 256)")
    ap.add_argument("--plain", action="store_true",
                    help="the transformers RMSNorm and rotary modules (not twell.nn's fused ones)")
    ap.add_argument("--no-errors", action="store_true", help="skip the ops' error checks")
    a = ap.parse_args()
    dev = probe_device(a.device)
    preset, batch, seq, m_syn, d, f = a.preset, a.batch, a.seq, 131072, 2048, 5632
    if a.tiny:
        preset, batch, seq, m_syn, d, f = "tiny", 2, 128, 256, 64, 700
    bench = prepare_forward(preset, batch, seq, dev, fused=not a.plain)
    dtype = bench.dtype
    mlps = bench.sets.use("sparse:default")
    inputs: dict[int, torch.Tensor] = {}
    handles = [m.register_forward_pre_hook(lambda _m, args, i=i: inputs.__setitem__(i, args[0].detach()))
               for i, m in enumerate(mlps)]
    with torch.inference_mode():
        for _ in range(2):  # the second forward runs with the hot sets chosen
            bench.model.model(input_ids=bench.tokens, use_cache=False)
    for h in handles:
        h.remove()
    kind = "plain" if a.plain else "fused"
    print(f"{preset}, {batch} x {seq} tokens, {dtype}, {kind} norms and rotary; per layer: unions of {BLOCK} "
          f"consecutive tokens' active units against {BLOCK} independent tokens'; cold: outside the layer's current "
          f"hot set", flush=True)
    with torch.inference_mode():
        for i, mlp in enumerate(mlps):
            x = inputs.pop(i)
            x = x.reshape(-1, x.shape[-1])
            active = active_of(x, mlp.gate_proj.weight)
            hot = mlp._hot_cold._hot
            cold = None
            if hot is not None:
                mask = torch.ones(active.shape[1], dtype=torch.bool, device=active.device)
                mask[hot.to(active.device)] = False
                cold = mask.nonzero().flatten()
            errs = f" | {op_errors(mlp, x)}" if dev.type == "cuda" and i in ERROR_LAYERS and not a.no_errors else ""
            print(f"layer {i:2d}: {union_stats(active, cold)}{errs}", flush=True)
            del x, active
        for l0 in a.points:
            p = split_problem(m_syn, d, f, l0 * f / 5632, dev)
            print(f"synthetic M={m_syn} l0 target {l0:g}: {union_stats(active_of(p.x, p.w_gate), None)}", flush=True)
            del p
            if dev.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
