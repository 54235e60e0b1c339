#!/usr/bin/env bash
# Session 28, GPU call 2: the cold-pairs bound of the hot set on small calls.  Call 1's tune-dispatch at 2048-8192
# tokens had the module win at 5-10 % (1.18-1.29x) but tie or lose at 1-3 % (2048: 0.94-1.03x, 4096 at 3 %: 1.00x),
# where the shipped bound (HOT_MAX_COLD_L0 = 10) leaves ~10 cold pairs per token; session 20 had 4096 tokens at
# l0=112 fastest at 0.8 cold pairs (0.365 ms against 0.383 at 9.7).  The same tuning with the bound at 1 and 3 on
# every call of these sizes, then the shipped 10 again (the drift between runs); then the whole GPU suite in what is
# left of the call (336 s in session 27).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session28 2
for B in 1 3 10; do
  stage tune_bound$B "$(left 420)" "x  err|sparse when" python3 scripts/twell_patched.py \
    --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0=$B.0 -- tune-dispatch --shape 2048x5632 --ms 2048 4096 8192 \
    --out "$R" --stem dispatch_2048x5632_session28_bound$B
done
stage pytest_gpu_all "$(left 590)" "FAILED|passed|failed" python3 -m pytest -q -m gpu -p no:cacheprovider tests
call_end
