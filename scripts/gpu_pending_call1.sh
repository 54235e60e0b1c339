#!/usr/bin/env bash
# Prepared in session 36, when no machine was lent (nor in session 37); run it as
#   TWELL_SESSION=session38 TWELL_COMMIT=<sha> bash scripts/gpu_pending_call1.sh
# 1. Where the batch decode up kernel's ~10 us go (scripts/batch_up_probe.py): with nothing firing, with the synthetic
#    problem's units, with every unit, an empty kernel on the same grid, seven K-loop configurations, and the down kernel
#    with nothing and with the real units firing.  Predicted: if "none" is within ~2 us of "real", the up projection
#    is not what costs, and the launch plus the g pass are.  Session 35's ncu (ncu_batch_up_call3_session35.log) had L1/TEX 77 % busy at 4 % of
#    DRAM's bandwidth and ~1.38 M shared wavefronts, ~5,200 per firing program if ~265 of the 352 blocks fire (the
#    synthetic union of ~470 units at eight tokens), against ~1,000 for its operands read once.  Offline
#    (`batch_up_probe.py --ptx`, bench_results/sm90_offline/batch_up_ptx_session36.log): the four warps of a
#    [16, 16] dot execute 192 ldmatrix per K step where the operands need 64 (one warp), and 128 mma.sync where 64
#    do.  Predicted: one warp (512, 3, 1) or two (512, 3, 2) 10 -> ~5-7 us at d=2048, eight tokens; 1 warp may
#    be issue-bound (192 cp.async per thread per K step).
# 2. The untimed small calls at 1536x8960 (the 1.5B benchmark model's FFN):
#    `twell tune-dispatch --ms 1 2 4 8 16`, two runs.  Since session 35 the calls between one and 16 tokens take
#    16 tokens' limit there; 2048x5632's 2-8 tokens won to 1.3-6.0 % (session35_runs.md).  Predicted: 2-8 tokens near
#    one token's 1.05-1.50x at <= 1 %.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session38}" 1
stage batch_up_probe "$(left 200)" "d=|FAILED|Error" python3 scripts/batch_up_probe.py
for shape in 1536x8960; do
  for seed in 0 1; do
    stage "tune_${shape}_below16_s$seed" "$(left 560)" "<= M|DEFAULT_POLICY|WRONG|ERROR|Error" \
      python3 -m twell.cli tune-dispatch --shape "$shape" --ms 1 2 4 8 16 --seed "$seed" --out "$R" \
      --stem "dispatch_${shape}_${S}_below16_s$seed"
  done
done
call_end
