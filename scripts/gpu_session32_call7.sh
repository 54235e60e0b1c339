#!/usr/bin/env bash
# Session 32, GPU call 7: call 6's kernels at 1024x3072, 16,384 tokens / 1 % summed to 0.388 ms per call as shipped
# (gate 0.185, gather 0.155, hot down 0.028, list 0.018), while tune-dispatch timed the op at 0.462 ms: ~0.07 ms of the
# GPU idle, against none with bound 3 (0.366 ms of kernels, 0.356 timed).  Candidates: the list pass beside the gate
# (hot_cold.LIST_BESIDE_GATE) and the overflow rows' dense GEMMs (hot_cold_cache.DENSE_OVERFLOW_ROWS).  Predicted: one
# of the two switched off brings 16,384 tokens / 1 % from ~1.15x to ~1.35x.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session32 7
ARGS="tune-dispatch --shape 1024x3072 --ms 8192 16384 --densities 1 2 --out $R"
stage tune_1024x3072_gap_shipped "$(left 150)" "x  err" python3 -m twell.cli $ARGS --stem dispatch_1024x3072_session32_gap_shipped
stage tune_1024x3072_gap_nobeside "$(left 150)" "x  err" python3 scripts/twell_patched.py \
  --set twell.ops.hot_cold.LIST_BESIDE_GATE=False -- $ARGS --stem dispatch_1024x3072_session32_gap_nobeside
stage tune_1024x3072_gap_norows "$(left 150)" "x  err" python3 scripts/twell_patched.py \
  --set twell.nn.hot_cold_cache.DENSE_OVERFLOW_ROWS=False -- $ARGS --stem dispatch_1024x3072_session32_gap_norows
call_end
