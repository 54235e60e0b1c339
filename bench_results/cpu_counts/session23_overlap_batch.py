"""Session 23, CPU (fp32): how the token overlap of ``twell bench model``'s calibrated random model depends on the
batch it is calibrated on, and whether GPT-2's residual scaling (o_proj and down_proj times 1/sqrt(2 L)) changes it.

Usage: ``PYTHONPATH=src python bench_results/cpu_counts/session23_overlap_batch.py PRESET BATCH SEQ SCALE`` with
SCALE ``none``, ``gpt2`` or a number; prints per layer l0, the first 8 positions' l0, the mean union of 64
consecutive tokens' active units and the union expected of 64 independent tokens.  The log next to it holds the
runs quoted in docs/performance.md.
"""

import math
import sys

import torch

sys.path.insert(0, "scripts")  # forward_unions' helpers
from forward_unions import active_of, block_unions  # noqa: E402

from twell.bench import model_setup as ms  # noqa: E402
from twell.bench.model_sparsity import SparsityTarget, calibrate, install_bias_channel  # noqa: E402

preset, batch, seq, scale = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(2)
torch.set_grad_enabled(False)
spec = ms.PRESETS[preset]
model = ms.build_model(spec, device=torch.device("cpu"), dtype=torch.float32, seed=0, max_positions=seq)
n_layers = spec.n_layers
factor = {"none": 1.0, "gpt2": 1 / math.sqrt(2 * n_layers)}.get(scale) or float(scale)
for layer in model.model.layers:
    layer.self_attn.o_proj.weight.mul_(factor)
    layer.mlp.down_proj.weight.mul_(factor)
sets = ms.MlpSets(model, ("default",))
tokens = ms.make_tokens(batch, seq, spec.vocab_size, seed=1, device=torch.device("cpu"))
install_bias_channel(model, float(model.config.initializer_range))
probs = SparsityTarget(mean_l0=29.0).unit_probabilities(n_layers, spec.intermediate_size, seed=2)
calibrate(model, sets.use("dense"), tokens, probs)
mlps = sets.use("dense")
inputs = {}
for i, m in enumerate(mlps):
    m.register_forward_pre_hook(lambda _m, a, i=i: inputs.__setitem__(i, a[0].detach()))
model.model(input_ids=tokens, use_cache=False)
for i, m in enumerate(mlps):
    x = inputs[i].reshape(-1, inputs[i].shape[-1])
    a = active_of(x, m.gate_proj.weight)
    fr = a.float().mean(0)
    l0 = a.sum(1).float().mean()
    u = block_unions(a).mean()
    iid = (1 - (1 - fr) ** 64).sum()
    pos = a.view(batch, seq, -1).sum(2).float()  # the position profile: l0 of the first 8 positions
    print(f"scale {scale} layer {i}: l0 {l0:.1f} (first 8 positions {pos[:, :8].mean():.0f}) union64 {u:.1f} "
          f"({u / l0:.2f} l0) independent {iid:.1f} ({iid / l0:.1f} l0)", flush=True)
