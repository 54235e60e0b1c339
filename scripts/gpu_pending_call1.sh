#!/usr/bin/env bash
# Prepared in session 36, when no machine was lent (nor in session 37); run it as
#   TWELL_SESSION=session38 TWELL_COMMIT=<sha> bash scripts/gpu_pending_call1.sh
# (Its first stage, the batch up kernel's probe, ran in session 38's call 1: bench_results/h200/session38_runs.md.)
# The untimed small calls at 1536x8960 (the 1.5B benchmark model's FFN):
#    `twell tune-dispatch --ms 1 2 4 8 16`, two runs.  Since session 35 the calls between one and 16 tokens take
#    16 tokens' limit there; 2048x5632's 2-8 tokens won to 1.3-6.0 % (session35_runs.md).  Predicted: 2-8 tokens near
#    one token's 1.05-1.50x at <= 1 %.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session38}" 1
for shape in 1536x8960; do
  for seed in 0 1; do
    stage "tune_${shape}_below16_s$seed" "$(left 560)" "<= M|DEFAULT_POLICY|WRONG|ERROR|Error" \
      python3 -m twell.cli tune-dispatch --shape "$shape" --ms 1 2 4 8 16 --seed "$seed" --out "$R" \
      --stem "dispatch_${shape}_${S}_below16_s$seed"
  done
done
call_end
