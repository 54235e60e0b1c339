"""Where a CUDA-graphed decode step of the 1.5B bench model spends its GPU time, dense vs sparse FFN.

``twell bench model --decode-loop graphed`` (session 5, H200) decoded one sequence at ~253 tokens/s dense
and ~265 sparse (~4 ms per token) although the step reads ~3 GB of weights (~0.7 ms at the H200's
bandwidth): this prints, per variant, the wall time per replayed step, the kernels' GPU time per step
and the largest kernels (``torch.profiler`` over replays of the recorded step).

Usage (GPU machine): ``PYTHONPATH=src python3 scripts/decode_step_profile.py [--batch B] [--policy P]``
"""

from __future__ import annotations

import argparse
import time

import torch

from twell.bench.model_measure import kernel_lines, profile_kernels
from twell.bench.model_setup import prepare
from twell.bench.model_sparsity import SparsityTarget
from twell.bench.timing import back_to_back_ms
from twell.generation import GreedyDecoder
from twell.ops import decode, decode_kernels, decode_onepass_kernel
from twell.ops.decode_onepass_kernel import ONEPASS_MAX_TOKENS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="1.5b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--policy", default="decode-1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--fused-norms", action="store_true", help="RMSNorms through F.rms_norm (both variants)")
    ap.add_argument("--compile", action="store_true", help="the step under torch.compile (inductor) before recording")
    ap.add_argument("--no-profile", action="store_true", help="replay timing only (no torch.profiler table)")
    ap.add_argument("--variants", default="dense,sparse,sparse-gate-gemm",
                    help="comma-separated subset of dense, sparse, sparse-gate-gemm, sparse-onepass")
    a = ap.parse_args()
    dev = torch.device("cuda")
    bench = prepare(a.preset, device=dev, dtype=torch.bfloat16, batch=16, seq=2048, target=SparsityTarget(mean_l0=29.0),
                    policies=(a.policy,), fused_norms=a.fused_norms)
    prompt = bench.tokens[: a.batch, :128].contiguous()
    # (weight set, gate through cuBLAS (None: by size), decode kernels for one token: "two" hidden + down,
    # "onepass" (twell.ops.decode_onepass_kernel))
    variants = {"dense": ("dense", False, "two"), "sparse": (f"sparse:{a.policy}", None, "two"),
                "sparse-gate-gemm": (f"sparse:{a.policy}", True, "two"),
                "sparse-onepass": (f"sparse:{a.policy}", None, "onepass")}
    # what the one-pass launcher is given while a step is recorded: (tokens, d, Wd^T strides, row width of
    # the unit-by-unit up/down or 0 for the tile path)
    seen: set[tuple] = set()
    launch = decode_onepass_kernel.launch_onepass_partials

    def spy(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, **kw: bool) -> tuple:
        seen.add((x.shape[0], x.shape[1], w_down_t.stride(),
                  decode_onepass_kernel.fire_units_width(x.shape[0], x.shape[1], unit_major=w_down_t.stride(1) == 1)))
        return launch(x, w_gate, w_up, w_down_t, **kw)

    decode_onepass_kernel.launch_onepass_partials = spy
    for key in a.variants.split(","):
        seen.clear()
        name, gate_by_gemm, kernels = variants[key]
        decode_kernels.GATE_BY_GEMM = gate_by_gemm  # the decode FFN's gate through cuBLAS or not, any size
        decode.ONEPASS_TOKENS = ONEPASS_MAX_TOKENS if kernels == "onepass" else 0
        bench.sets.use(name)
        dec = GreedyDecoder(bench.model, pad_token_id=0, max_graphs=1, compile=a.compile)
        t_build = time.perf_counter()
        with torch.no_grad():
            dec(prompt, 160)  # records the step with a cache of 128 + 160 positions
        t_build = time.perf_counter() - t_build
        (rec,) = dec._recorded.values()
        with torch.no_grad():
            dec._prefill(rec, prompt, None, dev)  # back to position 128: 100 replays stay inside the cache
        replay_ms = back_to_back_ms(rec.run, device=dev, calls=100, rounds=1)
        label = (f"{name}{' (gate by cuBLAS)' if gate_by_gemm else ''}"
                 f"{'' if kernels == 'two' else f' ({kernels} decode kernel)'}"
                 f"{' compiled' if a.compile else ''}")
        print(f"{label} batch {a.batch}: {replay_ms:.3f} ms per replayed step (100 back to back); first "
              f"generation (record{' + compile' if a.compile else ''}) {t_build:.1f} s; one-pass launches "
              f"(tokens, d, Wd^T strides, row width) {sorted(seen)}", flush=True)
        if not a.no_profile:
            with torch.no_grad():
                dec._prefill(rec, prompt, None, dev)
            prof = profile_kernels(rec.run, dev, top=25, calls=min(a.steps, 150))
            print(f"  profiled: wall {prof['wall_ms']:.3f} ms, kernels {prof['kernel_ms']:.3f} ms per step, "
                  f"kernels per step {sum(r['calls'] for r in prof['kernels'])}+ (top 25 shown)", flush=True)
            print(kernel_lines(prof), flush=True)
        dec.clear()


if __name__ == "__main__":
    main()
