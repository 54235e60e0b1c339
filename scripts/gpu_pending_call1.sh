#!/usr/bin/env bash
# Session 36, call 1; run it as
#   TWELL_SESSION=session36 TWELL_COMMIT=<sha> bash scripts/gpu_pending_call1.sh
# 1. Where the batch decode up kernel's ~10 us go (scripts/batch_up_probe.py): with nothing firing, with the synthetic
#    problem's units, with every unit, an empty kernel on the same grid, four K-loop configurations, and the down kernel
#    with nothing firing.  Predicted: if "none" is within ~2 us of "real", the up projection is not what costs, and the
#    launch plus the g pass are.  Session 35's ncu had L1/TEX 77 % busy at 4 % of DRAM's bandwidth, ~8,300 shared
#    wavefronts per firing program against ~260 for its operands read once: the four warps each load the same [16, 16]
#    dot's operands.  Predicted for one warp (512, 3, 1): 10 -> ~4-5 us at d=2048, eight tokens.
# 2. The untimed small calls at 1536x8960 (the 1.5B benchmark model's FFN):
#    `twell tune-dispatch --ms 1 2 4 8 16`, two runs.  Since session 35 the calls between one and 16 tokens take
#    16 tokens' limit there; 2048x5632's 2-8 tokens won to 1.3-6.0 % (session35_runs.md).  Predicted: 2-8 tokens near
#    one token's 1.05-1.50x at <= 1 %.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session36}" 1
stage batch_up_probe "$(left 200)" "d=|FAILED|Error" python3 scripts/batch_up_probe.py
for shape in 1536x8960; do
  for seed in 0 1; do
    stage "tune_${shape}_below16_s$seed" "$(left 560)" "<= M|DEFAULT_POLICY|WRONG|ERROR|Error" \
      python3 -m twell.cli tune-dispatch --shape "$shape" --ms 1 2 4 8 16 --seed "$seed" --out "$R" \
      --stem "dispatch_${shape}_${S}_below16_s$seed"
  done
done
call_end
