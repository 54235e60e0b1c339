#!/usr/bin/env bash
# Session 32, GPU call 4: the middle tier's hot set at small layers.  Call 3's bench at 1024x3072: 8192 tokens / 1 %
# took 0.345 ms with 320 hot units (the middle tier's bound 10; 0.80x of dense), 4096 tokens 0.112 ms with 1152 (the
# small tier's bound 3; 1.35x).  At hidden 1024 a hot unit's GEMM columns cost a quarter of what they do at 4096, so
# more of them should pay.  Predicted: bound 3 through the middle tier (HOT_MAX_COLD_L0 = HOT_MAX_COLD_L0_DENSE = 3)
# wins at 1024x3072 at 8192-32,768 tokens and 0.5-2 % by >= 1.2x where the shipped bounds lose; at 2048x5632 (session
# 29: 10 ahead at 0.5-1 % from 16,384 tokens by 0.07-0.09x) it loses there, which says the bound depends on the shape.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session32 4
for SH in 1024x3072 2048x5632; do
  stage tune_${SH}_mid_shipped "$(left 500)" "x  err|DEFAULT_POLICY" python3 -m twell.cli tune-dispatch --shape $SH \
    --ms 8192 16384 32768 --densities 0.5 1 2 5 --out "$R" --stem dispatch_${SH}_session32_mid_shipped
  stage tune_${SH}_mid_bound3 "$(left 500)" "x  err|DEFAULT_POLICY" python3 scripts/twell_patched.py \
    --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0=3.0 --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0_DENSE=3.0 -- \
    tune-dispatch --shape $SH --ms 8192 16384 32768 --densities 0.5 1 2 5 --out "$R" \
    --stem dispatch_${SH}_session32_mid_bound3
done
call_end
