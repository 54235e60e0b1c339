#!/usr/bin/env bash
# Session 28, GPU call 3: the shipped cold-pairs bound of 3 below 8192 tokens (hot_cold_plan.HOT_MAX_COLD_L0_SMALL),
# timed as call 2 timed it, at 1024-8192 tokens (1024 tokens: dense in the table since session 22, not yet with
# this bound).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session28 3
stage tune_small_bound "$(left 200)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 2048x5632 \
  --ms 1024 2048 4096 8192 --out "$R" --stem dispatch_2048x5632_session28_small_bound
call_end
