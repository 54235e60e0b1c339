#!/usr/bin/env bash
# Session 29, GPU call 2, at the commit that ships call 1's findings (the middle tier's bound 6 from l0 70, the
# dense-row pass from 16 expected rows, 1024 tokens sparse to 1.5 %).
# (1) The same question for the largest calls: tune-dispatch at 65,536 and 131,072 tokens with every tier's bound
#     at 6, 10 and 13 in turn (131,072 ships 13; 65,536 now 10 / 6 by l0).  Session 23 had 13 ahead of 10 at
#     131,072 / l0=56 (8.489 against 8.569 ms); call 1 had 6 ahead of 10 from l0 84 at 8192-32,768 tokens.
# (2) The shipped rule at 1024-32,768 tokens: predicted 16,384 / 2 % at ~1.43x (call 1: bound 6 1.43x, the module
#     with its dense rows 1.34x), 8192 / 3 % ~1.32x (was 1.16x), 1024 as in call 1.
# (3) The whole GPU suite in what is left.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session29 2
for B in 6 10 13; do
  stage tune_large_bound$B "$(left 300)" "x  err|sparse when" python3 scripts/twell_patched.py \
    --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0=$B.0 --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0_DENSE=$B.0 \
    --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0_LARGE=$B.0 -- tune-dispatch --shape 2048x5632 --ms 65536 131072 \
    --densities 0.5 1 2 3 5 --out "$R" --stem dispatch_2048x5632_session29_large_bound$B
done
stage tune_shipped "$(left 400)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 2048x5632 \
  --ms 1024 8192 16384 32768 --out "$R" --stem dispatch_2048x5632_session29_shipped
stage ffn16k_2pct "$(left 430)" "speedup=" python3 -m twell.cli bench ffn --shape 2048x5632 --ms 16384 \
  --densities 2 --extra --out "$R" --stem ffn_16384_2pct_session29
stage pytest_gpu_all "$(left 590)" "FAILED|passed|failed" python3 -m pytest -q -m gpu -p no:cacheprovider tests
call_end
