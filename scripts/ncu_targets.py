"""One launch of each kernel worth profiling, at M=131072, d=2048, F=5632, l0~28 (run under ncu).

    ncu --clock-control none -k regex:'_pack_twell|_twell_ffn_row|_union_up|_union_down' -c 4 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        python3 scripts/ncu_targets.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twell.ops.block_union_kernel import launch_block_union_ffn
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

dev = torch.device("cuda")
m, d, f = 131072, 2048, 5632
p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=28.0), generator=torch.Generator(device=dev).manual_seed(0),
                          device=dev)
x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
wdt = wd.t().contiguous()
g = F.linear(x, wg)
v, i, c = launch_pack_twell(g, 128, 16)
out = torch.empty(m, d, dtype=x.dtype, device=dev)
launch_twell_ffn(x, v, i, c, None, None, wg, wu, wdt, n_cols=f, tile=128, round_hidden=True, out=out)
launch_block_union_ffn(x, g, wu, wdt, round_hidden=True)
torch.cuda.synchronize()
print("done")
