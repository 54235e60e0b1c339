#!/usr/bin/env bash
# Session 32, GPU call 3.
# (a) Two runs (seeds 0 and 1) of 3584x18944 (Qwen2-7B's FFN), intermediate size beyond the measured range (to 14336).
#     Predicted like 5120x13824 and 4096x14336: sparse from one token, dense only near 256-1023 tokens above 0.5 %.
# (b) 1024x3072 lost at 8192 tokens above 0.5 % in both of calls 1-2's runs while winning at 4096 and from 16,384
#     tokens: 8192 is where the hot set's middle tier starts (hot_cold_plan).  The bench's --extra columns (hot units,
#     the parts' times) at 4096 / 8192 / 16384 tokens and 1-5 % show which part grows at 8192.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session32 3
MS="1 16 64 256 512 1024 2048 4096 8192 16384 32768 131072"
DENS="0.25 0.5 1 2 5 10"
for RUN in a:0 b:1; do
  stage tune_3584x18944_${RUN%:*} "$(left 400)" "sparse when|never won|: dense|DEFAULT_POLICY|WRONG" python3 -m twell.cli \
    tune-dispatch --shape 3584x18944 --ms $MS --densities $DENS --seed ${RUN#*:} --out "$R" \
    --stem dispatch_3584x18944_session32_${RUN%:*}
done
stage ffn_1024x3072_tier "$(left 520)" "speedup=|^\| " python3 -m twell.cli bench ffn --shape 1024x3072 \
  --ms 4096 8192 16384 --densities 1 2 5 --extra --out "$R" --stem ffn_1024x3072_tier_session32
call_end
