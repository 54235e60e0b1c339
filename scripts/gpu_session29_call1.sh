#!/usr/bin/env bash
# Session 29, GPU call 1: the three next steps of session 28 (docs/performance.md).
# (c) 16,384 tokens at 1 / 2 / 5 %: the dispatched module read 1.34x where the op alone read 1.43x at 2 % (session
#     28, call 1); the module passes a dense-row budget (HotColdCache.dense_rows), the op column none.  The bench as
#     shipped, then with hot_cold_cache.DENSE_OVERFLOW_ROWS off in the process.  Predicted: off gives the module the
#     op's ~1.43x at 2 % (~0.075 ms less), and moves 1 % / 5 % by less than the spread.
# (a) the bound of the middle tier (8192 <= M < 131072, hot_cold_plan.HOT_MAX_COLD_L0): tune-dispatch at 8192, 16384
#     and 32768 tokens with it at 3, 6 and 10 (shipped).  Session 28 had 8192 with bound 3 at 1.35x / 1.30x against
#     1.18x / 1.15x at 2 / 3 %, bound 10 ahead at 0.25-1.5 %; session 20's probe had ~10 best at 16384 / l0=112.
# (b) 1024 tokens with the shipped bound 3: a second run after session 28's 1.04-1.34x.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session29 1
stage ffn16k_rows_on "$(left 560)" "speedup=" python3 -m twell.cli bench ffn --shape 2048x5632 \
  --ms 16384 --densities 1 2 5 --extra --out "$R" --stem ffn_16384_rows_on_session29
stage ffn16k_rows_off "$(left 560)" "speedup=" python3 scripts/twell_patched.py \
  --set twell.nn.hot_cold_cache.DENSE_OVERFLOW_ROWS=False -- bench ffn --shape 2048x5632 --ms 16384 --densities 1 2 5 \
  --extra --out "$R" --stem ffn_16384_rows_off_session29
for B in 3 6 10; do
  stage tune_mid_bound$B "$(left 560)" "x  err|sparse when" python3 scripts/twell_patched.py \
    --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0=$B.0 -- tune-dispatch --shape 2048x5632 --ms 8192 16384 32768 \
    --out "$R" --stem dispatch_2048x5632_session29_mid_bound$B
done
stage tune_1024 "$(left 585)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 2048x5632 --ms 1024 \
  --out "$R" --stem dispatch_2048x5632_session29_1024
call_end
