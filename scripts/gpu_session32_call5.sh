#!/usr/bin/env bash
# Session 32, GPU call 5: which layers want bound 3 in the hot set's middle tier.  Call 4: at 1024x3072 bound 3 through
# 8192-131,071 tokens won where the shipped bounds (10; 6 from 1.25 %) lost (8192 tokens / 1 %: 1.43x against 0.81x;
# 16,384 / 2 %: 1.33x against 1.02x), level at 5 %; at 2048x5632 it lost (16,384 / 0.5 %: 1.71x against 2.00x; 1 %:
# 1.49x against 1.68x).  The same pair at 896x4864 (hidden 896, F 4864) and 1536x8960 tells whether the hidden size
# decides (then 896 prefers 3 and 1536 lies between) or the intermediate size (then 896x4864, F near 2048x5632's,
# keeps the shipped bounds).  Predicted: hidden decides; 896x4864 gains >= 0.1x at 1-2 % with bound 3.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session32 5
for SH in 896x4864 1536x8960; do
  stage tune_${SH}_mid_shipped "$(left 500)" "x  err|DEFAULT_POLICY" python3 -m twell.cli tune-dispatch --shape $SH \
    --ms 8192 16384 32768 --densities 0.5 1 2 5 --out "$R" --stem dispatch_${SH}_session32_mid_shipped
  stage tune_${SH}_mid_bound3 "$(left 500)" "x  err|DEFAULT_POLICY" python3 scripts/twell_patched.py \
    --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0=3.0 --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0_DENSE=3.0 -- \
    tune-dispatch --shape $SH --ms 8192 16384 32768 --densities 0.5 1 2 5 --out "$R" \
    --stem dispatch_${SH}_session32_mid_bound3
done
call_end
